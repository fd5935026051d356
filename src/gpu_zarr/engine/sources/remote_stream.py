"""Locate and fetch stages for remote arrays (:mod:`gpu_zarr.engine.sources.remote` makes the requests).

- :func:`stream_remote` is locate and fetch in one: every object a read needs is requested at
  once and handed on (:class:`Arrived`) as it arrives, so decode overlaps the transfer (the
  CPU's host path decodes each answer; the GPU path takes them in groups). Unsharded chunks are
  GET whole (a 404 is the fill value, as zarr reads it). A shard the read needs at least half
  of (and no bigger than ``WHOLE_SHARD_BYTES`` decoded) is GET whole, its index taken from its
  own bytes: one round trip, no index request; one it needs all of is GET whole even when its
  index is known (with a native decode set, its inner chunks then decode as the shard's bytes
  pass each one's end). Other shards need their index: known from an earlier read of the open
  array (:meth:`RemoteSource.cached_index`), or fetched for all of them in one wave of
  suffix-range GETs; then one ranged GET per run of inner chunks closer than ``GAP_BYTES`` (cut
  at ``PART_BYTES``). A ranged answer whose object changed since its index was fetched (another
  size, modification time or etag; or it is gone) is dropped and the shard is read again, its
  index fetched anew.
- :class:`RemoteReader` is the fetch stage's :class:`~gpu_zarr.engine.sources.files.Reader` on the GPU
  path: it copies the answers that arrived (:class:`~gpu_zarr.engine.sources.remote.RemoteBlob`) into
  the same staging buffers as local reads, so decode is unchanged.
"""

from __future__ import annotations

import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_zarr.engine.bounds import max_stored_nbytes
from gpu_zarr.engine.layout import Layout
from gpu_zarr.engine.plan import Batch, Pieces
from gpu_zarr.engine.sources.files import OwnThreads, read_tasks
from gpu_zarr.engine.sources.http import Handoff, Parts, Sink
from gpu_zarr.engine.sources.locate import Located, check_sizes, entry_spans, expected_chunk, index_entries, index_nbytes
from gpu_zarr.engine.sources.remote import Bodies, Got, RemoteBlob, RemoteSource, Span, changed_while_read
from gpu_zarr.errors import CorruptChunkError, ShardChanged

__all__ = ["GAP_BYTES", "PART_BYTES", "WHOLE_SHARD_BYTES", "Arrived", "RemoteReader", "stream_remote"]

PART_BYTES = 8 << 20
GAP_BYTES = 64 << 10  # inner chunks of one shard closer than this are one GET (a round trip costs more)
WHOLE_SHARD_BYTES = 256 << 20  # decoded: a shard up to this size that a read mostly needs is one GET


@dataclass
class Arrived:
    """Pieces whose encoded bytes arrived in one answer.

    Attributes
    ----------
    pieces : ndarray of int
        Indices of the read's pieces.
    data : buffer or None
        The answer's bytes (None when every piece is missing).
    offset, nbytes : ndarray of int64
        Per piece, where its bytes are in ``data``; ``nbytes == -1``: never written (fill value).
    base : int
        Offset of ``data`` in its object (cache keys name offsets in the object).
    url : str
        The object's URL.
    mtime : int
        Its modification time in ns (cache keys).
    names : callable
        ``names(j)``: the name of piece ``pieces[j]`` for messages.
    handed : int
        Its first ``handed`` pieces were handed to the read's native decode set as they
        arrived (``handoff`` of :func:`stream_remote`): they are being decoded and placed already.
    """

    pieces: np.ndarray
    data: Any
    offset: np.ndarray
    nbytes: np.ndarray
    base: int
    url: str
    mtime: int
    names: Callable[[int], str]
    handed: int = 0


