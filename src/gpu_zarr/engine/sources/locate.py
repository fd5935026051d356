"""Between plan and fetch: find each piece's bytes on disk.

Unsharded arrays: one file per chunk (its size from ``stat``; no file = fill value).
Sharded arrays: each needed shard's index is read once (crc32c checked), and every inner
chunk becomes a byte range of its shard file. Only small reads happen here.

Sizes are checked before anything is read or allocated: a chunk (a file's size, an index
entry) larger than its codec's worst case (:func:`~gpu_zarr.engine.bounds.max_stored_nbytes`)
is a CorruptChunkError naming it, and only regular files are opened as chunks or shards (a
FIFO there would block the read forever; a directory or a device is no chunk).
"""

from __future__ import annotations

import math
import os
import stat as stat_mode
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gpu_zarr import settings
from gpu_zarr.engine.binary import le_uint
from gpu_zarr.engine.bounds import max_stored_nbytes
from gpu_zarr.engine.cache import ChunkCache
from gpu_zarr.engine.codecs.frames import crc32c
from gpu_zarr.engine.layout import Layout
from gpu_zarr.engine.plan import LazyNames, Pieces
from gpu_zarr.errors import CorruptChunkError

__all__ = ["Located", "ShardGeometry", "check_sizes", "entry_spans", "expected_chunk", "index_entries", "index_nbytes",
           "locate", "merge_located", "piece_entries"]


class ShardGeometry(Protocol):
    """What reading a shard's index needs of its array (a :class:`Layout` has it)."""

    @property
    def inner_per_shard(self) -> tuple[int, ...]: ...
    @property
    def index_crc(self) -> bool: ...
    @property
    def index_at_end(self) -> bool: ...
    @property
    def index_big_endian(self) -> bool: ...

_MISSING = np.uint64(2**64 - 1)


@dataclass
class Located:
    """Where each piece's encoded bytes are.

    Attributes
    ----------
    files : list of str or pathlib.Path
        Files holding data; ``file_id`` indexes it.
    file_id, offset, nbytes : ndarray of int64
        Per piece; ``nbytes == -1`` when the piece was never written (fill value).
    names : sequence of str
        Per piece, a name for error messages ("c/0/1/2", "c/0/0 inner chunk (1, 3)").
    mtime_ns : ndarray of int64
        Per file, its modification time when located (-1: no such file), from the same
        ``stat`` that found its size: the chunk cache keys on it.
    """

    files: list[Any]
    file_id: np.ndarray
    offset: np.ndarray
    nbytes: np.ndarray
    names: Sequence[str]
    mtime_ns: np.ndarray


def _stat(path: Any) -> tuple[int, int]:
    """(size, mtime in ns) of a file, (-1, -1) when it does not exist; CorruptChunkError when it
    is not a regular file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return -1, -1
    _regular(path, st.st_mode)
    return st.st_size, st.st_mtime_ns


def _stat_all(files: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(sizes, modification times in ns) of ``files``, -1 for missing ones: on native threads
    where the library is loaded (a plane of 64^3 chunks stats a thousand files, each a Python
    call in a loop), else a plain loop (a stat of a cached inode takes microseconds)."""
    import gpu_zarr.engine.native as native

    got = native.stat_files(files, int(settings.get("threads"))) if len(files) > 64 else None
    if got is None:
        stats = np.array([_stat(f) for f in files], np.int64).reshape(-1, 2)
        return np.ascontiguousarray(stats[:, 0]), np.ascontiguousarray(stats[:, 1])
    size, mtime, kind = got
    for k in np.flatnonzero(kind >= 2).tolist():  # the loop's own answer, message or exception for that file
        size[k], mtime[k] = _stat(files[k])
    return size, mtime


def _regular(path: Any, mode: int) -> None:
    """CorruptChunkError unless ``mode`` is a regular file's (a FIFO would block its read forever)."""
    if not stat_mode.S_ISREG(mode):
        kind = ("a FIFO" if stat_mode.S_ISFIFO(mode) else "a directory" if stat_mode.S_ISDIR(mode)
                else "a socket" if stat_mode.S_ISSOCK(mode) else "a device" if stat_mode.S_ISCHR(mode) or
                stat_mode.S_ISBLK(mode) else "not a regular file")
        raise CorruptChunkError(f"{path} is {kind} where a chunk or shard file belongs; expected a regular file. "
                                "It was not opened; remove it or rewrite that chunk.")


