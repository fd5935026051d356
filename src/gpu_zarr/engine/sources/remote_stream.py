"""Locate and fetch stages for remote arrays (:mod:`gpu_zarr.engine.sources.remote` makes the requests).

- :func:`stream_remote` is locate and fetch in one: every object a read needs is requested at
  once and handed on (:class:`Arrived`) as it arrives, so decode overlaps the transfer (the
  CPU's host path decodes each answer; the GPU path takes them in groups). Unsharded chunks are
  GET whole (a 404 is the fill value, as zarr reads it). A shard the read needs at least half
  of (and no bigger than ``WHOLE_SHARD_BYTES`` decoded) is GET whole, its index taken from its
  own bytes: one round trip, no index request (a shard the read needs all of is GET whole
  even when its index is known: one request instead of a ranged GET per part; with a native
  decode set, its inner chunks are handed to it as the shard's bytes pass each one's end, and
  decode while the rest of it arrives). Other shards
  need their index: known from an earlier read of the open array
  (:meth:`RemoteSource.cached_index`), or fetched for all of them in one wave of suffix-range
  GETs; then one ranged GET per run of inner chunks closer than ``GAP_BYTES``
  (cut at ``PART_BYTES``). A ranged answer whose object changed since its index was fetched
  (another size, modification time or etag; or it is gone) is dropped and the shard is read
  again, its index fetched anew.
- :class:`RemoteReader` is the fetch stage's :class:`~gpu_zarr.engine.sources.files.Reader` on the GPU
  path: it copies the answers that arrived (:class:`~gpu_zarr.engine.sources.remote.RemoteBlob`) into
  the same staging buffers as local reads, so decode is unchanged.
"""

from __future__ import annotations

import array
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_zarr.engine.bounds import max_stored_nbytes
from gpu_zarr.engine.layout import Layout
from gpu_zarr.engine.plan import Batch, Pieces
from gpu_zarr.engine.sources.files import read_tasks
from gpu_zarr.engine.sources.http import Handoff, Parts, Sink
from gpu_zarr.engine.sources.locate import Located, check_sizes, expected_chunk, index_entries
from gpu_zarr.engine.sources.remote import Bodies, Got, RemoteBlob, RemoteSource, Span, changed_while_read
from gpu_zarr.errors import CorruptChunkError, ShardChanged

__all__ = ["GAP_BYTES", "PART_BYTES", "WHOLE_SHARD_BYTES", "Arrived", "RemoteReader", "stream_remote", "whole_cap"]

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
    size, Last-Modified and ETag). ``on_sent()``: see
    :meth:`RemoteSource.stream` (the chunks' requests; a sharded read's after its indexes).
    ``stop()``: asked while the answers travel; true stops them (ReadCancelled).

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
    source.stream([(keys[i], None) for i in todo], done, whole_cap(layout), arena, sink, on_sent, stop=stop,
                  expected=expected_chunk(layout))
    return counts