def stream_remote(layout: Layout, pieces: Pieces, source: RemoteSource,
                  on_arrived: Callable[[Arrived], None], arena: Bodies | None = None,
                  handoff: Handoff | None = None, on_sent: Callable[[], None] | None = None,
                  stop: Callable[[], bool] | None = None) -> dict[str, int]:
    """Locate and fetch every piece, calling ``on_arrived`` as each answer arrives (from the
    event loop's thread, or this one for what is already known: it must only hand the work
    on). See the module docstring. Returns counts: ``requests``, ``index_requests``,
    ``whole_shards``.

    ``handoff``: a native decode set of the read's pieces (chunk i = piece i), once open. The
    native HTTP client hands each whole chunk's complete answer to it as it arrives, and
    reports it later (``handed``); of a whole shard whose index is known, each inner chunk as
    the shard's bytes pass its end (when the answer is the object that index belongs to: its
    size, Last-Modified and ETag). ``on_sent()``: see :meth:`RemoteSource.stream` (a sharded
    read's after its indexes). ``stop()``: asked while the answers travel; true stops them.

    Raises
    ------
    CorruptChunkError
        An empty chunk, an uncompressed chunk of the wrong size, a truncated or corrupt shard.
    RemoteError
        A request failed (after retries).
    """
    counts = {"requests": 0, "index_requests": 0, "whole_shards": 0}
    if not len(pieces):
        return counts
    if not layout.sharded:
        return _stream_chunks(layout, pieces, source, on_arrived, counts, arena, handoff, on_sent, stop)
    return _stream_shards(layout, pieces, source, on_arrived, counts, arena, on_sent, handoff, stop)


def _stream_chunks(layout: Layout, pieces: Pieces, source: RemoteSource, on_arrived: Callable[[Arrived], None],
                   counts: dict[str, int], arena: Bodies | None, handoff: Handoff | None,
                   on_sent: Callable[[], None] | None, stop: Callable[[], bool] | None = None) -> dict[str, int]:
    keys = [layout.chunk_key(c) for c in pieces.cells]

    def hand(i: int, got: Any, handed: int = 0) -> None:
        url = source.url_of(keys[i])
        if got is None:
            on_arrived(Arrived(np.array([i]), None, np.zeros(1, np.int64), np.full(1, -1, np.int64), 0, url, -1,
                               lambda j: url))
            return
        data, mtime = got
        n = len(data)
        if n == 0:
            raise CorruptChunkError(f"chunk {url} is empty; expected encoded chunk bytes. Rewrite or delete that chunk.")
        if layout.codec == "raw":  # (only an uncompressed chunk has a size to check: no arrays per answer else)
            check_sizes(layout, Located([url], np.zeros(1, np.int64), np.zeros(1, np.int64), np.array([n], np.int64),
                                        [url], np.array([mtime], np.int64)))
        on_arrived(Arrived(np.array([i]), data, np.zeros(1, np.int64), np.array([n], np.int64), 0, url, mtime,
                           lambda j: url, handed))

    todo = []
    miss = object()
    u = source.url
    for i, got in enumerate(source.fetched.find([(u, k) for k in keys], miss)):
        if got is miss:
            todo.append(i)
        else:
            hand(i, got)

    def done(j: int, got: Got | None) -> None:
        i = todo[j]
        value = (got.data, got.mtime) if got is not None else None
        if arena is None or arena.lasting:
            source.fetched.put((source.url, keys[i]), value)
        hand(i, value, got.handed if got is not None else 0)
    counts["requests"] += len(todo)
    sink = Sink(handoff, array.array("q", todo)) if handoff is not None else None
    source.stream([(keys[i], None) for i in todo], done, max_stored_nbytes(layout), arena, sink, on_sent, stop=stop,
                  expected=expected_chunk(layout))
    return counts