def locate(layout: Layout, pieces: Pieces, pool: ThreadPoolExecutor, indexes: ChunkCache | None = None) -> Located:
    """Locate the bytes of every piece (see module docstring). ``indexes``: checked shard
    indexes kept across reads (the runtime's, keyed by the shard's path, size and mtime: a
    rewritten shard is read again), and where this read's go.

    Raises
    ------
    CorruptChunkError
        An uncompressed chunk whose stored size is not its decoded size, an empty chunk
        file, or a shard whose index is truncated, corrupt or points outside the shard.
    """
    loc = _locate_sharded(layout, pieces, pool, indexes) if layout.sharded else _locate_files(layout, pieces)
    return check_sizes(layout, loc)


def check_sizes(layout: Layout, loc: Located) -> Located:
    """``loc`` itself; CorruptChunkError when an uncompressed chunk's stored size is not its
    decoded size (shared with the remote locate stage)."""
    if layout.codec == "raw":
        stored = layout.stored_nbytes + layout.frame_bytes
        bad = np.flatnonzero((loc.nbytes >= 0) & (loc.nbytes != stored))
        if len(bad):
            k = int(bad[0])
            raise CorruptChunkError(
                f"chunk {loc.names[k]} of {layout.root} has {int(loc.nbytes[k])} bytes; an uncompressed "
                f"chunk of shape {layout.inner_shape} and dtype "
                f"{layout.elements[0].stored if layout.elements else layout.disk_dtype} has {stored}"
                f"{' with its checksums' if layout.frame_bytes else ''}. "
                "It is truncated or corrupt, or was written with other metadata; rewrite or delete it."
            )
    return loc


def merge_located(located: Sequence[Located], roots: Sequence[Any]) -> Located:
    """Several arrays' located pieces as one set, in order (the pieces of
    :func:`gpu_zarr.engine.plan.merge_pieces`): file lists joined, file ids moved along, and
    each piece named with its array's ``root`` (an error names the store and the chunk)."""
    if len(located) == 1:
        return located[0]
    files: list[Any] = []
    ids = []
    for loc in located:
        ids.append(loc.file_id + len(files))
        files.extend(loc.files)
    starts = np.cumsum([0] + [len(loc.nbytes) for loc in located])
    n = int(starts[-1])

    def name(k: int) -> str:
        i = int(np.searchsorted(starts, k, side="right")) - 1
        return f"{located[i].names[k - int(starts[i])]} of {roots[i]}"
    return Located(files, np.concatenate(ids).astype(np.int64), np.concatenate([loc.offset for loc in located]),
                   np.concatenate([loc.nbytes for loc in located]), LazyNames(n, name),
                   np.concatenate([loc.mtime_ns for loc in located]).astype(np.int64))


def _locate_files(layout: Layout, pieces: Pieces) -> Located:
    keys = [layout.chunk_key(tuple(c)) for c in pieces.coords.tolist()]
    root = str(layout.root) + os.sep
    # plain strings: a pathlib.Path per chunk cost as much as its stat (4096 chunks: 55 ms)
    files: list[Any] = [root + k for k in keys]
    sizes, mtimes = _stat_all(files)
    empty = np.flatnonzero(sizes == 0)
    if len(empty):
        raise CorruptChunkError(f"chunk {keys[int(empty[0])]} of {layout.root} is an empty file; expected "
                                f"{expected_chunk(layout)}. Rewrite or delete that chunk.")
    most = max_stored_nbytes(layout)
    huge = np.flatnonzero(sizes > most)
    if len(huge):
        k = int(huge[0])
        raise CorruptChunkError(f"chunk {keys[k]} of {layout.root} is a file of {int(sizes[k])} bytes; "
                                f"{expected_chunk(layout)} takes at most {most}. It is corrupt and was not read; rewrite "
                                "or delete that chunk.")
    ids = np.arange(len(files), dtype=np.int64)
    return Located(files, ids, np.zeros(len(files), np.int64), sizes, keys, mtimes)


