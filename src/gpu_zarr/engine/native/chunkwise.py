"""The small-read path on native threads: read, decode and place each chunk in one C call.

:func:`read_chunkwise` serves the CPU's small reads (a viewer's plane or tile, the ``cpu``
backend) with ONE call into the native library (:mod:`gpu_zarr.engine.native`): per chunk
a native thread reads the chunk's bytes, decodes them (zstd, Blosc with every shuffle and
its lz4 / zstd / zlib inner codecs, gzip, zlib, raw) and places them into the output, with
no Python per chunk and the GIL free. Scratch is leased from the runtime's reused host
memory (fresh memory costs page faults). Chunks the library reports as unsupported (Blosc
with blosclz or snappy, Blosc2-format chunks) are returned to the caller, which decodes
them with numcodecs; any other failure raises naming the chunk.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import numpy as np

from gpu_zarr.engine.codecs import stage_named
from gpu_zarr.engine.codecs.chain import stage_for
from gpu_zarr.engine.runtime import host_empty
from gpu_zarr.errors import CorruptChunkError

__all__ = ["crc32c_frames", "decode_failed", "native_codec", "read_chunkwise", "serves"]


def native_codec(codec: str) -> str | None:
    """The native library's codec for chunks of ``codec`` (:attr:`Layout.codec`), as its
    registered stage declares it (:mod:`gpu_zarr.engine.codecs`); None when it has none."""
    stage = stage_named(codec)
    return None if stage is None else stage.native


def crc32c_frames(lay: Any) -> int | None:
    """How many crc32c checksums the native library verifies and strips from each of ``lay``'s
    chunks: 0 or more; None when the chain has a frame it does not know."""
    names = [f.name for f in lay.frames]
    return len(names) if all(n == "crc32c" for n in names) else None


def serves(lay: Any, out: Any) -> bool:
    """Whether :func:`read_chunkwise` can read the chunks of layout ``lay`` into ``out`` here: a
    core codec the native library decodes, inside crc32c frames at most (no host steps)."""
    import gpu_zarr.engine.native as native

    nat = native_codec(lay.codec)
    return (nat is not None and crc32c_frames(lay) is not None and lay.host is None and not lay.elements
            and native.available()
            and native.codec_available(nat)
            and isinstance(out, np.ndarray) and out.flags.c_contiguous and out.flags.writeable)


_HOST_REASONS = MappingProxyType({21: "blosclz", 22: "snappy", 23: "blosc2"})


def read_chunkwise(lay: Any, loc: Any, pieces: Any, todo: np.ndarray, out: np.ndarray, rt: Any, threads: int,
                   keep: Any = None, stats: dict[str, Any] | None = None) -> np.ndarray:
    """Read, decode and place the located pieces ``todo`` (present, not served by the cache) of
    ``lay`` into ``out`` (C-contiguous, native byte order) on ``threads`` native threads, with
    per-thread scratch lent by ``rt.host_scratch``.

    ``keep``: the chunk cache's keeper; chunks it ``wants(k)`` are decoded into buffers of their
    own, handed to ``keep(k, buffer)``. ``stats`` receives counts of the chunks left to numcodecs,
    as the Blosc parser reports them (``blosc_host_chunks``, ``blosc_host_blosclz``, ...).
    Returns the pieces of ``todo`` the library does not decode (unsupported Blosc chunks);
    raises CorruptChunkError naming a truncated file or a chunk that does not decode.
    """
    import gpu_zarr.engine.native as native
    from gpu_zarr.engine.sources.files import raise_read_errors

    codec = native_codec(lay.codec)
    if codec is None:
        raise ValueError(f"the native library has no decoder for {lay.codec!r} chunks (check serves() first)")
    n = len(todo)
    if n == 0:
        return todo
    fid, foff = loc.file_id[todo].astype(np.int64), loc.offset[todo].astype(np.int64)
    size = loc.nbytes[todo].astype(np.int64)
    inner = int(lay.inner_nbytes)
    threads = max(1, min(int(threads), n))
    per = native.scratch_per_thread(codec, int(size.max()), inner)
    keep_bufs: list[np.ndarray | None] | None = None
    if keep is not None:
        # the runtime's recycled blocks: a chunk the cache evicts comes back touched for the next
        keep_bufs = [rt.recycled.take(inner) if keep.wants(int(k)) else None for k in todo.tolist()]
    with rt.host_scratch.lease(threads * per, 1, host_empty) as (scratch,):
        st, det = native.fused(codec, loc.files, fid, foff, size, inner, pieces.table[todo], out, lay.disk_dtype,
                               lay.transpose, threads, scratch, keep_bufs, crc32c_frames(lay) or 0)
    unsupported = np.isin(st, list(native.UNSUPPORTED))
    bad = np.flatnonzero((st != native.OK) & ~unsupported)
    if len(bad):
        i = int(bad[0])
        code = int(st[i])
        if code in (native.OPEN, native.SHORT, native.IO):
            raise_read_errors(loc.files, fid, foff, size, np.where(unsupported, native.OK, st), det)
        if code == native.CRC32C_MISMATCH:
            raise CorruptChunkError(
                f"chunk {loc.names[int(todo[i])]} fails its crc32c checksum: its bytes are not the ones that were "
                "written (a damaged or partly written file). Re-copy or re-write it.")
        _explain(lay, loc, int(todo[i]))  # the host check's detailed message, when it finds the fault
        raise decode_failed(lay.codec, loc.names[int(todo[i])], code, int(det[i]))
    if stats is not None and unsupported.any():
        stats["blosc_host_chunks"] = stats.get("blosc_host_chunks", 0) + int(unsupported.sum())
        for code, why in _HOST_REASONS.items():
            if (st == code).any():
                stats[f"blosc_host_{why}"] = stats.get(f"blosc_host_{why}", 0) + int((st == code).sum())
    if keep_bufs is not None:
        for k, buf, skip in zip(todo.tolist(), keep_bufs, unsupported.tolist()):
            if buf is not None and not skip:
                keep(int(k), buf)
    return todo[unsupported]


def decode_failed(codec: str, name: str, code: int, detail: int) -> CorruptChunkError:
    """The error for chunk ``name`` that the native library could not decode (status ``code``)."""
    import gpu_zarr.engine.native as native

    what = {"gzip": " (its deflate stream, or the CRC-32 and size in its trailer)",
            "zlib": " (its deflate stream, or the Adler-32 in its trailer)"}.get(codec, "")
    return CorruptChunkError(
        f"chunk {name}: {codec} decode failed{what}: {native.describe(code, detail)}. The chunk is corrupt or "
        "truncated; rewrite or delete that chunk (zarr-python's own read fails on it too).")


def _explain(lay: Any, loc: Any, k: int) -> None:
    """Run the codec's Python host check on the one chunk that failed (the slow path, only
    on an error): it raises CorruptChunkError saying exactly what is wrong, when it can see it."""
    from gpu_zarr.engine.plan import Batch
    from gpu_zarr.engine.sources.files import read_range

    size = int(loc.nbytes[k])
    buf = np.empty(max(size, 1), np.uint8)
    read_range(loc.files[int(loc.file_id[k])], int(loc.offset[k]), buf[:size])
    one = Batch(np.array([k]), np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64),
                np.array([size], np.int64), np.array([[0, 1]], np.int64), size)
    stage = stage_for(lay)
    if stage.decodes:
        stage.prepare(buf, one, lay, [loc.names[k]])
