"""Locate and fetch stages for remote arrays (:mod:`gpu_zarr.engine.remote` makes the requests).

- :func:`locate_remote` replaces ``stat`` and the shard-index ``pread``: unsharded chunks are
  fetched whole (one GET each, all in flight at once; a 404 is the fill value, as zarr reads
  it), shard indexes by one suffix-range GET each.
- :class:`RemoteReader` is the fetch stage's :class:`~gpu_zarr.engine.fetch.Reader` for
  remote pieces: coalesced byte ranges (pieces that follow each other in a shard become one
  ranged GET, cut into parts of ``PART_BYTES``), many requests in flight, written into the
  same staging buffers as local reads, so decode is unchanged.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from gpu_zarr.engine.fetch import read_tasks
from gpu_zarr.engine.layout import Layout
from gpu_zarr.engine.locate import Located, check_sizes, index_entries
from gpu_zarr.engine.plan import Batch, LazyNames, Pieces
from gpu_zarr.engine.remote import RemoteBlob, RemoteObject, RemoteSource
from gpu_zarr.errors import CorruptChunkError

__all__ = ["PART_BYTES", "RemoteReader", "locate_remote"]

PART_BYTES = 8 << 20


def locate_remote(layout: Layout, pieces: Pieces, source: RemoteSource) -> Located:
    """:func:`gpu_zarr.engine.locate.locate` for a remote array (see the module docstring)."""
    return check_sizes(layout, _locate(layout, pieces, source))


def _locate(layout: Layout, pieces: Pieces, source: RemoteSource) -> Located:
    if not layout.sharded:
        keys = [layout.chunk_key(tuple(c)) for c in pieces.coords.tolist()]
        got = source.get_many(keys)
        files: list[Any] = []
        sizes = np.full(len(keys), -1, np.int64)
        mtimes = np.full(len(keys), -1, np.int64)
        for i, (k, g) in enumerate(zip(keys, got)):
            files.append(RemoteBlob(source.url_of(k), g[0] if g is not None else b""))
            if g is not None:
                if not g[0]:
                    raise CorruptChunkError(f"chunk {source.url_of(k)} is empty; expected encoded chunk bytes. "
                                            "Rewrite or delete that chunk.")
                sizes[i], mtimes[i] = len(g[0]), g[1]
        return Located(files, np.arange(len(files), dtype=np.int64), np.zeros(len(files), np.int64), sizes,
                       keys, mtimes)
    per = np.asarray(layout.inner_per_shard, np.int64)
    shard_coords, inner_coords = pieces.coords // per, pieces.coords % per
    inner_lin: np.ndarray = (np.asarray(np.ravel_multi_index(inner_coords.T, tuple(per))) if len(pieces)
                             else np.zeros(0, np.int64))
    uniq, shard_of = np.unique(shard_coords, axis=0, return_inverse=True)
    shard_of = shard_of.reshape(-1)
    keys = [layout.chunk_key(tuple(c)) for c in uniq.tolist()]
    n_inner = int(np.prod(layout.inner_per_shard))
    size = n_inner * 16 + (4 if layout.index_crc else 0)
    found = source.get_indexes(keys, size, layout.index_at_end)
    n = len(pieces)
    offset = np.zeros(n, np.int64)
    nbytes = np.full(n, -1, np.int64)
    mtimes = np.full(len(keys), -1, np.int64)
    for s, f in enumerate(found):
        if f is None:
            continue
        raw, fsize, mtimes[s] = f
        index = index_entries(layout, source.url_of(keys[s]), raw, fsize)
        sel = np.flatnonzero(shard_of == s)
        entries = index[inner_lin[sel]]
        ok = entries[:, 0] != np.uint64(2**64 - 1)
        offset[sel[ok]] = entries[ok, 0].astype(np.int64)
        nbytes[sel[ok]] = entries[ok, 1].astype(np.int64)

    def name(k: int) -> str:
        return f"{source.url_of(keys[int(shard_of[k])])} inner chunk {tuple(int(v) for v in inner_coords[k])}"
    objs: list[Any] = [RemoteObject(source, k) for k in keys]
    return Located(objs, shard_of.astype(np.int64), offset, nbytes, LazyNames(n, name), mtimes)


class RemoteReader:
    """The fetch stage for remote pieces (:class:`~gpu_zarr.engine.fetch.Reader`)."""

    name = "remote"

    def __init__(self, requests: int = 64) -> None:
        self.threads = requests

    def session(self) -> AbstractContextManager[None]:
        """Nothing to scope: the client's settings belong to its store."""
        return nullcontext()

    def read(self, files: list[Any], batch: Batch, dest: Any) -> None:
        """Fill ``dest`` (host uint8) with the encoded bytes of every piece of ``batch``."""
        mv = memoryview(dest).cast("B")
        by_source: dict[int, tuple[RemoteSource, list[tuple[str, int, int, memoryview]]]] = {}
        for f, o, spans in _coalesce(read_tasks(batch, PART_BYTES)):
            obj = files[f]
            if isinstance(obj, RemoteBlob):
                for d, n in spans:
                    if o + n > len(obj.data):
                        raise CorruptChunkError(f"{obj.url}: expected {n} bytes at offset {o}, the object "
                                                f"has {len(obj.data)}")
                    mv[d:d + n] = obj.data[o:o + n]
                    o += n
                continue
            total = sum(n for _, n in spans)
            src, ranges = by_source.setdefault(id(obj.source), (obj.source, []))
            if len(spans) == 1:
                d, n = spans[0]
                ranges.append((obj.rel, o, n, mv[d:d + n]))
            else:  # adjacent pieces, separate staging spans: one GET, then copies
                ranges.append((obj.rel, o, total, _Scatter(mv, spans)))  # type: ignore[arg-type]
        for src, ranges in by_source.values():
            t = time.perf_counter()
            src.read_ranges(ranges)
            src.stats["seconds"] = src.stats.get("seconds", 0.0) + time.perf_counter() - t

    def close(self) -> None:
        pass


def _coalesce(tasks: list[tuple[int, int, list[tuple[int, int]]]]) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Tasks of one object whose bytes follow each other become one (up to ``PART_BYTES``),
    whatever the order of the pieces in the batch (a CPU small read lists every piece alone)."""
    out: list[tuple[int, int, list[tuple[int, int]]]] = []
    for f, o, spans in sorted(tasks, key=lambda t: (t[0], t[1])):
        n = sum(x for _, x in spans)
        if out:
            pf, po, ps = out[-1]
            pn = sum(x for _, x in ps)
            if pf == f and po + pn == o and pn + n <= PART_BYTES:
                ps.extend(spans)
                continue
        out.append((f, o, list(spans)))
    return out


class _Scatter:
    """A destination made of separate spans of one buffer (``dest[:n] = data`` fills them in order)."""

    def __init__(self, mv: memoryview, spans: list[tuple[int, int]]) -> None:
        self._mv, self._spans = mv, spans

    def __setitem__(self, key: slice, data: memoryview) -> None:
        got = 0
        for d, n in self._spans:
            self._mv[d:d + n] = data[got:got + n]
            got += n