def expected_chunk(layout: Layout) -> str:
    """What one stored chunk of this layout holds, for messages."""
    if layout.codec == "raw":
        return f"{layout.stored_nbytes + layout.frame_bytes} bytes (an uncompressed chunk of shape {layout.inner_shape})"
    if layout.host is not None:
        return f"a chunk of shape {layout.inner_shape} encoded by {layout.host.label}"
    return f"a {layout.codec}-compressed chunk of shape {layout.inner_shape}"


def _read_index(layout: Layout, path: str, indexes: ChunkCache | None = None) -> tuple[np.ndarray, int] | None:
    """The (n_inner, 2) uint64 index of one shard and the shard's mtime (ns), or None when the
    shard does not exist (from ``indexes`` when the shard's size and mtime are unchanged)."""
    size = index_nbytes(layout)
    if indexes is not None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        _regular(path, st.st_mode)
        hit = indexes.get(("shard-index", str(path), size, layout.index_at_end, st.st_size, st.st_mtime_ns))
        if hit is not None:
            return hit, st.st_mtime_ns
    try:
        # O_NONBLOCK: a FIFO put there since the stat above is not waited on (fstat refuses it)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        _regular(path, st.st_mode)
        fsize = st.st_size
        # (a shard shorter than its index reads short: index_entries says it is truncated)
        raw = os.pread(fd, size, max(0, fsize - size) if layout.index_at_end else 0)
    finally:
        os.close(fd)
    index = index_entries(layout, path, raw, fsize, max_stored_nbytes(layout))
    if indexes is not None:
        indexes.put(("shard-index", str(path), size, layout.index_at_end, fsize, st.st_mtime_ns), index)
    return index, st.st_mtime_ns


def index_nbytes(layout: ShardGeometry) -> int:
    """Bytes of a shard's index: 16 per inner chunk, and its crc32c."""
    return math.prod(layout.inner_per_shard) * 16 + (4 if layout.index_crc else 0)


def index_entries(layout: ShardGeometry, path: Any, raw: bytes, fsize: int, max_nbytes: int | None = None) -> np.ndarray:
    """The checked (n_inner, 2) uint64 index of a shard of ``fsize`` bytes from its index bytes
    ``raw`` (CorruptChunkError naming ``path`` and the inner chunk when it is short, corrupt,
    points outside, or claims more than ``max_nbytes`` for one inner chunk: its codec's worst
    case, :func:`~gpu_zarr.engine.bounds.max_encoded_nbytes`; checked before anything is read
    or allocated for it)."""
    n, size = math.prod(layout.inner_per_shard), index_nbytes(layout)
    if fsize < size or len(raw) != size:
        raise CorruptChunkError(
            f"shard {path} has {fsize} bytes, fewer than its index alone ({size} bytes for "
            f"{n} inner chunks): the shard is truncated. Rewrite or delete it."
        )
    body = raw[: n * 16]
    if layout.index_crc:
        want = le_uint(raw, n * 16)
        got = crc32c(body)
        if want != got:
            raise CorruptChunkError(
                f"shard {path}: index checksum mismatch (stored crc32c {want:#010x}, computed "
                f"{got:#010x}); the shard is corrupt or truncated. Rewrite or delete it."
            )
    index = np.frombuffer(body, ">u8" if layout.index_big_endian else "<u8").reshape(n, 2)
    data_lo = 0 if layout.index_at_end else size
    data_hi = fsize - size if layout.index_at_end else fsize
    present = index[:, 0] != _MISSING
    off, nb = index[:, 0], index[:, 1]
    # in Python-safe terms: an offset or size near 2**64 must not wrap around the sum
    bad = present & ((off < data_lo) | (off > data_hi) | (nb > data_hi - np.minimum(off, data_hi)) | (nb == 0))
    def refuse(which: np.ndarray, why: str) -> None:
        k = int(np.flatnonzero(which)[0])
        inner = tuple(int(v) for v in np.unravel_index(k, layout.inner_per_shard))
        raise CorruptChunkError(f"shard {path}: inner chunk {inner}: its index entry " + why.format(off=int(off[k]),
                                                                                                     nb=int(nb[k])))
    if max_nbytes is not None:
        huge = present & (nb > np.uint64(max_nbytes))
        if huge.any():
            refuse(huge, f"claims {{nb}} bytes, more than the {max_nbytes} its codec writes at most for one inner "
                         "chunk; the shard is corrupt. Nothing of it was read. Rewrite or delete it.")
    if bad.any():
        refuse(bad, f"(offset {{off}}, {{nb}} bytes) points outside the shard's data ({data_lo}..{data_hi} bytes); "
                    "the shard is truncated or corrupt. Rewrite or delete it.")
    return index


