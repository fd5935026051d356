"""Stage 3, decode: one batched nvCOMP call per batch, and its CPU twin.

:func:`decode_batch_gpu` is the only place that decodes with nvCOMP (through the low-level
binding :mod:`gpu_zarr.engine.nvcomp_batch`); the engine's codec stages and the zarr codec
(:mod:`gpu_zarr.nvcomp_zstd`) all use it, so a fix or a speed-up lands once.
:func:`decode_batch_cpu` is its twin on the host (numcodecs / zlib), with the same
arguments and the same errors. Both take streams: "zstd" (standard frames), "lz4" (raw
blocks) and "deflate" (raw RFC 1951 streams, wrappers already stripped).
"""

from __future__ import annotations

import functools
import threading
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpu_zarr.engine.nvcomp_batch import ALGORITHMS as _NVCOMP_NAMES
from gpu_zarr.errors import INSTALL_HINT, CorruptChunkError, GPUUnavailable

__all__ = [
    "ALGORITHMS",
    "copy_spans_cpu",
    "decode_batch_cpu",
    "decode_batch_gpu",
    "decode_zstd_cpu",
    "native_stream_codec",
    "nvcomp_codec",
]

#: the algorithms nvCOMP decodes for us (one table: :data:`gpu_zarr.engine.nvcomp_batch.ALGORITHMS`)
ALGORITHMS = tuple(_NVCOMP_NAMES)


def _name(names: Sequence[str] | None, k: int) -> str:
    return str(names[k]) if names is not None else f"#{k} of the batch"


def _as_sizes(v: Any, n: int) -> np.ndarray:
    a = np.asarray(v, np.int64)
    return np.full(n, int(a), np.int64) if a.ndim == 0 else a


def decode_batch_gpu(algo: str, src: Any, src_offsets: np.ndarray, src_sizes: np.ndarray, dst: Any,
                     dst_offsets: np.ndarray, dst_sizes: np.ndarray | int, stream: Any,
                     names: Sequence[str] | None = None, slot: int = 0, check: bool = True,
                     crc32: np.ndarray | None = None, adler32: np.ndarray | None = None, *,
                     runtime: Any, walked: bool = False) -> Any:
    """Decode a batch of streams from one device buffer into another, in ONE nvCOMP call.

    The arguments are those of :meth:`~gpu_zarr.engine.nvcomp_batch.BatchedDecoder.decode`, but
    ``dst_sizes`` may be one int (the same for all), ``slot`` picks the in-flight slot (each
    (device, algorithm, slot, stream) keeps its own nvCOMP scratch) and ``runtime`` keeps the
    decoder. Raises CorruptChunkError naming a chunk that fails, and GPUUnavailable when
    nvCOMP's C library is missing or too old (the message names the fix).

    Notes
    -----
    zstd input is checked by nvCOMP's per-chunk statuses and decoded sizes;
    :mod:`gpu_zarr.engine.codecs.zstd_frames` additionally walks the frame headers on the host
    where the caller has the bytes there (nvCOMP documents corrupt zstd input as undefined).
    """
    from gpu_zarr.engine.nvcomp_batch import batched_decoder

    if algo not in ALGORITHMS:
        raise ValueError(f"algo must be one of {ALGORITHMS}, not {algo!r}")
    n = len(src_offsets)
    if n == 0:
        return None
    dec = batched_decoder(algo, stream, slot, runtime=runtime)
    return dec.decode(src, np.asarray(src_offsets, np.int64), np.asarray(src_sizes, np.int64), dst,
                      np.asarray(dst_offsets, np.int64), _as_sizes(dst_sizes, n), stream, names, check=check,
                      crc32=crc32, adler32=adler32, walked=walked)


def _nvcomp() -> Any:
    try:
        from nvidia import nvcomp
    except ImportError as exc:
        raise GPUUnavailable(f"nvCOMP is not installed, so chunks cannot be encoded on the GPU: {INSTALL_HINT}") from exc
    if not hasattr(nvcomp, "BitstreamKind"):
        raise GPUUnavailable(f"nvCOMP's Python API {getattr(nvcomp, '__version__', '?')} is too old (no "
                             'BitstreamKind): pip install -U "nvidia-nvcomp-cu13>=6,<7"')
    return nvcomp


def nvcomp_codec(stream: Any, algo: str = "zstd", *, runtime: Any) -> Any:
    """A RAW-bitstream ``nvidia.nvcomp.Codec`` of ``algo`` bound to ``stream``, for ENCODING.

    Decoding goes through :func:`decode_batch_gpu` (nvCOMP's low-level API); only the zarr
    codec's encode path uses nvCOMP's Python API.

    Notes
    -----
    nvCOMP keeps its decode scratch with the codec and reuses it, and a codec's first
    decode is slow (~10 ms), so codecs are kept by the runtime (one per thread and stream:
    a second decode on a busy codec blocks the host): ``runtime`` keeps them.
    """
    nvcomp = _nvcomp()
    key = ("nvcomp-codec", algo, getattr(stream, "device_id", 0), int(stream.ptr), threading.get_ident())
    codec = runtime.resource(key, lambda: nvcomp.Codec(
        algorithm=_NVCOMP_NAMES[algo], bitstream_kind=nvcomp.BitstreamKind.RAW, cuda_stream=int(stream.ptr)))
    return codec


