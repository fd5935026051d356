"""Stage 3, decode: one batched call per batch and inner algorithm.

:func:`decode_batch_gpu` is the only place that calls nvCOMP; the engine's codec stages
(:mod:`gpu_zarr.engine.codecs`) and the zarr codec (:mod:`gpu_zarr.nvcomp_zstd`) all go
through it, so a fix or a speed-up lands once. :func:`decode_batch_cpu` is its twin
(numcodecs / zlib, one call per stream) that CI runs.

Algorithms: ``"zstd"`` (standard frames, nvCOMP's RAW bitstream), ``"lz4"`` (raw LZ4
blocks, as Blosc stores them) and ``"deflate"`` (raw deflate, wrappers already stripped).
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpu_zarr.errors import INSTALL_HINT, CorruptChunkError, GPUUnavailable

__all__ = ["ALGORITHMS", "copy_spans_cpu", "copy_spans_gpu", "decode_batch_cpu", "decode_batch_gpu",
           "decode_zstd_cpu", "decode_zstd_gpu", "nvcomp_codec"]

ALGORITHMS = ("zstd", "lz4", "deflate")
_NVCOMP_NAMES = {"zstd": "Zstd", "lz4": "LZ4", "deflate": "Deflate"}


def _check_algo(algo: str) -> None:
    if algo not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algo!r}")


def _name(names: Sequence[str] | None, k: int) -> str:
    return str(names[k]) if names is not None and len(names) > k else f"#{k}"


def _nvcomp() -> Any:
    try:
        from nvidia import nvcomp
    except ImportError as exc:
        raise GPUUnavailable(f"nvCOMP is not installed, so chunks cannot be decoded on the GPU: {INSTALL_HINT}") from exc
    return nvcomp


def nvcomp_codec(stream: Any, algo: str = "zstd") -> Any:
    """A RAW-bitstream nvCOMP codec of ``algo`` bound to ``stream`` (cached per thread and stream).

    Notes
    -----
    nvCOMP keeps its decode scratch with the codec and reuses it, and a codec's first
    decode is slow (~10 ms), so codecs are kept by the runtime (one per thread and stream:
    a second decode on a busy codec blocks the host).
    """
    nvcomp = _nvcomp()
    from gpu_zarr.engine.runtime import get_runtime

    key = ("nvcomp-codec", algo, getattr(stream, "device_id", 0), int(stream.ptr), threading.get_ident())
    codec = get_runtime().resource(key, lambda: nvcomp.Codec(
        algorithm=_NVCOMP_NAMES[algo], bitstream_kind=nvcomp.BitstreamKind.RAW, cuda_stream=int(stream.ptr)))
    return codec


def decode_batch_gpu(algo: str, src: Any, src_offsets: np.ndarray, src_sizes: np.ndarray, dst: Any,
                     dst_offsets: np.ndarray, dst_sizes: np.ndarray, stream: Any,
                     names: Sequence[str] | None = None) -> None:
    """Decode many streams from one device buffer into another, in ONE nvCOMP call.

    Parameters
    ----------
    algo : {"zstd", "lz4", "deflate"}
    src, dst : cupy.ndarray of uint8
        Stream k is ``src[src_offsets[k] : + src_sizes[k]]`` and decodes to
        ``dst[dst_offsets[k] : + dst_sizes[k]]``.
    src_offsets, src_sizes, dst_offsets, dst_sizes : ndarray of int64 (host)
        ``dst_sizes`` are the exact decoded sizes.
    stream : cupy.cuda.Stream
    names : sequence of str, optional
        Per stream, the chunk it belongs to (for error messages).

    Raises
    ------
    CorruptChunkError
        When nvCOMP reports a failure.
    """
    _check_algo(algo)
    n = len(src_offsets)
    if n == 0:
        return
    nvcomp = _nvcomp()
    codec = nvcomp_codec(stream, algo)
    s = int(stream.ptr)
    srcs = nvcomp.as_arrays(src, np.asarray(src_offsets).tolist(), np.asarray(src_sizes).tolist(), cuda_stream=s)
    outs = nvcomp.as_arrays(dst, np.asarray(dst_offsets).tolist(), np.asarray(dst_sizes).tolist(), cuda_stream=s)
    try:
        codec.decode(srcs, out=outs)
    except Exception as exc:
        which = f" (chunks {_name(names, 0)} .. {_name(names, n - 1)})" if names is not None else ""
        raise CorruptChunkError(
            f"nvCOMP could not decode a batch of {n} {algo} streams{which}: {exc}. The data are corrupt."
        ) from exc


def _decode_one(algo: str, data: np.ndarray, out: np.ndarray) -> int:
    """Decode one stream into ``out``; returns the decoded size."""
    if algo == "zstd":
        from numcodecs import Zstd

        got = Zstd().decode(data, out=out)
        return int(np.asarray(got).nbytes)
    if algo == "lz4":
        from numcodecs import LZ4

        # numcodecs' LZ4 reads a 4-byte little-endian size prefix before the raw block
        framed = np.concatenate([np.frombuffer(np.int32(out.nbytes).tobytes(), np.uint8), data])
        got = np.frombuffer(LZ4().decode(framed), np.uint8)
        out[:got.nbytes] = got
        return int(got.nbytes)
    d = zlib.decompressobj(-15)
    got = np.frombuffer(d.decompress(data.tobytes(), out.nbytes), np.uint8)
    out[:got.nbytes] = got
    return int(got.nbytes)


def decode_batch_cpu(algo: str, src: np.ndarray, src_offsets: np.ndarray, src_sizes: np.ndarray, dst: np.ndarray,
                     dst_offsets: np.ndarray, dst_sizes: np.ndarray, names: Sequence[str] | None = None) -> None:
    """numcodecs / zlib twin of :func:`decode_batch_gpu` (one call per stream, on the CPU)."""
    _check_algo(algo)
    for k, (so, ss, do, ds) in enumerate(zip(np.asarray(src_offsets).tolist(), np.asarray(src_sizes).tolist(),
                                             np.asarray(dst_offsets).tolist(), np.asarray(dst_sizes).tolist())):
        out = dst[do:do + ds]
        try:
            got = _decode_one(algo, src[so:so + ss], out)
        except Exception as exc:
            raise CorruptChunkError(f"chunk {_name(names, k)}: {algo} decode failed ({type(exc).__name__}: {exc}); "
                                    "the chunk is corrupt. Rewrite or delete that chunk.") from exc
        if got != ds:
            raise CorruptChunkError(f"chunk {_name(names, k)}: a {algo} stream decoded to {got} bytes, expected {ds}; "
                                    "the chunk is corrupt or was written with other metadata.")


def copy_spans_cpu(src: np.ndarray, src_offsets: np.ndarray, dst: np.ndarray, dst_offsets: np.ndarray,
                   sizes: np.ndarray) -> None:
    """Copy byte spans ``src[so : so + n] -> dst[do : do + n]`` (CPU twin of :func:`copy_spans_gpu`)."""
    for so, do, n in zip(np.asarray(src_offsets).tolist(), np.asarray(dst_offsets).tolist(),
                         np.asarray(sizes).tolist()):
        dst[do:do + n] = src[so:so + n]


_COPY_KERNEL = r"""
extern "C" __global__ void copy_spans(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
                                      const long long* __restrict__ so, const long long* __restrict__ dof,
                                      const long long* __restrict__ n)
{
    const long long k = blockIdx.y;
    const long long len = n[k];
    const unsigned char* s = src + so[k];
    unsigned char* d = dst + dof[k];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (long long)gridDim.x * blockDim.x)
        d[i] = s[i];
}
"""


def copy_spans_gpu(src: Any, src_offsets: np.ndarray, dst: Any, dst_offsets: np.ndarray, sizes: np.ndarray,
                   stream: Any) -> None:
    """Copy many byte spans between device buffers with one kernel launch per 65535 spans."""
    import cupy

    n = len(sizes)
    if n == 0:
        return
    from gpu_zarr.engine.runtime import get_runtime

    kern = get_runtime().resource(("kernel", "copy_spans"),
                                  lambda: cupy.RawKernel(_COPY_KERNEL, "copy_spans"))
    longest = int(np.max(sizes))
    gx = max(1, min(64, -(-longest // (256 * 4))))
    with stream:
        so = cupy.asarray(np.asarray(src_offsets, np.int64))
        do = cupy.asarray(np.asarray(dst_offsets, np.int64))
        nn = cupy.asarray(np.asarray(sizes, np.int64))
        for p0 in range(0, n, 65535):
            cnt = min(65535, n - p0)
            kern((gx, cnt), (256,), (src, dst, so[p0:], do[p0:], nn[p0:]))


def decode_zstd_gpu(src: Any, src_offsets: np.ndarray, src_sizes: np.ndarray, dst: Any, dst_offsets: np.ndarray,
                    dst_size: int, stream: Any, names: Sequence[str] | None = None) -> None:
    """zstd frames of equal decoded size ``dst_size`` (see :func:`decode_batch_gpu`)."""
    sizes = np.full(len(src_offsets), int(dst_size), np.int64)
    decode_batch_gpu("zstd", src, src_offsets, src_sizes, dst, dst_offsets, sizes, stream, names)


def decode_zstd_cpu(src: np.ndarray, src_offsets: np.ndarray, src_sizes: np.ndarray, dst: np.ndarray,
                    dst_offsets: np.ndarray, dst_size: int, names: Sequence[str] | None = None) -> None:
    """numcodecs twin of :func:`decode_zstd_gpu`."""
    sizes = np.full(len(src_offsets), int(dst_size), np.int64)
    decode_batch_cpu("zstd", src, src_offsets, src_sizes, dst, dst_offsets, sizes, names)