def piece_entries(indexes: Sequence[np.ndarray | None], shard_of: np.ndarray, inner_lin: np.ndarray,
                  n_inner: int) -> tuple[np.ndarray, np.ndarray]:
    """Offset and size of every piece from its shard's checked index (``indexes[s]``, None: the
    shard is missing) at its inner position; size -1 where the inner chunk or the shard is
    missing. One gather for all pieces (not one pass over the pieces per shard)."""
    table = np.full((len(indexes), n_inner, 2), _MISSING, np.uint64)
    for s, index in enumerate(indexes):
        if index is not None:
            table[s] = index
    return entry_spans(table[shard_of, inner_lin] if len(shard_of) else np.zeros((0, 2), np.uint64))


def entry_spans(entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Offset and size (int64) of index entries (rows of a checked index); size -1 where the
    inner chunk is missing."""
    ok = entries[:, 0] != _MISSING
    offset = np.where(ok, entries[:, 0], 0).astype(np.int64)
    nbytes = np.where(ok, entries[:, 1], 0).astype(np.int64)
    nbytes[~ok] = -1
    return offset, nbytes


def _shard_groups(shard_coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``shard_coords`` (sorted) and each row's place among them: through
    one integer per row over the rows' bounding box (a 1-D unique: an order of magnitude faster
    than numpy's row-wise unique, which a viewer's every read pays), row-wise only where that box
    is too large to number."""
    lo = shard_coords.min(axis=0)
    span = tuple(int(v) for v in shard_coords.max(axis=0) - lo + 1)
    if math.prod(span) >= 2**62:
        uniq, shard_of = np.unique(shard_coords, axis=0, return_inverse=True)
        return uniq, shard_of.reshape(-1)
    lin, shard_of = np.unique(np.ravel_multi_index(tuple((shard_coords - lo).T), span), return_inverse=True)
    return np.stack(np.unravel_index(lin, span), axis=1) + lo, shard_of.reshape(-1)


def _locate_sharded(layout: Layout, pieces: Pieces, pool: ThreadPoolExecutor,
                    indexes: ChunkCache | None = None) -> Located:
    n = len(pieces)
    if not n:
        return Located([], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), [],
                       np.zeros(0, np.int64))
    per = np.asarray(layout.inner_per_shard, np.int64)
    shard_coords = pieces.coords // per
    inner_coords = pieces.coords - shard_coords * per
    inner_lin = np.asarray(np.ravel_multi_index(tuple(inner_coords.T), tuple(per)))
    uniq, shard_of = _shard_groups(shard_coords)
    keys = [layout.chunk_key(tuple(c)) for c in uniq.tolist()]
    root = str(layout.root) + os.sep  # plain strings: a Path per shard cost more than its stat
    files: list[Any] = [root + k for k in keys]
    # a viewer's read touches a few shards, mostly known: a plain loop beats a task per shard
    found = ([_read_index(layout, p, indexes) for p in files] if len(files) <= 4
             else list(pool.map(lambda p: _read_index(layout, p, indexes), files)))
    shard_index = [f[0] if f is not None else None for f in found]
    mtimes = np.array([f[1] if f is not None else -1 for f in found], np.int64)
    offset, nbytes = piece_entries(shard_index, shard_of, inner_lin, math.prod(layout.inner_per_shard))

    def name(k: int) -> str:
        return f"{keys[int(shard_of[k])]} inner chunk {tuple(int(v) for v in inner_coords[k])}"
    return Located(files, shard_of.astype(np.int64), offset, nbytes, LazyNames(n, name), mtimes)