def _stream_shards(layout: Layout, pieces: Pieces, source: RemoteSource, on_arrived: Callable[[Arrived], None],
                   counts: dict[str, int], arena: Bodies | None,
                   on_sent: Callable[[], None] | None = None, handoff: Handoff | None = None,
                   stop: Callable[[], bool] | None = None) -> dict[str, int]:
    per = np.asarray(layout.inner_per_shard, np.int64)
    shard_coords, inner_coords = pieces.coords // per, pieces.coords % per
    inner_lin = np.asarray(np.ravel_multi_index(inner_coords.T, tuple(per)), np.int64)
    uniq, shard_of = np.unique(shard_coords, axis=0, return_inverse=True)
    shard_of = shard_of.reshape(-1)
    keys = [layout.chunk_key(tuple(c)) for c in uniq.tolist()]
    n_inner = int(np.prod(layout.inner_per_shard))
    index_size = n_inner * 16 + (4 if layout.index_crc else 0)
    order = np.argsort(shard_of, kind="stable")  # each shard's pieces, in one sort (not a pass per shard)
    bounds = np.searchsorted(shard_of[order], np.arange(len(keys) + 1))
    members = [order[bounds[s]:bounds[s + 1]] for s in range(len(keys))]
    whole_ok = n_inner * int(layout.inner_nbytes) <= WHOLE_SHARD_BYTES
    chunk_cap = whole_cap(layout)  # no index entry may claim more (checked before a range is asked for)
    shard_cap = n_inner * chunk_cap + index_size

    def _namer(url: str, sel: np.ndarray) -> Callable[[int], str]:
        return lambda j: f"{url} inner chunk {tuple(int(v) for v in inner_coords[int(sel[j])])}"

    def name_of(s: int) -> Callable[[int], str]:
        return _namer(source.url_of(keys[s]), members[s])

    def missing(s: int) -> None:
        sel = members[s]
        on_arrived(Arrived(sel, None, np.zeros(len(sel), np.int64), np.full(len(sel), -1, np.int64), 0,
                           source.url_of(keys[s]), -1, name_of(s)))

    def from_whole(s: int, got: Got, order: np.ndarray | None, raw: bytes | None) -> None:
        """A whole shard: its index from its own bytes, then its pieces (``order``: theirs when
        it had parts, the first ``got.handed`` of them handed already; ``raw``: the index they
        were cut by)."""
        data = got.data
        url = source.url_of(keys[s])
        index = _whole_shard_index(layout, source, keys[s], data, got.mtime, got.etag)
        kept = source.cached_index(keys[s])  # (kept just now, from these bytes)
        if got.handed and (kept is None or kept[0] != raw):
            raise changed_while_read(url, "its size, Last-Modified and ETag are those of the version whose index cut "
                                          "it, its bytes are not")
        sel = members[s] if order is None else order
        entries = index[inner_lin[sel]]
        ok = entries[:, 0] != np.uint64(2**64 - 1)
        offset = np.where(ok, entries[:, 0], 0).astype(np.int64)
        nbytes = np.where(ok, entries[:, 1], 0).astype(np.int64)
        nbytes[~ok] = -1
        on_arrived(Arrived(sel, data, offset, nbytes, 0, url, got.mtime, _namer(url, sel), got.handed))

    # which shards come whole, which by ranges (their indexes known or fetched in one wave)
    whole: list[int] = []
    known: dict[int, tuple[np.ndarray, int, int, str]] = {}
    need: list[int] = []
    for s in range(len(keys)):
        idx = source.cached_index(keys[s])
        if whole_ok and len(members[s]) == n_inner:  # all of it: one GET, even with its index known
            whole.append(s)
        elif idx is not None and len(idx[0]) == index_size:
            known[s] = (index_entries(layout, source.url_of(keys[s]), idx[0], idx[1], chunk_cap), idx[1], idx[2],
                        idx[3])
        elif whole_ok and 2 * len(members[s]) >= n_inner:
            whole.append(s)
        else:
            need.append(s)
    if need:
        counts["index_requests"] += len(need)
        found = source.get_indexes([keys[s] for s in need], index_size, layout.index_at_end, shard_cap, stop)
        for s, f in zip(need, found):
            if f is None:
                missing(s)
                continue
            raw, fsize, mtime = f
            cached = source.cached_index(keys[s])
            known[s] = (index_entries(layout, source.url_of(keys[s]), raw, fsize, chunk_cap), fsize, mtime,
                        cached[3] if cached is not None else "")

    jobs: list[tuple[str, Span]] = []
    what: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, int]] = []  # shard, pieces, offsets, sizes, start
    for s in whole:
        jobs.append((keys[s], None))
        what.append((s, members[s], np.zeros(0, np.int64), np.zeros(0, np.int64), -1))
    for s, (index, _fsize, _mtime, _etag) in known.items():
        sel = members[s]
        entries = index[inner_lin[sel]]
        ok = entries[:, 0] != np.uint64(2**64 - 1)
        if not ok.all():
            miss = sel[~ok]
            on_arrived(Arrived(miss, None, np.zeros(len(miss), np.int64), np.full(len(miss), -1, np.int64), 0,
                               source.url_of(keys[s]), _mtime, _namer(source.url_of(keys[s]), miss)))
        sel = sel[ok]
        offs, sizes = entries[ok, 0].astype(np.int64), entries[ok, 1].astype(np.int64)
        for a in _runs(offs, sizes):
            start, end = int(offs[a].min()), int((offs[a] + sizes[a]).max())
            jobs.append((keys[s], (start, end)))
            what.append((s, sel[a], offs[a] - start, sizes[a], start))

    # whole shards: their inner chunks go to the read's decode set as the shard's bytes pass
    # each one's end (the set opens while the requests travel). Their index known, from the
    # start; else it is fetched beside the shard, in the same wave (a suffix GET: the same round
    # trip), and the bytes that come after it hand them (native HTTP only: obstore's answers
    # come whole)
    cold = [j for j, s in enumerate(whole) if source.cached_index(keys[s]) is None] \
        if handoff is not None and getattr(source, "http", None) is not None else []
    index_of: dict[int, int] = {}  # an index job -> its shard's whole job
    for j in cold:
        index_of[len(jobs)] = j
        jobs.append((keys[whole[j]], {"suffix": index_size} if layout.index_at_end else (0, index_size)))
        what.append((whole[j], members[whole[j]], np.zeros(0, np.int64), np.zeros(0, np.int64), -2))
    counts["index_requests"] += len(cold)
    cut: dict[int, tuple[np.ndarray, bytes]] = {}  # per such job: its pieces' order, the index that cut them
    parts = Parts(len(jobs), late=bool(cold)) if handoff is not None and whole else None

    def cut_by(j: int, raw: bytes, fsize: int, mtime: int, etag: str) -> tuple[Any, ...] | None:
        """Whole job j's parts by the index ``raw``, as :meth:`Parts.set` takes them after j
        (None when it is not a valid index)."""
        s = whole[j]
        sel = members[s]
        try:
            entries = index_entries(layout, source.url_of(keys[s]), raw, fsize, chunk_cap)[inner_lin[sel]]
        except CorruptChunkError:
            return None  # (the shard's own bytes say so when it comes)
        ok = entries[:, 0] != np.uint64(2**64 - 1)
        offs, sizes = entries[:, 0].astype(np.int64), entries[:, 1].astype(np.int64)
        order = np.lexsort((offs, np.where(ok, offs + sizes, -1)))  # missing first, then by their ends
        first = int((~ok).sum())
        cut[j] = (np.concatenate([sel[order[first:]], sel[order[:first]]]), raw)
        return (sel[order[first:]], offs[order[first:]], sizes[order[first:]], fsize,
                mtime // 10**9 if mtime > 0 else -1, etag)

    for j, s in enumerate(whole if parts is not None else ()):
        got_idx = source.cached_index(keys[s])
        if got_idx is None or len(got_idx[0]) != index_size:
            continue
        made = cut_by(j, *got_idx)
        if made is not None:
            assert parts is not None
            parts.set(j, *made)
    sink = Sink(handoff, array.array("q", [-1]) * len(jobs)) if handoff is not None and (cut or cold) else None

    def index_came(j: int, got: Got | None) -> None:
        """Whole job j's index, fetched beside it: its parts are handed from now on."""
        if got is None or got.size < 0 or len(got.data) != index_size or parts is None:
            return  # (gone, or shorter than its index: the shard's own answer says what it is)
        made = cut_by(j, bytes(got.data), got.size, got.mtime, got.etag)
        if made is not None:
            parts.publish(j, *made)

    def done(j: int, got: Got | None) -> None:
        s, sel, offs, sizes, start = what[j]
        if j in index_of:
            index_came(index_of[j], got)
            return
        if got is None:  # a whole shard that does not exist
            missing(s)
            return
        if start < 0:
            order, raw = cut.get(j, (None, None))
            from_whole(s, got, order, raw)
            return
        _fs, _fsize, mtime, etag = known[s]
        if got.size != _fsize or got.mtime != mtime or (etag and got.etag and got.etag != etag):
            raise ShardChanged(f"{source.url_of(keys[s])} changed since its index was fetched")
        on_arrived(Arrived(sel, got.data, offs, sizes, start, source.url_of(keys[s]), mtime,
                           _namer(source.url_of(keys[s]), sel)))

    counts["requests"] += len(jobs)
    counts["whole_shards"] += len(whole)
    try:
        source.stream(jobs, done, shard_cap, arena, sink, on_sent=on_sent, parts=parts if sink is not None else None,
                      stop=stop)
    except ShardChanged:
        # a shard changed since its index was fetched: nothing of it was handed on. Forget every
        # index of this read and read again (pieces of unchanged shards are placed twice, alike)
        for s in known:
            source.forget_index(keys[s])
            source.fetched.drop((source.url, keys[s], "index", index_size, layout.index_at_end))  # fetched again
        counts["stale"] = counts.get("stale", 0) + 1
        if counts["stale"] > 2:
            raise CorruptChunkError(f"the shards of {source.url} keep changing while read; try again later") from None
        # (on_sent ran, or no job was sent; no parts: what was handed is not handed again)
        return _stream_shards(layout, pieces, source, on_arrived, counts, arena, stop=stop)
    return counts


def _whole_shard_index(layout: Layout, source: RemoteSource, key: str, data: Any, mtime: int, etag: str) -> np.ndarray:
    """The index entries of a shard fetched whole (taken from its own bytes, and kept as the
    source's known index of that shard)."""
    n_inner = int(np.prod(layout.inner_per_shard))
    size = n_inner * 16 + (4 if layout.index_crc else 0)
    url = source.url_of(key)
    if len(data) < size:
        raise CorruptChunkError(f"shard {url} has {len(data)} bytes, fewer than its index alone ({size} bytes for "
                                f"{n_inner} inner chunks): the shard is truncated. Rewrite or delete it.")
    raw = bytes(memoryview(data)[len(data) - size:] if layout.index_at_end else memoryview(data)[:size])
    index = index_entries(layout, url, raw, len(data), whole_cap(layout))  # checked before it is kept
    source.keep_index(key, raw, len(data), mtime, etag)
    return index


def whole_cap(layout: Layout) -> int:
    """The most encoded bytes a whole chunk may have: its codec's worst case for its decoded
    size (a body past this is a CorruptChunkError naming it, nothing past it read)."""
    return max_stored_nbytes(layout)


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


class RemoteReader:
    """The fetch stage for remote pieces (:class:`~gpu_zarr.engine.sources.files.Reader`).

    Parameters
    ----------
    requests : int
        Requests in flight at once.
    pool : executor, optional
        ``copiers`` threads that copy bytes already fetched (:class:`RemoteBlob`) into staging,
        a share each: numpy's copies run without the interpreter lock (one thread copied 81 MiB
        in 12.7 ms on the H200 machine, the GPU path's longest stage after the transfer).
    copiers : int
        Threads of ``pool``.
    """

    name = "remote"

    def __init__(self, requests: int = 64, pool: Any = None, copiers: int = 1) -> None:
        self.threads = requests
        self._pool = pool if copiers > 1 else None
        self._copiers = max(1, copiers)

    def session(self) -> AbstractContextManager[None]:
        """Nothing to scope: the client's settings belong to its store."""
        return nullcontext()

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

    def close(self) -> None:
        pass


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
