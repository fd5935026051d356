"""A remote array's pieces as a :class:`~gpu_zarr.engine.feed.Feed`: the batches of answers
as they arrive, for the scheduler.

:func:`~gpu_zarr.engine.sources.remote_stream.stream_remote` requests every object at once
(on a thread of its own; a small read's on the reading thread) and hands each answer on as
it arrives; the feed makes whatever has arrived -- once ``GROUP_BYTES`` of it is in on the
GPU (a decode call costs about the same whatever it holds), anything on the CPU, or all -- into the
next batches, which the scheduler copies into staging (or decodes where they landed: one
arena block), uploads, decodes and places while the rest are still on the way. On the CPU
with the native library, a small or sharded read's answers go to a native decode set
instead, decoded and placed the moment each is in (the native HTTP client hands whole chunks
to it with no Python between); what the set does not decode comes back as the feed's last
batches. Missing pieces are filled and cached ones placed at the end (:meth:`RemoteFeed.finish`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import replace
from typing import Any

import numpy as np

from gpu_zarr import settings
from gpu_zarr.engine.bounds import max_stored_nbytes
from gpu_zarr.engine.codecs import CodecStage
from gpu_zarr.engine.feed import Feed, check_cancel, keeper
from gpu_zarr.engine.layout import Layout
from gpu_zarr.engine.ops import Ops
from gpu_zarr.engine.options import EngineOptions
from gpu_zarr.engine.plan import Batch, LazyNames, Pieces, make_batches
from gpu_zarr.engine.runtime import Runtime
from gpu_zarr.engine.sources.locate import Located, check_sizes
from gpu_zarr.errors import CorruptChunkError, ReadCancelled

__all__ = ["ARENA_PIECES", "GROUP_BYTES", "SMALL_PIECES", "RemoteFeed", "arena_for"]

#: remote reads of more pieces than this land in a :class:`~gpu_zarr.engine.sources.remote.BodyArena`
#: (reused buffers; a viewer's few chunks get buffers of their own and go to the byte cache)
ARENA_PIECES = 64
#: a read of at most this many pieces fetches on the reading thread, then decodes
SMALL_PIECES = 16
GROUP_BYTES = 8 << 20  # encoded bytes that start a device decode while more answers are on the way
# a batch of arriving answers: the answers of a whole read tend to come together at the end of
# the transfer, and a device decode call costs the same whatever it holds
FEED_BATCH_BYTES = 128 << 20
CORES = os.cpu_count() or 2
_MISSING, _DECODED = object(), object()  # what a piece's last answer said (else: its cached chunk)


def arena_for(rt: Runtime, pieces: int, ops: Ops | None = None) -> Any:
    """Where a remote read of ``pieces`` pieces lands its answers: a body arena (of ``ops``'s
    staging memory when it uploads: pinned on the GPU, where the batches are uploaded from
    the answers themselves), or (a viewer's few chunks, which go to the byte cache) the
    runtime's recycled memory."""
    if pieces <= ARENA_PIECES:
        return contextlib.nullcontext(rt.recycled)
    from gpu_zarr.engine.sources.remote import BodyArena

    uploads = ops is not None and not ops.host_is_device
    return BodyArena(rt.host_scratch, settings.get("pinned_bytes") // 4,
                     (lambda n: ops.host_buffers(n, 1)) if uploads and ops is not None else None)


def _one_home(items: list[tuple[np.ndarray, Any]], arena: Any = None) -> tuple[np.ndarray, np.ndarray] | None:
    """Where the pieces of ``items`` (positions in an answer, the answer) lie when every answer
    is a view of one buffer (an arena block; one of ``arena``'s when given): that buffer and
    each piece's offset in it, in ``items``' order; else None (they are copied first)."""
    home = None
    for _, a in items:
        d = a.data
        if not isinstance(d, np.ndarray) or d.base is None or (home is not None and d.base is not home):
            return None
        if arena is not None and not arena.holds(d):
            return None
        home = d.base
    ok = isinstance(home, np.ndarray) and home.ndim == 1 and home.dtype == np.uint8 and home.flags.c_contiguous
    if not ok:
        return None
    assert home is not None
    at = home.ctypes.data
    return home, np.concatenate([a.offset[pos] + (a.data.ctypes.data - at) for pos, a in items]).astype(np.int64)


class RemoteFeed:
    """The pieces of one remote read, fetched and fed to the scheduler as they arrive.

    Use: ``start()`` (the requests leave), run :attr:`feed` with :attr:`located`,
    :attr:`reader`, :attr:`keep` and the sizes :attr:`nslots`, :attr:`cap`, :attr:`per`,
    then :meth:`finish`; :meth:`close` (also on an error) before ``arena`` goes: nothing is
    left writing into it then.
    """

    def __init__(self, lay: Layout, stage: CodecStage, pieces: Pieces, out: Any, ops: Ops, rt: Runtime,
                 opts: EngineOptions, cache: Any, batch: int, arena: Any) -> None:
        from gpu_zarr.engine.sources.remote import RemoteBlob, remote_source
        from gpu_zarr.engine.sources.remote_stream import RemoteReader

        assert lay.source is not None
        self._blob = RemoteBlob  # (an answer's bytes as a "file" of the batches)
        self.source = remote_source(rt, lay)  # the live source of the read: its requests, its caches
        self.lay, self.stage, self.pieces, self.out, self.ops, self.rt, self.opts = lay, stage, pieces, out, ops, rt, opts
        self.cache, self.arena = cache, arena
        n = len(pieces)
        self.small = n <= SMALL_PIECES
        self.files: list[Any] = []
        self.file_id = np.full(n, -1, np.int64)
        self.offset = np.zeros(n, np.int64)
        self.nbytes = np.full(n, -1, np.int64)
        self.whose: list[Any] = [None] * n  # per piece (its answer, its position there): names for messages
        self.keys: list[Any] = [None] * n
        self.keep = keeper(self.keys, pieces, cache, opts.cache)
        # what each piece's last answer said: missing (the fill value), cached (the chunk), or decoded
        # (a shard that changed while read is read again, and the second answer wins)
        self.last: dict[int, Any] = {}
        # staging per slot: FEED_BATCH_BYTES on the device (a group that came at once is one decode
        # call), or the biggest chunk a codec can make; no more than the read can need
        self.whole = max_stored_nbytes(lay)
        most = max(1, n) * self.whole
        self.cap = min(max(min(batch, FEED_BATCH_BYTES), self.whole), most)
        self.per = max(1, min(n, self.cap // max(1, int(lay.inner_nbytes))))
        self.nslots = min(max(1, opts.slots), -(-most // self.cap))
        # batches decoded (the CPU) or uploaded (pinned on the GPU) from the arena where they landed
        self.homes = (stage.decodes or ops.host_is_device) and hasattr(arena, "holds")
        self.group_bytes = 0 if ops.host_is_device else GROUP_BYTES
        self.located = Located(self.files, self.file_id, self.offset, self.nbytes, LazyNames(n, self.name),
                               np.zeros(0, np.int64))
        copiers = min(8, CORES)  # the fetch stage: copies of the answers' pieces into a slot
        self.reader = RemoteReader(self.source.requests, rt.pool("remote-copy", copiers), copiers)
        self.cond = threading.Condition()
        self.queue: list[Any] = []
        self.queued = 0  # encoded bytes queued since the last group
        self.done = self.stopped = False
        self.error: BaseException | None = None
        self.counts: dict[str, int] = {}
        self.groups = 0
        self.fetch_s = 0.0
        self.thread: threading.Thread | None = None
        self.set: _NativeSet | None = None
        self._ready = False
        self.set_stats: dict[str, int] = {}  # the native set's counts
        self.feed = Feed(more=self.more, stop=self.stop)

    # -- the requests --------------------------------------------------------------------------
    def start(self) -> None:
        """The requests leave. A small read's run here, to their end; a bigger one's on a thread
        of its own while the scheduler decodes what has arrived."""
        import gpu_zarr.engine.native.chunkwise as chunkwise
        from gpu_zarr.engine.sources.http import Handoff

        self.t0 = time.perf_counter()
        # a viewer's few chunks, and a sharded read's inner chunks, decoded on native threads
        # the moment each is in (the native HTTP client hands whole chunks over itself)
        if (self.ops.host_is_device and (self.small or self.lay.sharded) and self.stage.native is not None
                and chunkwise.serves(self.lay, self.out)):
            self.set = _NativeSet(self, Handoff())
        if self.small:
            self.fetch_all()
            return
        self.thread = threading.Thread(target=self.fetch_all, name="gpu-zarr-remote-stream", daemon=True)
        self.thread.start()

    def ready(self) -> None:
        """What the answers need, once, while the requests travel (the fetch's ``on_sent``; else
        the first answer, or the end): the native decode set, then the caller's ``opts.on_sent``."""
        if self._ready:
            return
        self._ready = True
        if self.set is not None:
            self.set.open()
        if self.opts.on_sent is not None:
            self.opts.on_sent()

    def fetch_all(self) -> None:
        from gpu_zarr.engine.sources.remote_stream import stream_remote

        cancel = self.opts.cancel  # asked while the answers travel
        try:
            self.counts = stream_remote(self.lay, self.pieces, self.source, self.arrived, self.arena,
                                        self.set.handoff if self.set is not None else None, self.ready,
                                        None if cancel is None else (lambda: bool(cancel.is_set())))
            self.ready()  # (nothing was requested: every piece was known)
        except BaseException as exc:  # noqa: BLE001 - handed to the scheduler, which raises it
            self.error = exc
        finally:
            with self.cond:
                self.done = True
                self.fetch_s = time.perf_counter() - self.t0
                self.cond.notify_all()

    def arrived(self, a: Any) -> None:
        """An answer is in (on the event loop's thread, or the fetching one): hand it on."""
        self.ready()  # (answers already known, or obstore's: before any on_sent)
        with self.cond:
            if self.stopped:  # the read failed: raising here cancels the requests still in flight
                raise ReadCancelled("the read failed: its remaining requests were cancelled")
        if self.set is not None:
            self.set.arrived(a)
            return
        with self.cond:
            self.queue.append(a)
            self.queued += int(a.nbytes[a.nbytes > 0].sum())
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    # -- the feed --------------------------------------------------------------------------------
    def _wait(self) -> tuple[list[Any], bool]:
        """The answers queued once a group's worth is in (or all); True once the fetch is done."""
        with self.cond:
            while not (self.done or self.stopped or (self.queue and self.queued >= self.group_bytes)):
                self.cond.wait(0.05)
                check_cancel(self.opts)
            took, self.queue = self.queue, []
            self.queued = 0
            finished, error, stopped = self.done, self.error, self.stopped
        if error is not None:
            raise error
        if stopped:
            raise ReadCancelled("the read failed: its remaining requests were cancelled")
        return took, finished

    def more(self) -> tuple[list[Batch], bool]:
        """The next group's batches (waits for answers); True once there are no more."""
        check_cancel(self.opts)
        took, finished = self._wait()
        sel: list[int] = []
        for a in took:
            sel += self.take(a, range(len(a.pieces)))
        if finished and self.set is not None:  # what the native set did not decode, last
            for a, j in self.set.close():
                sel += self.take(a, (j,), look=False)
            self.set = None
        return self.batches(sel), finished

    def take(self, a: Any, positions: Any, look: bool = True) -> list[int]:
        """Record answer ``a``'s pieces at ``positions``; return those to decode (not missing, not
        cached; ``look``: ask the cache)."""
        sel = []
        fid = len(self.files)
        self.files.append(self._blob(a.url, a.data if a.data is not None else b"", a.base))
        for j in positions:
            p, nb = int(a.pieces[j]), int(a.nbytes[j])
            if nb < 0:
                self.last[p] = _MISSING
                continue
            at = a.base + int(a.offset[j])
            self.keys[p], self.whose[p] = (a.url, at, nb, a.mtime), (a, j)
            chunk = self.cache.get(self.keys[p]) if self.cache is not None and look else None
            if chunk is not None:
                self.last[p] = chunk
                continue
            self.last[p] = _DECODED
            if nb > self.cap:
                raise CorruptChunkError(f"chunk {a.names(j)} has {nb} encoded bytes; a chunk of "
                                        f"{self.lay.inner_nbytes} bytes takes at most {self.whole} with any codec. "
                                        "It is corrupt; rewrite or delete it.")
            self.file_id[p], self.offset[p], self.nbytes[p] = fid, at, nb
            sel.append(p)
        return sel

    def batches(self, sel: list[int]) -> list[Batch]:
        if not sel:
            return []
        idx = np.asarray(sel, np.int64)
        check_sizes(self.lay, Located(self.files, self.file_id[idx], self.offset[idx], self.nbytes[idx],
                                      LazyNames(len(idx), lambda k: self.name(int(idx[k]))),
                                      np.zeros(len(self.files), np.int64)))
        # room for what lies between the pieces in their answers (shard indexes, alignment):
        # a batch is decoded or uploaded from there as one span
        made = make_batches(self.file_id[idx], self.offset[idx], self.nbytes[idx], self.lay.inner_nbytes,
                            self.cap - self.cap // 8 if self.homes else self.cap)
        self.groups += 1
        return [self.at_home(replace(b, pieces=idx[b.pieces])) if self.homes else replace(b, pieces=idx[b.pieces])
                for b in made]

    def at_home(self, b: Batch) -> Batch:
        """``b`` decoded or uploaded from where its answers landed: every piece in one arena
        block (each answer is a view of it), within ``cap`` bytes; else ``b`` (copied to staging)."""
        answers: dict[int, tuple[Any, list[int], list[int]]] = {}  # per answer: it, its positions, batch slots
        for k, p in enumerate(b.pieces.tolist()):
            a, j = self.whose[p]
            got = answers.setdefault(id(a), (a, [], []))
            got[1].append(j)
            got[2].append(k)
        landed = _one_home([(np.asarray(pos, np.int64), a) for a, pos, _ in answers.values()], self.arena)
        if landed is None:
            return b
        owner = landed[0]
        starts = np.empty(len(b.pieces), np.int64)  # back in the batch's order
        starts[np.concatenate([np.asarray(ks, np.int64) for _, _, ks in answers.values()])] = landed[1]
        lo, hi = int(starts.min()), int((starts + b.src_sizes).max())
        if hi - lo > self.cap:
            return b
        return replace(b, src_offsets=starts - lo, staging_bytes=hi - lo, home=owner[lo:hi])

    def name(self, k: int) -> str:
        a, j = self.whose[k]
        return str(a.names(j))

    # -- the end ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop and wait for the requests and the native set (also on an error): nothing
        writes into the arena or the output after this."""
        if self.thread is not None:
            if self.error is None and not self.done:
                self.stop()
            self.thread.join()
        if self.set is not None:
            self.set.abandon()
            self.set = None

    def finish(self, stats: dict[str, Any]) -> None:
        """Fill the missing pieces, place the cached ones, hand the kept chunks to the cache."""
        ops, lay, out, pieces = self.ops, self.lay, self.out, self.pieces
        if self.error is not None:
            raise self.error
        missing = [p for p, v in self.last.items() if v is _MISSING]
        cached = [(p, v) for p, v in self.last.items() if v is not _MISSING and v is not _DECODED]
        if missing:
            ops.fill(out, pieces.table[np.asarray(missing, np.int64)], lay.fill_value)
        if cached:  # (held until the sync: an eviction meanwhile must not free memory a kernel reads)
            ops.place_chunks([c for _, c in cached], pieces.table[[p for p, _ in cached]], out, lay.disk_dtype,
                             lay.transpose)
        ops.sync()
        if self.keep is not None and self.cache is not None:  # only now: every stream is done with them
            for key, chunk in self.keep.chunks:
                self.cache.put(key, chunk)
        if self.opts.progress is not None:
            total = int(np.prod(out.shape, dtype=np.int64)) * out.dtype.itemsize
            self.opts.progress(total, total)
        got = self.nbytes[self.nbytes >= 0]
        stats.update(self.counts, groups=self.groups, batches=len(self.feed), fetch_s=self.fetch_s,
                     pieces=len(pieces), missing=len(missing), cache_hits=len(cached), codec=lay.codec,
                     encoded_bytes=int(got.sum()), decoded_bytes=int(np.prod(out.shape, dtype=np.int64)) *
                     out.dtype.itemsize,
                     reader=f"remote ({self.source.requests} requests in flight, decoded as they arrive)")
        stats.update(self.set_stats)


class _NativeSet:
    """A native decode set (:class:`~gpu_zarr.engine.native.Arrivals`) that decodes and
    places a remote read's answers on native threads as they arrive: one worker per core, at
    most one per piece; a Blosc chunk's blocks by up to 8 workers, leaving a core to the rest
    of the machine (the server sending the other answers may share it)."""

    def __init__(self, feed: RemoteFeed, handoff: Any) -> None:
        self.feed, self.handoff = feed, handoff
        self.arrivals: Any = None
        self.added: dict[int, tuple[Any, int]] = {}
        self.in_set = np.zeros(len(feed.pieces), bool)  # the pieces added (a shard read again: not twice)
        self.handed = 0  # answers the native HTTP client handed to the set itself

    def open(self) -> None:
        import gpu_zarr.engine.native as native
        import gpu_zarr.engine.native.chunkwise as chunkwise

        f = self.feed
        codec = chunkwise.native_codec(f.lay.codec)
        assert codec is not None
        n, inner = len(f.pieces), int(f.lay.inner_nbytes)
        split = max(1, min(8, CORES - 1)) if codec == "blosc" else 1
        threads = max(1, min(CORES, max(n, split)))
        keep_bufs = None
        if f.keep is not None and f.stage.decodes:
            keep_bufs = [f.rt.recycled.empty(inner) if f.keep.wants(k) else None for k in range(n)]
        scratch = f.rt.recycled.empty(max(1, min(threads, n) * inner))
        self.arrivals = native.Arrivals(codec, n, inner, f.pieces.table, f.out, f.lay.disk_dtype, f.lay.transpose,
                                        threads, scratch, keep_bufs, split)
        self.handoff.cell[0] = self.arrivals.handle  # from now on complete answers go to the set natively

    def arrived(self, a: Any) -> None:
        """Answer ``a``: its first ``a.handed`` pieces are in the set already; the rest are added
        (missing and cached ones recorded by the feed)."""
        f, k = self.feed, a.handed
        for j in range(k):
            p = int(a.pieces[j])
            f.keys[p], f.whose[p] = (a.url, a.base + int(a.offset[j]), int(a.nbytes[j]), a.mtime), (a, j)
            f.last[p] = _DECODED
            self.added[p] = (a, j)
        self.in_set[a.pieces[:k]] = True
        self.handed += k
        rest = [j for j in range(k, len(a.pieces)) if not self.in_set[int(a.pieces[j])]]
        todo = f.take(a, rest) if rest else []
        if todo:
            data = a.data if isinstance(a.data, np.ndarray) else np.frombuffer(a.data, np.uint8)
            pos = np.array([f.whose[p][1] for p in todo], np.int64)
            if int((a.offset[pos] + a.nbytes[pos]).max()) > len(data):
                raise CorruptChunkError(f"chunk {a.names(int(pos[0]))}: its index points past the end of the object")
            for p, j in zip(todo, pos.tolist()):
                self.in_set[p] = True
                self.added[p] = (a, j)
                self.arrivals.add(p, data, int(a.offset[j]), int(a.nbytes[j]))

    def close(self) -> list[tuple[Any, int]]:
        """Wait for the decodes; hand wanted chunks to the cache's keeper. Returns the
        (answer, position) of the pieces the library does not decode; raises on a corrupt one."""
        import gpu_zarr.engine.native as native
        import gpu_zarr.engine.native.chunkwise as chunkwise

        f = self.feed
        if self.arrivals is None:
            return []
        keep_bufs = self.arrivals.keep
        st, det = self.arrivals.close()
        self.arrivals = None
        left = []
        for p, (a, j) in sorted(self.added.items()):
            code = int(st[p])
            if code == native.OK:
                if keep_bufs is not None and keep_bufs[p] is not None:
                    assert f.keep is not None
                    f.keep(p, keep_bufs[p])
            elif code in native.UNSUPPORTED:
                left.append((a, j))
            else:
                raise chunkwise.decode_failed(f.lay.codec, a.names(j), code, int(det[p]))
        f.set_stats = {"decoded_on_arrival": len(self.added) - len(left), "handed_natively": self.handed}
        return left

    def abandon(self) -> None:
        """Close the set after an error: its workers are done before any buffer they use goes."""
        if self.arrivals is not None:
            self.arrivals.close()
            self.arrivals = None