def _stream_shards(layout: Layout, pieces: Pieces, source: RemoteSource, on_arrived: Callable[[Arrived], None],
                   counts: dict[str, int], arena: Bodies | None,
                   on_sent: Callable[[], None] | None = None, handoff: Handoff | None = None,
                   stop: Callable[[], bool] | None = None) -> dict[str, int]:
    s = _ShardStream(layout, pieces, source, on_arrived, counts)
    s.choose(stop)
    s.ranges()
    s.cold_indexes(handoff)
    try:
        s.send(arena, handoff, on_sent, stop)
    except ShardChanged:
        # a shard changed since its index was fetched: nothing of it was handed on. Forget every
        # index of this read and read again (pieces of unchanged shards are placed twice, alike)
        s.forget()
        counts["stale"] = counts.get("stale", 0) + 1
        if counts["stale"] > 2:
            raise CorruptChunkError(f"the shards of {source.url} keep changing while read; try again later") from None
        # (on_sent ran, or no job was sent; no parts: what was handed is not handed again)
        return _stream_shards(layout, pieces, source, on_arrived, counts, arena, stop=stop)
    return counts


class _ShardStream:
    """The requests of one sharded read: which shards come whole, which by ranges of their inner
    chunks (their indexes known, or fetched in one wave first), and what each answer hands on."""

    def __init__(self, layout: Layout, pieces: Pieces, source: RemoteSource, on_arrived: Callable[[Arrived], None],
                 counts: dict[str, int]) -> None:
        self.layout, self.source, self.on_arrived, self.counts = layout, source, on_arrived, counts
        per = np.asarray(layout.inner_per_shard, np.int64)
        shard_coords, self.inner_coords = pieces.coords // per, pieces.coords % per
        self.inner_lin = np.asarray(np.ravel_multi_index(self.inner_coords.T, tuple(per)), np.int64)
        uniq, shard_of = np.unique(shard_coords, axis=0, return_inverse=True)
        shard_of = shard_of.reshape(-1)
        self.keys = [layout.chunk_key(tuple(c)) for c in uniq.tolist()]
        self.n_inner = int(np.prod(layout.inner_per_shard))
        self.index_size = index_nbytes(layout)
        order = np.argsort(shard_of, kind="stable")  # each shard's pieces, in one sort (not a pass per shard)
        bounds = np.searchsorted(shard_of[order], np.arange(len(self.keys) + 1))
        self.members = [order[bounds[s]:bounds[s + 1]] for s in range(len(self.keys))]
        self.whole_ok = self.n_inner * int(layout.inner_nbytes) <= WHOLE_SHARD_BYTES
        self.chunk_cap = max_stored_nbytes(layout)  # no index entry may claim more (checked before a range is asked for)
        self.shard_cap = self.n_inner * self.chunk_cap + self.index_size
        self.whole: list[int] = []
        self.known: dict[int, tuple[np.ndarray, int, int, str]] = {}
        self.jobs: list[tuple[str, Span]] = []
        self.what: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, int]] = []  # shard, pieces, offsets, sizes, start
        self.index_of: dict[int, int] = {}  # an index job -> its shard's whole job
        self.cut: dict[int, tuple[np.ndarray, bytes]] = {}  # per such job: its pieces' order, the index that cut them
        self.parts: Parts | None = None

    def url(self, s: int) -> str:
        return self.source.url_of(self.keys[s])

    def namer(self, url: str, sel: np.ndarray) -> Callable[[int], str]:
        inner = self.inner_coords
        return lambda j: f"{url} inner chunk {tuple(int(v) for v in inner[int(sel[j])])}"

    def missing(self, s: int, sel: np.ndarray | None = None, mtime: int = -1) -> None:
        sel = self.members[s] if sel is None else sel
        self.on_arrived(Arrived(sel, None, np.zeros(len(sel), np.int64), np.full(len(sel), -1, np.int64), 0,
                                self.url(s), mtime, self.namer(self.url(s), sel)))

    def choose(self, stop: Callable[[], bool] | None) -> None:
        """Which shards come whole, which by ranges (their indexes known or fetched in one wave)."""
        source, layout = self.source, self.layout
        need: list[int] = []
        for s in range(len(self.keys)):
            idx = source.cached_index(self.keys[s])
            if self.whole_ok and len(self.members[s]) == self.n_inner:  # all of it: one GET, even with its index known
                self.whole.append(s)
            elif idx is not None and len(idx[0]) == self.index_size:
                self.known[s] = (index_entries(layout, self.url(s), idx[0], idx[1], self.chunk_cap), idx[1], idx[2],
                                 idx[3])
            elif self.whole_ok and 2 * len(self.members[s]) >= self.n_inner:
                self.whole.append(s)
            else:
                need.append(s)
        if not need:
            return
        self.counts["index_requests"] += len(need)
        found = source.get_indexes([self.keys[s] for s in need], self.index_size, layout.index_at_end,
                                   self.shard_cap, stop)
        for s, f in zip(need, found):
            if f is None:
                self.missing(s)
                continue
            raw, fsize, mtime = f
            cached = source.cached_index(self.keys[s])
            self.known[s] = (index_entries(layout, self.url(s), raw, fsize, self.chunk_cap), fsize, mtime,
                             cached[3] if cached is not None else "")

    def ranges(self) -> None:
        """A job per whole shard, and per run of close inner chunks of the others."""
        for s in self.whole:
            self.jobs.append((self.keys[s], None))
            self.what.append((s, self.members[s], np.zeros(0, np.int64), np.zeros(0, np.int64), -1))
        for s, (index, _fsize, mtime, _etag) in self.known.items():
            sel = self.members[s]
            offs, sizes = entry_spans(index[self.inner_lin[sel]])
            ok = sizes >= 0
            if not ok.all():
                self.missing(s, sel[~ok], mtime)
            sel, offs, sizes = sel[ok], offs[ok], sizes[ok]
            for a in _runs(offs, sizes):
                start, end = int(offs[a].min()), int((offs[a] + sizes[a]).max())
                self.jobs.append((self.keys[s], (start, end)))
                self.what.append((s, sel[a], offs[a] - start, sizes[a], start))

    def cold_indexes(self, handoff: Handoff | None) -> None:
        """Whole shards' inner chunks go to the read's decode set as the shard's bytes pass each
        one's end (the set opens while the requests travel). Their index known, from the start;
        else it is fetched beside the shard, in the same wave (a suffix GET: the same round
        trip), and the bytes that come after it hand them (native HTTP only: obstore's answers
        come whole)."""
        source, layout = self.source, self.layout
        cold = [j for j, s in enumerate(self.whole) if source.cached_index(self.keys[s]) is None] \
            if handoff is not None and getattr(source, "http", None) is not None else []
        for j in cold:
            self.index_of[len(self.jobs)] = j
            size = self.index_size
            self.jobs.append((self.keys[self.whole[j]], {"suffix": size} if layout.index_at_end else (0, size)))
            self.what.append((self.whole[j], self.members[self.whole[j]], np.zeros(0, np.int64), np.zeros(0, np.int64),
                              -2))
        self.counts["index_requests"] += len(cold)
        self.parts = Parts(len(self.jobs), late=bool(cold)) if handoff is not None and self.whole else None
        for j, s in enumerate(self.whole if self.parts is not None else ()):
            got_idx = source.cached_index(self.keys[s])
            if got_idx is None or len(got_idx[0]) != self.index_size:
                continue
            made = self.cut_by(j, *got_idx)
            if made is not None:
                assert self.parts is not None
                self.parts.set(j, *made)

    def cut_by(self, j: int, raw: bytes, fsize: int, mtime: int, etag: str) -> tuple[Any, ...] | None:
        """Whole job j's parts by the index ``raw``, as :meth:`Parts.set` takes them after j
        (None when it is not a valid index)."""
        s = self.whole[j]
        sel = self.members[s]
        try:
            offs, sizes = entry_spans(index_entries(self.layout, self.url(s), raw, fsize, self.chunk_cap)[self.inner_lin[sel]])
        except CorruptChunkError:
            return None  # (the shard's own bytes say so when it comes)
        ok = sizes >= 0
        order = np.lexsort((offs, np.where(ok, offs + sizes, -1)))  # missing first, then by their ends
        first = int((~ok).sum())
        self.cut[j] = (np.concatenate([sel[order[first:]], sel[order[:first]]]), raw)
        return (sel[order[first:]], offs[order[first:]], sizes[order[first:]], fsize,
                mtime // 10**9 if mtime > 0 else -1, etag)

    def index_came(self, j: int, got: Got | None) -> None:
        """Whole job j's index, fetched beside it: its parts are handed from now on."""
        if got is None or got.size < 0 or len(got.data) != self.index_size or self.parts is None:
            return  # (gone, or shorter than its index: the shard's own answer says what it is)
        made = self.cut_by(j, bytes(got.data), got.size, got.mtime, got.etag)
        if made is not None:
            self.parts.publish(j, *made)

    def from_whole(self, s: int, got: Got, order: np.ndarray | None, raw: bytes | None) -> None:
        """A whole shard: its index from its own bytes, then its pieces (``order``: theirs when
        it had parts, the first ``got.handed`` of them handed already; ``raw``: the index they
        were cut by)."""
        data, url, key = got.data, self.url(s), self.keys[s]
        index = self.whole_index(key, data, got.mtime, got.etag)
        kept = self.source.cached_index(key)  # (kept just now, from these bytes)
        if got.handed and (kept is None or kept[0] != raw):
            raise changed_while_read(url, "its size, Last-Modified and ETag are those of the version whose index cut "
                                          "it, its bytes are not")
        sel = self.members[s] if order is None else order
        offset, nbytes = entry_spans(index[self.inner_lin[sel]])
        self.on_arrived(Arrived(sel, data, offset, nbytes, 0, url, got.mtime, self.namer(url, sel), got.handed))

    def whole_index(self, key: str, data: Any, mtime: int, etag: str) -> np.ndarray:
        """The index entries of a shard fetched whole, from its own bytes (checked, then kept as
        the source's known index of that shard)."""
        size = self.index_size
        raw = bytes(memoryview(data)[max(0, len(data) - size):] if self.layout.index_at_end else memoryview(data)[:size])
        index = index_entries(self.layout, self.source.url_of(key), raw, len(data), self.chunk_cap)
        self.source.keep_index(key, raw, len(data), mtime, etag)
        return index

    def done(self, j: int, got: Got | None) -> None:
        s, sel, offs, sizes, start = self.what[j]
        if j in self.index_of:
            self.index_came(self.index_of[j], got)
            return
        if got is None:  # a whole shard that does not exist
            self.missing(s)
            return
        if start < 0:
            order, raw = self.cut.get(j, (None, None))
            self.from_whole(s, got, order, raw)
            return
        _fs, fsize, mtime, etag = self.known[s]
        if got.size != fsize or got.mtime != mtime or (etag and got.etag and got.etag != etag):
            raise ShardChanged(f"{self.url(s)} changed since its index was fetched")
        self.on_arrived(Arrived(sel, got.data, offs, sizes, start, self.url(s), mtime, self.namer(self.url(s), sel)))

    def send(self, arena: Bodies | None, handoff: Handoff | None, on_sent: Callable[[], None] | None,
             stop: Callable[[], bool] | None) -> None:
        sink = (Sink(handoff, array.array("q", [-1]) * len(self.jobs))
                if handoff is not None and (self.cut or self.index_of) else None)
        self.counts["requests"] += len(self.jobs)
        self.counts["whole_shards"] += len(self.whole)
        self.source.stream(self.jobs, self.done, self.shard_cap, arena, sink, on_sent=on_sent,
                           parts=self.parts if sink is not None else None, stop=stop)

    def forget(self) -> None:
        """Every index this read used, forgotten (fetched again)."""
        for s in self.known:
            self.source.forget_index(self.keys[s])
            self.source.fetched.drop((self.source.url, self.keys[s], "index", self.index_size, self.layout.index_at_end))


def _runs(offs: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """Groups of pieces (positions into ``offs``) fetched by one GET: in offset order, a gap
    of at most ``GAP_BYTES`` between them, at most ``PART_BYTES`` in all (a bigger piece alone)."""
    order = np.argsort(offs, kind="stable")
    out: list[list[int]] = []
    start = end = 0
    for k in order.tolist():
        o, n = int(offs[k]), int(sizes[k])
        if out and o - end <= GAP_BYTES and max(end, o + n) - start <= PART_BYTES:
            out[-1].append(k)
            end = max(end, o + n)
            continue
        out.append([k])
        start, end = o, o + n
    return [np.asarray(g, np.int64) for g in out]


class RemoteReader(OwnThreads):
    """The fetch stage for remote pieces (:class:`~gpu_zarr.engine.sources.files.Reader`), with
    ``requests`` in flight at once. ``pool``: ``copiers`` threads that copy bytes already
    fetched (:class:`RemoteBlob`) into staging, a share each: numpy's copies run without the
    interpreter lock (on the GPU path, the longest stage after the transfer).
    """

    name = "remote"

    def __init__(self, requests: int = 64, pool: Any = None, copiers: int = 1) -> None:
        self.threads = requests
        self._pool = pool if copiers > 1 else None
        self._copiers = max(1, copiers)

    def read(self, files: list[Any], batch: Batch, dest: Any) -> None:
        """Fill ``dest`` (host uint8) with the encoded bytes of every piece of ``batch`` (its
        files are :class:`RemoteBlob`: answers already fetched)."""
        copies: list[tuple[int, Any, int, int]] = []  # staging offset, fetched bytes, offset in them, length
        for f, o, spans in _coalesce(read_tasks(batch, PART_BYTES)):
            obj = files[f]
            if not isinstance(obj, RemoteBlob):
                raise TypeError(f"the remote reader copies fetched answers; got {type(obj).__name__} for {obj}")
            at = o - obj.base
            for d, n in spans:
                if at < 0 or at + n > len(obj.data):
                    raise CorruptChunkError(f"{obj.url}: expected {n} bytes at offset {at + obj.base}, the "
                                            f"object has {len(obj.data) + obj.base}")
                copies.append((d, obj.data, at, n))
                at += n
        _copy(dest, copies, self._pool, self._copiers)


COPY_SHARE = 4 << 20  # bytes one thread copies at least (below that a thread costs more than it saves)


def _copy(dest: Any, copies: list[tuple[int, Any, int, int]], pool: Any, workers: int) -> None:
    """``dest[d:d + n] = data[o:o + n]`` for each copy; on ``workers`` threads of ``pool``
    when there are several shares of ``COPY_SHARE`` bytes."""
    total = sum(c[3] for c in copies)
    shares = max(1, min(workers, total // COPY_SHARE)) if pool is not None else 1
    out = np.frombuffer(memoryview(dest).cast("B"), np.uint8)

    def run(part: list[tuple[int, Any, int, int]]) -> None:
        for d, data, o, n in part:
            out[d:d + n] = np.frombuffer(data, np.uint8, n, o)
    if shares == 1:
        run(copies)
        return
    parts: list[list[tuple[int, Any, int, int]]] = [[] for _ in range(shares)]
    each, k, got = -(-total // shares), 0, 0
    for c in copies:  # in order, cut into shares of about equal bytes (a copy is not split)
        parts[k].append(c)
        got += c[3]
        if got >= each * (k + 1) and k < shares - 1:
            k += 1
    for f in [pool.submit(run, p) for p in parts if p]:
        f.result()


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
