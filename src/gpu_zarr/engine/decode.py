"""Stage 3, decode: one batched zstd call per batch.

:func:`decode_zstd_gpu` is the only place that calls nvCOMP; the engine and the zarr codec
(:mod:`gpu_zarr.nvcomp_zstd`) both use it. Frames are checked on the host first
(:mod:`gpu_zarr.engine.zstd_frames`): nvCOMP is undefined on corrupt input.
:func:`decode_zstd_cpu` is the numcodecs twin.
"""

from __future__ import annotations

import threading

import numpy as np

from gpu_zarr.errors import INSTALL_HINT, CorruptChunkError, GPUUnavailable

__all__ = ["decode_zstd_cpu", "decode_zstd_gpu", "nvcomp_codec"]

_local = threading.local()


def _nvcomp():
    try:
        from nvidia import nvcomp
    except ImportError as exc:
        raise GPUUnavailable(f"nvCOMP is not installed, so zstd cannot be decoded on the GPU: {INSTALL_HINT}") from exc
    return nvcomp


def nvcomp_codec(stream):
    """A RAW-bitstream zstd nvCOMP codec bound to ``stream`` (cached per thread and stream).

    Notes
    -----
    Codecs are kept for the life of the process: nvCOMP keeps its decode scratch (about
    3x the decoded bytes of a batch) with the codec and reuses it, and a codec's first
    decode is slow (~10 ms). A second decode on a busy codec blocks the host, so the
    engine gives each stream its own codec.
    """
    nvcomp = _nvcomp()
    cache = getattr(_local, "codecs", None)
    if cache is None:
        cache = _local.codecs = {}
    key = (int(stream.ptr), stream.device_id if hasattr(stream, "device_id") else 0)
    codec = cache.get(key)
    if codec is None:
        codec = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW,
                             cuda_stream=int(stream.ptr))
        cache[key] = codec
    return codec


def decode_zstd_gpu(src, src_offsets, src_sizes, dst, dst_offsets, dst_size: int, stream, names=None) -> None:
    """Decode zstd frames from one device buffer into another, in ONE nvCOMP call.

    Parameters
    ----------
    src : cupy.ndarray of uint8
        Encoded frames, frame k at ``src_offsets[k]`` with ``src_sizes[k]`` bytes,
        already validated by :func:`gpu_zarr.engine.zstd_frames.check_frames`.
    dst : cupy.ndarray of uint8
        Output; frame k decodes to ``dst[dst_offsets[k] : dst_offsets[k] + dst_size]``.
    dst_size : int
        Decoded size of every frame (a zarr chunk's size is known from the metadata, which
        also serves frames whose header omits the content size).
    stream : cupy.cuda.Stream
        Stream the decode is ordered on.
    names : sequence of str, optional
        Chunk names for error messages.

    Raises
    ------
    CorruptChunkError
        When nvCOMP reports a failure (e.g. a checksum mismatch).
    """
    n = len(src_offsets)
    if n == 0:
        return
    nvcomp = _nvcomp()
    codec = nvcomp_codec(stream)
    s = int(stream.ptr)
    srcs = nvcomp.as_arrays(src, [int(v) for v in src_offsets], [int(v) for v in src_sizes], cuda_stream=s)
    outs = nvcomp.as_arrays(dst, [int(v) for v in dst_offsets], [int(dst_size)] * n, cuda_stream=s)
    try:
        codec.decode(srcs, out=outs)
    except Exception as exc:
        which = f" (chunks {names[0]} .. {names[-1]})" if names else ""
        raise CorruptChunkError(
            f"nvCOMP could not decode a batch of {n} zstd chunks{which}: {exc}. The chunks passed the "
            "frame check, so a checksum or block content is wrong: the data are corrupt."
        ) from exc


def decode_zstd_cpu(src: np.ndarray, src_offsets, src_sizes, dst: np.ndarray, dst_offsets, dst_size: int,
                    names=None) -> None:
    """numcodecs twin of :func:`decode_zstd_gpu` (one call per frame, on the CPU)."""
    from numcodecs import Zstd

    codec = Zstd()
    for k, (so, ss, do) in enumerate(zip(src_offsets, src_sizes, dst_offsets)):
        out = dst[int(do):int(do) + dst_size]
        try:
            codec.decode(src[int(so):int(so) + int(ss)], out=out)
        except Exception as exc:
            name = names[k] if names else f"#{k}"
            raise CorruptChunkError(f"chunk {name}: zstd decode failed ({exc}); the chunk is corrupt. "
                                    "Rewrite or delete that chunk.") from exc