@functools.cache
def _cpu_decoder(algo: str):
    """A function (encoded bytes, expected size, destination) -> the destination when it
    decoded there, else the decoded bytes (the caller checks their size and copies them).
    One per algorithm: the codecs keep no state between calls."""
    if algo == "zstd":
        from numcodecs import Zstd

        from gpu_zarr.engine.codecs.zstd_frames import content_size

        codec = Zstd()

        def zstd(buf: np.ndarray, size: int, out: np.ndarray) -> Any:
            # straight into the destination when the header promises exactly its size (no
            # intermediate buffer: fresh memory costs page faults); else a new buffer
            if content_size(buf) == size:
                return codec.decode(buf, out=out)
            return codec.decode(buf)
        return zstd
    if algo == "lz4":
        from numcodecs import LZ4

        codec = LZ4()

        def lz4(buf: np.ndarray, size: int, out: np.ndarray) -> bytes:
            # numcodecs' LZ4 frames a raw block with its 4-byte little-endian decoded size
            framed = np.empty(len(buf) + 4, np.uint8)
            framed[:4] = np.frombuffer(np.uint32(size).tobytes(), np.uint8)
            framed[4:] = buf
            return codec.decode(framed)
        return lz4
    if algo == "deflate":
        def deflate(buf: np.ndarray, size: int, dest: np.ndarray) -> bytes:
            d = zlib.decompressobj(-15)
            out = d.decompress(buf, size + 1)
            if not d.eof:
                raise ValueError("the deflate stream does not end where the chunk says"
                                 if len(out) <= size else "the deflate stream holds more data")
            return out
        return deflate
    raise ValueError(f"algo must be one of {ALGORITHMS}, not {algo!r}")


def native_stream_codec(algo: str) -> bool:
    """Whether the native library decodes streams of ``algo`` here (see :func:`decode_batch_cpu`)."""
    import gpu_zarr.engine.native as native

    return native.available() and native.codec_available(algo)


def _fail_native(algo: str, names: Sequence[str] | None, k: int, code: int, detail: int) -> CorruptChunkError:
    import gpu_zarr.engine.native as native

    return CorruptChunkError(f"chunk {_name(names, k)}: {algo} decode failed ({native.describe(code, detail)}). The "
                             "chunk is corrupt or truncated; rewrite or delete that chunk.")


def _checksum_error(names: Sequence[str] | None, k: int, kind: str, got: int, want: int) -> CorruptChunkError:
    """The error of chunk ``k`` whose decoded bytes' ``kind`` checksum ``got`` is not its trailer's ``want``."""
    return CorruptChunkError(f"chunk {_name(names, k)}: the decoded bytes' {kind} is {int(got):#010x}, the stream's "
                             f"trailer says {int(want):#010x}. The chunk is corrupt; rewrite or delete that chunk.")


def lz4_walk_error(name: str, dsize: int, why: str) -> CorruptChunkError:
    """The error of an LZ4 block that does not decode to exactly ``dsize`` bytes (its walk said ``why``)."""
    return CorruptChunkError(f"chunk {name}: its LZ4 block does not decode to the {dsize} bytes it must hold ({why}, "
                             "walked before decoding). The chunk is corrupt or truncated; rewrite or delete that chunk.")


def _decode_batch_native(algo: str, src: np.ndarray, src_offsets: np.ndarray, src_sizes: np.ndarray, dst: np.ndarray,
                         dst_offsets: np.ndarray, dsizes: np.ndarray, names: Sequence[str] | None,
                         crc32: np.ndarray | None, adler32: np.ndarray | None, threads: int, walked: bool) -> None:
    """The whole batch in ONE call on native threads (LZ4 blocks walked first unless ``walked``);
    then the trailers' checksums, also native."""
    import gpu_zarr.engine.native as native

    if algo == "lz4" and not walked:  # the GPU's lz4_sanitize walk, so both refuse the same blocks (an offset of 0)
        walk = native.lz4_check(src, src_offsets, src_sizes, dsizes, threads)
        bad = np.flatnonzero(walk != native.OK) if walk is not None else np.zeros(0, np.int64)
        if walk is not None and len(bad):
            k = int(bad[0])
            raise lz4_walk_error(_name(names, k), int(dsizes[k]), native.describe(int(walk[k])))
    st, det = native.decode(algo, src, src_offsets, src_sizes, dst, dst_offsets, dsizes, threads)
    bad = np.flatnonzero(st != native.OK)
    if len(bad):
        k = int(bad[0])
        raise _fail_native(algo, names, k, int(st[k]), int(det[k]))
    for want, kind, label in ((crc32, "crc32", "CRC-32"), (adler32, "adler32", "Adler-32")):
        if want is None:
            continue
        got = native.checksums(kind, dst, dst_offsets, dsizes, threads)
        if got is None:  # no zlib / libdeflate loaded: Python's zlib
            got = np.array([zlib.crc32(dst[o:o + n]) if kind == "crc32" else zlib.adler32(dst[o:o + n])
                            for o, n in zip(np.asarray(dst_offsets).tolist(), dsizes.tolist())], np.uint32)
        wrong = np.flatnonzero(got != np.asarray(want, np.uint32))
        if len(wrong):
            k = int(wrong[0])
            raise _checksum_error(names, k, label, got[k], want[k])


def decode_batch_cpu(algo: str, src: np.ndarray, src_offsets: np.ndarray, src_sizes: np.ndarray,
                     dst: np.ndarray, dst_offsets: np.ndarray, dst_sizes: np.ndarray | int,
                     names: Sequence[str] | None = None, crc32: np.ndarray | None = None,
                     adler32: np.ndarray | None = None, threads: int = 1, walked: bool = False) -> None:
    """numcodecs/zlib twin of :func:`decode_batch_gpu` (on the CPU).

    Same arguments (host numpy buffers, no stream) and same errors: a stream that fails or
    decodes to another size than ``dst_sizes[k]``, or whose decoded bytes do not match
    ``crc32[k]`` (gzip) / ``adler32[k]`` (zlib, checked on the CPU only), raises
    CorruptChunkError naming ``names[k]``. With the native library
    (:mod:`gpu_zarr.engine.native`) the batch is ONE call on ``threads`` native threads;
    without it (or ``GPU_ZARR_NATIVE=0``), one numcodecs call per stream.
    """
    n = len(src_offsets)
    if n == 0:
        return
    dsizes = _as_sizes(dst_sizes, n)
    if native_stream_codec(algo) and isinstance(dst, np.ndarray) and dst.flags.c_contiguous:
        _decode_batch_native(algo, src, np.asarray(src_offsets, np.int64), np.asarray(src_sizes, np.int64), dst,
                             np.asarray(dst_offsets, np.int64), dsizes, names, crc32, adler32, threads, walked)
        return
    decode = _cpu_decoder(algo)
    src = src.view(np.uint8).reshape(-1)
    for k in range(n):
        so, ss, do, ds = int(src_offsets[k]), int(src_sizes[k]), int(dst_offsets[k]), int(dsizes[k])
        target = dst[do:do + ds]
        try:
            got = decode(src[so:so + ss], ds, target)
        except Exception as exc:
            raise CorruptChunkError(f"chunk {_name(names, k)}: {algo} decode failed ({exc}). The chunk is corrupt "
                                    "or truncated; rewrite or delete that chunk.") from exc
        if got is not target:
            got = np.frombuffer(got, np.uint8) if not isinstance(got, np.ndarray) else got.view(np.uint8).reshape(-1)
            if got.nbytes != ds:
                raise CorruptChunkError(f"chunk {_name(names, k)}: decoded to {got.nbytes} bytes, but the array "
                                        f"metadata says {ds}. The chunk is corrupt or truncated; rewrite or delete "
                                        "that chunk.")
            target[:] = got
        for want, fn, kind in ((crc32, zlib.crc32, "CRC-32"), (adler32, zlib.adler32, "Adler-32")):
            if want is not None and (fn(target) & 0xFFFFFFFF) != int(want[k]):
                raise _checksum_error(names, k, kind, fn(target) & 0xFFFFFFFF, want[k])


def copy_spans_cpu(src: np.ndarray, src_offsets: np.ndarray, dst: np.ndarray, dst_offsets: np.ndarray,
                   sizes: np.ndarray) -> None:
    """Copy byte spans ``src[so : so + n] -> dst[do : do + n]`` (CPU twin of
    :func:`gpu_zarr.engine.nvcomp_batch.copy_spans`)."""
    for so, do, n in zip(np.asarray(src_offsets).tolist(), np.asarray(dst_offsets).tolist(),
                         np.asarray(sizes).tolist()):
        dst[do:do + n] = src[so:so + n]


def decode_zstd_cpu(src: np.ndarray, src_offsets: np.ndarray, src_sizes: np.ndarray, dst: np.ndarray,
                    dst_offsets: np.ndarray, dst_size: int, names: Sequence[str] | None = None) -> None:
    """zstd frames, one decoded size for all: :func:`decode_batch_cpu` with ``algo="zstd"``."""
    decode_batch_cpu("zstd", src, src_offsets, src_sizes, dst, dst_offsets, dst_size, names)
