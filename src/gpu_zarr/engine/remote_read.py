"""Reading a remote array's pieces: the CPU's stream path that decodes answers as they
arrive (:func:`run_remote_stream`), and the GPU path that feeds arriving answers to the
batch pipeline in groups (:func:`run_remote_groups`)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

import gpu_zarr.engine.native.chunkwise as native_read
from gpu_zarr import settings
from gpu_zarr.engine.batches import Feed, Keep, decoded_stride, needs_host_check, run_feed
from gpu_zarr.engine.binary import packed_offsets
from gpu_zarr.engine.codecs import CodecStage
from gpu_zarr.engine.fit import nbytes_of
from gpu_zarr.engine.layout import Layout
from gpu_zarr.engine.native import available as native_available
from gpu_zarr.engine.ops import CpuOps, Ops
from gpu_zarr.engine.options import EngineOptions
from gpu_zarr.engine.plan import Batch, LazyNames, Pieces, make_batches
from gpu_zarr.engine.runtime import Runtime, host_empty
from gpu_zarr.engine.sources.http import Handoff
from gpu_zarr.engine.sources.locate import Located, check_sizes
from gpu_zarr.errors import CorruptChunkError, ReadCancelled

__all__ = ["ARENA_PIECES", "FEED_BATCH_BYTES", "GROUP_BYTES", "SMALL_PIECES", "arena_for", "remote_reader",
           "run_remote_groups", "run_remote_stream"]


#: remote reads of more pieces than this land in a :class:`~gpu_zarr.engine.sources.remote.BodyArena`
#: (reused buffers; a viewer's few chunks get buffers of their own and go to the byte cache)
ARENA_PIECES = 64
SMALL_PIECES = 16
CORES = os.cpu_count() or 2  # (asked once: ~0.08 ms of every plane's time before its requests left, cold)


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


def run_remote_stream(lay: Layout, stage: CodecStage, pieces: Pieces, new_out: Callable[[], Any], ops: Ops,
                      rt: Runtime, opts: EngineOptions, stats: dict[str, Any], cache: Any) -> tuple[Any, Keep | None]:
    """The CPU's host path for a remote array: :func:`~gpu_zarr.engine.sources.remote_stream.stream_remote`
    requests every object at once and hands each answer on as it arrives; answers queue up,
    and a few drain tasks on the decode pool take whatever has arrived: missing pieces
    filled, cached ones placed, the rest decoded with one native call (where they landed when
    one arena block holds them all, else packed into one staging buffer first) and placed with
    another (no Python per chunk: with hundreds of small answers the interpreter, not the
    decoder, was the limit); that call gets the cores shared among the drains decoding then.

    The requests leave first: what the answers need -- the output (``new_out()``), the
    decode pool, a small read's native decode set -- is set up while they travel (the
    fetch's ``on_sent``; else at the first answer, or at the end when none came), then the
    caller's ``opts.on_sent``. Returns
    the output and the chunk cache's keeper (its chunks go to the cache once the read is done)."""
    from gpu_zarr.engine.sources.remote import remote_source
    from gpu_zarr.engine.sources.remote_stream import Arrived, stream_remote  # (asyncio and obstore's side: lazily)

    assert lay.source is not None
    cores = CORES
    drains = max(2, min(4, opts.threads, cores))
    small = len(pieces) <= SMALL_PIECES
    # a viewer's few chunks: each decoded and placed on a native thread the moment its answer is
    # in (no Python thread between), else (no native decoder) all decoded at once when all are in.
    # Once the set is open the native HTTP client hands each whole chunk to it the moment the
    # answer is in (its Python comes after, while the set decodes). The set is opened while the
    # requests travel: on a pool thread (before the native call) it took the CPU from the
    # sending on 2 cores, and at the first answer it held that answer's decode up.
    # A sharded read's pieces go to such a set too: the inner chunks of a whole shard whose
    # index is known are handed to it as the shard's bytes arrive (before, a shard was decoded
    # once all of it was in, and the answers of a whole read come together at its end)
    handoff = Handoff() if (small or lay.sharded) and stage.native is not None else None  # (its native codec)
    lock = threading.Lock()
    queue: list[Arrived] = []
    futures: list[Any] = []
    running = [0]
    busy = [0]  # drains decoding a take now
    hits = [0]
    spent = [0.0, 0.0, 0.0]  # copy, decode, place: seconds summed over the drains
    keys: list[Any] = [None] * len(pieces)
    native: list[Any] = []  # the set, once opened
    added: dict[int, tuple[Arrived, int]] = {}
    in_set = np.zeros(len(pieces), bool)  # the pieces in `added` (a read again after a shard changed skips them)
    handed = [0]  # answers the native HTTP client handed to the set itself
    # set up by ready(), while the requests travel
    out: Any = None
    keep: Keep | None = None
    pool: Any = None
    one_ops: Any = None
    check = on_arrival = False
    stride = 0

    def ops_for(share: int) -> Any:  # (kept by the runtime: made once, not per read; keyed by the library's state)
        return rt.resource(("remote-decode-ops", share, native_available()),
                           lambda: CpuOps(fast=True, runtime=rt, native_threads=share))

    def ready() -> None:
        """What the answers need, once (the fetch's ``on_sent``, the first answer, or the end)."""
        nonlocal out, keep, pool, one_ops, check, on_arrival, stride
        if out is not None:
            return
        o = new_out()
        # decode is CPU work: the drains running at once share the cores between their native calls
        # (4 drains of 8 threads each on a 2-core machine spent more time switching than decoding;
        # a plane's chunks, arriving together, are one drain's take and get every core)
        pool = rt.pool("remote-decode", drains)
        one_ops = ops_for(1)
        check = needs_host_check(stage, one_ops)
        stride = decoded_stride(lay)
        keep = Keep(keys, pieces, every=opts.cache == "all") if cache is not None else None
        on_arrival = handoff is not None and native_read.serves(lay, o)
        out = o
        if on_arrival:
            s = _native_arrivals(lay, stage, out, pieces, keep, rt, cores)
            native.append(s)
            assert handoff is not None
            handoff.cell[0] = s.handle  # from now on complete answers go to the set natively
        if opts.on_sent is not None:  # (the caller's setup, after the decoders are ready)
            opts.on_sent()

    def present(a: Arrived, first: int = 0) -> tuple[np.ndarray, Arrived]:
        """Fill a's missing pieces, place its cached ones; the positions left to decode (of
        those from ``first`` on: the ones before were handed to the native set)."""
        miss = a.nbytes < 0
        miss[:first] = False
        if miss.any():
            ops.fill(out, pieces.table[a.pieces[miss]], lay.fill_value)
        pos = np.flatnonzero(~miss)[first:] if first else np.flatnonzero(~miss)
        for j in pos.tolist():
            keys[int(a.pieces[j])] = (a.url, a.base + int(a.offset[j]), int(a.nbytes[j]), a.mtime)
        if cache is not None and len(pos):
            got = [(j, cache.get(keys[int(a.pieces[j])])) for j in pos.tolist()]
            found = [(j, c) for j, c in got if c is not None]
            if found:
                one_ops.place_chunks([c for _, c in found], pieces.table[a.pieces[[j for j, _ in found]]], out,
                                     lay.disk_dtype, lay.transpose)
                hits[0] += len(found)
                pos = np.array([j for j, c in got if c is None], np.int64)
        if len(pos) and int((a.offset[pos] + a.nbytes[pos]).max()) > len(memoryview(a.data)):
            raise CorruptChunkError(f"chunk {a.names(int(pos[0]))}: its index points past the end of the object")
        return pos, a

    def decode(items: list[tuple[np.ndarray, Arrived]], ops_: Any) -> None:
        items = [(pos, a) for pos, a in items if len(pos)]
        if not items:
            return
        idx = np.concatenate([a.pieces[pos] for pos, a in items])
        sizes = np.concatenate([a.nbytes[pos] for pos, a in items]).astype(np.int64)
        landed = _one_home(items)
        home = landed[0] if landed is not None else None
        if landed is not None:  # every answer lies in one arena block: decoded where it landed
            src_off, total = landed[1], 0
        else:
            src_off, total = packed_offsets(sizes)
        m = len(idx)
        name_of = [(a, int(p)) for pos, a in items for p in pos.tolist()]
        names = LazyNames(m, lambda k: name_of[k][0].names(name_of[k][1]))
        dst_off = np.arange(m, dtype=np.int64) * stride
        with rt.host_scratch.lease(total + m * stride, 1, host_empty) as (scratch,):
            buf, dst = (home if home is not None else scratch[:total]), scratch[total:total + m * stride]
            t0 = time.perf_counter()
            k = 0
            for pos, a in items if home is None else ():  # the pieces' bytes, packed
                data = np.frombuffer(a.data, np.uint8)
                for o, n in zip(a.offset[pos].tolist(), a.nbytes[pos].tolist()):
                    buf[int(src_off[k]):int(src_off[k]) + n] = data[o:o + n]
                    k += 1
            batch = Batch(idx, np.zeros(m, np.int64), src_off, src_off, sizes,
                          np.stack([np.arange(m), np.arange(1, m + 1)], axis=1).astype(np.int64), len(buf))
            t1 = time.perf_counter()
            if stage.decodes:
                prep = stage.prepare(buf, batch, lay, names) if check else None
                stage.decode(ops_, buf, batch, prep, dst, dst_off, lay, names, 0, None)
                src, offsets = dst, dst_off
            else:
                src, offsets = buf, src_off
            t2 = time.perf_counter()
            ops_.place(src, offsets, pieces.table[idx], out, lay.disk_dtype, perm=lay.transpose)
            with lock:  # thread time, summed over the drains
                spent[0] += t1 - t0
                spent[1] += t2 - t1
                spent[2] += time.perf_counter() - t2
            if keep is not None and stage.decodes:
                for k, p in enumerate(idx.tolist()):
                    if keep.wants(p):
                        keep(p, dst[int(dst_off[k]):int(dst_off[k]) + int(lay.inner_nbytes)].copy())

    def drain() -> None:
        while True:
            with lock:
                if not queue:
                    running[0] -= 1
                    return
                took = queue[:]
                queue.clear()
                busy[0] += 1
                share = max(1, cores // busy[0])  # the cores, shared with the drains decoding now
            try:
                if opts.cancel is not None and opts.cancel.is_set():
                    raise ReadCancelled("read cancelled: the partial result was discarded")
                decode([present(a) for a in took], ops_for(share))
            finally:
                with lock:
                    busy[0] -= 1

    def arrived(a: Arrived) -> None:
        ready()  # (answers already known, or obstore's: before any on_sent)
        if on_arrival:
            k = a.handed  # its first k pieces were handed to the set natively: decoding already
            for j in range(k):
                p = int(a.pieces[j])
                keys[p] = (a.url, a.base + int(a.offset[j]), int(a.nbytes[j]), a.mtime)
                added[p] = (a, j)
            in_set[a.pieces[:k]] = True
            handed[0] += k
            if k == len(a.pieces):
                return
            pos, a = present(a, k)
            pos = pos[~in_set[a.pieces[pos]]]  # (a shard read again after another changed: not added twice)
            if not len(pos):
                return
            data = a.data if isinstance(a.data, np.ndarray) else np.frombuffer(a.data, np.uint8)
            in_set[a.pieces[pos]] = True
            for j in pos.tolist():
                added[int(a.pieces[j])] = (a, j)
                native[0].add(int(a.pieces[j]), data, int(a.offset[j]), int(a.nbytes[j]))
            return
        with lock:
            queue.append(a)
            if small or running[0] >= drains:
                return
            running[0] += 1
        futures.append(pool.submit(drain))

    t = time.perf_counter()
    # a big read's answers land in reused buffers, held until every drain is done with them
    with arena_for(rt, len(pieces)) as arena:
        try:
            counts = stream_remote(lay, pieces, remote_source(rt, lay), arrived, arena, handoff, ready, _stop_of(opts))
            stats["fetch_s"] = time.perf_counter() - t
            ready()  # (nothing was requested: every piece was known)
            if native:
                left = _arrivals_done(lay, native[0], added, keep)
                stats["decoded_on_arrival"] = len(added) - len(left)
                stats["handed_natively"] = handed[0]
                if left:  # chunks the native library does not decode (Blosc's blosclz, snappy)
                    decode([(np.array([j for a2, j in left if a2 is a], np.int64), a)
                            for a in {id(a): a for a, _ in left}.values()], ops_for(cores))
            elif small and queue:  # decoded here, on every core, in one call
                running[0] += 1
                drain()
        finally:
            if native:  # its workers are done before any buffer they use is let go (also on an error)
                native[0].close()
            errors = [f.exception() for f in futures]
    for e in errors:
        if e is not None:
            raise e
    if opts.cancel is not None and opts.cancel.is_set():
        raise ReadCancelled("read cancelled: the partial result was discarded")
    stats.update(drain_copy_s=spent[0], drain_decode_s=spent[1], drain_place_s=spent[2], drains=drains)
    stats.update(counts, codec=lay.codec, pieces=len(pieces), cache_hits=hits[0],
                 reader=f"remote ({lay.source.requests} requests in flight, decoded as they arrive)")
    return out, keep


GROUP_BYTES = 8 << 20  # encoded bytes that start a decode while more answers are on the way
# a batch of arriving answers. The answers of a whole read tend to come together at the end of
# the transfer, and a decode call costs 5-16 ms whatever it holds: the 128 MiB sharded read on
# the H200 (85 MB of answers at once) spent 17.6 ms after the transfer in 6 batches of 32 MiB
# (two calls per lane, one after the other), 11.5 ms in one batch of 128 MiB (median read 74 ->
# 65 ms; 48 and 64 MiB: 70 ms; 6 lanes of 32 MiB: 69 ms)
FEED_BATCH_BYTES = 128 << 20
_MISSING, _DECODED = object(), object()  # what a remote piece's last answer said (else: its cached chunk)


def run_remote_groups(lay: Layout, stage: CodecStage, pieces: Pieces, out: Any, device: str, opts: EngineOptions,
                      ops: Ops, rt: Runtime, stats: dict[str, Any], batch: int, arena: Any) -> None:
    """The GPU path for a remote array: :func:`~gpu_zarr.engine.sources.remote_stream.stream_remote`
    requests every object at once on a thread of its own and queues each answer as it
    arrives; the batch pipeline (:func:`~gpu_zarr.engine.batches.run_feed`) takes whatever has
    arrived -- once ``GROUP_BYTES`` of it is in, or all -- as the next batches, and copies them
    into staging, uploads, decodes and places them while the rest are still on the way, one
    group's decode beside the next one's copy (before, nothing was decoded until every answer
    was in: a 128 MiB sharded array at 20 ms a request spent 47 ms fetching, then 13 copying
    and 11 decoding on the H200). A group is at least ``GROUP_BYTES`` unless it is the last: a
    decode call costs 5-16 ms whatever it holds (a viewer's plane is one group). Missing pieces
    are filled and cached ones placed at the end. ``arena``: where the answers land; it
    outlives this call, and nothing is left writing into it when this returns or raises."""
    from gpu_zarr.engine.sources.remote import RemoteBlob, remote_source
    from gpu_zarr.engine.sources.remote_stream import Arrived, stream_remote, whole_cap

    assert lay.source is not None
    n = len(pieces)
    files: list[Any] = []
    file_id = np.full(n, -1, np.int64)
    offset = np.zeros(n, np.int64)
    nbytes = np.full(n, -1, np.int64)
    whose: list[Any] = [None] * n  # per piece (its answer, its position there): names for messages
    keys: list[Any] = [None] * n
    cache = rt.chunk_cache(device) if opts.cache and stage.decodes and settings.get("cache_bytes") else None
    keep = Keep(keys, pieces, every=opts.cache == "all") if cache is not None else None
    # what each piece's last answer said: missing (the fill value), cached (the chunk), or decoded
    # (a shard that changed while read is read again, and the second answer wins)
    last: dict[int, Any] = {}
    # staging per slot: FEED_BATCH_BYTES (a group that came at once is one decode call, or several
    # side by side on the lanes), or the biggest chunk a codec can make; no more than the read
    # can need (a viewer's plane: a few chunks' worth, one slot)
    most = max(1, n) * whole_cap(lay)
    cap = min(max(min(batch, FEED_BATCH_BYTES), whole_cap(lay)), most)
    per = max(1, min(n, cap // max(1, int(lay.inner_nbytes))))
    nslots = min(max(1, opts.slots), -(-most // cap))
    # batches uploaded from the arena (pinned on the GPU) where their answers landed
    homes = stage.decodes and not ops.host_is_device and hasattr(arena, "holds")
    cond = threading.Condition()
    queue: list[Arrived] = []
    state: dict[str, Any] = {"done": False, "error": None, "counts": {}, "stop": False, "groups": 0,
                             "queued": 0}  # encoded bytes queued since the last group
    t0 = time.perf_counter()

    def arrived(a: Arrived) -> None:
        with cond:
            if state["stop"]:  # the read failed: raising here cancels the requests still in flight
                raise ReadCancelled("the read failed: its remaining requests were cancelled")
            queue.append(a)
            state["queued"] += int(a.nbytes[a.nbytes > 0].sum())
            cond.notify_all()

    def fetch_all() -> None:
        try:
            state["counts"] = stream_remote(lay, pieces, remote_source(rt, lay), arrived, arena, stop=_stop_of(opts))
        except BaseException as exc:  # noqa: BLE001 - handed to the pipeline, which raises it
            state["error"] = exc
        finally:
            with cond:
                state["done"] = True
                state["fetch_s"] = time.perf_counter() - t0
                cond.notify_all()

    def ready() -> bool:  # under cond
        if state["done"] or state["stop"]:
            return True
        return bool(state["queued"] >= GROUP_BYTES)

    def more() -> tuple[list[Batch], bool]:
        """The next group's batches (waits for answers); True once there are no more."""
        if opts.cancel is not None and opts.cancel.is_set():
            raise ReadCancelled("read cancelled: the partial result was discarded")
        with cond:
            while not ready():
                cond.wait(0.05)
                if opts.cancel is not None and opts.cancel.is_set():
                    raise ReadCancelled("read cancelled: the partial result was discarded")
            took, queue[:] = queue[:], []
            state["queued"] = 0
            finished, error, stop = state["done"], state["error"], state["stop"]
        if error is not None:
            raise error
        if stop:
            raise ReadCancelled("the read failed: its remaining requests were cancelled")
        sel: list[int] = []
        for a in took:
            fid = len(files)
            files.append(RemoteBlob(a.url, a.data if a.data is not None else b"", a.base))
            for j, p in enumerate(a.pieces.tolist()):
                nb = int(a.nbytes[j])
                if nb < 0:
                    last[p] = _MISSING
                    continue
                at = a.base + int(a.offset[j])
                keys[p], whose[p] = (a.url, at, nb, a.mtime), (a, j)
                chunk = cache.get(keys[p]) if cache is not None else None
                if chunk is not None:
                    last[p] = chunk
                    continue
                last[p] = _DECODED
                if nb > cap:
                    raise CorruptChunkError(f"chunk {a.names(j)} has {nb} encoded bytes; a chunk of {lay.inner_nbytes} "
                                            f"bytes takes at most {whole_cap(lay)} with any codec. It is corrupt; "
                                            "rewrite or delete it.")
                file_id[p], offset[p], nbytes[p] = fid, at, nb
                sel.append(p)
        if not sel:
            return [], finished
        idx = np.asarray(sel, np.int64)
        check_sizes(lay, Located(files, file_id[idx], offset[idx], nbytes[idx], LazyNames(len(idx), name_of_sel(idx)),
                                 np.zeros(len(files), np.int64)))
        # room for what lies between the pieces in their answers (shard indexes, alignment):
        # a batch is uploaded from there as one span
        made = make_batches(file_id[idx], offset[idx], nbytes[idx], lay.inner_nbytes, cap - cap // 8 if homes else cap)
        state["groups"] += 1
        return [_at_home(replace(b, pieces=idx[b.pieces])) if homes else replace(b, pieces=idx[b.pieces])
                for b in made], finished

    def _at_home(b: Batch) -> Batch:
        """``b`` uploaded from where its answers landed: every piece in one arena block
        (each answer is a view of it), within ``cap`` bytes; else ``b`` (copied to staging)."""
        answers: dict[int, tuple[Any, list[int], list[int]]] = {}  # per answer: it, its positions, batch slots
        for k, p in enumerate(b.pieces.tolist()):
            a, j = whose[p]
            got = answers.setdefault(id(a), (a, [], []))
            got[1].append(j)
            got[2].append(k)
        landed = _one_home([(np.asarray(pos, np.int64), a) for a, pos, _ in answers.values()], arena)
        if landed is None:
            return b
        owner = landed[0]
        starts = np.empty(len(b.pieces), np.int64)  # back in the batch's order
        starts[np.concatenate([np.asarray(ks, np.int64) for _, _, ks in answers.values()])] = landed[1]
        lo, hi = int(starts.min()), int((starts + b.src_sizes).max())
        if hi - lo > cap:
            return b
        return replace(b, src_offsets=starts - lo, staging_bytes=hi - lo, home=owner[lo:hi])

    def name_of_sel(idx: np.ndarray) -> Callable[[int], str]:
        return lambda k: name(int(idx[k]))

    def name(k: int) -> str:
        a, j = whose[k]
        return str(a.names(j))

    def stop() -> None:
        with cond:
            state["stop"] = True
            cond.notify_all()

    loc = Located(files, file_id, offset, nbytes, LazyNames(n, name), np.zeros(0, np.int64))
    thread = threading.Thread(target=fetch_all, name="gpu-zarr-remote-stream", daemon=True)
    thread.start()
    feed = Feed(more=more, stop=stop)
    ok = False
    try:
        run_feed(lay, stage, loc, pieces, feed, out, ops, remote_reader(lay, rt), opts, stats, keep, nslots, cap, per)
        ok = True
    finally:
        if not ok:
            stop()
        thread.join()  # the requests are done before the arena they land in can be let go (also on an error)
    if state["error"] is not None:
        raise state["error"]
    missing = [p for p, v in last.items() if v is _MISSING]
    cached = [(p, v) for p, v in last.items() if v is not _MISSING and v is not _DECODED]
    if missing:
        ops.fill(out, pieces.table[np.asarray(missing, np.int64)], lay.fill_value)
    if cached:  # (held until the sync: an eviction meanwhile must not free memory a kernel reads)
        ops.place_chunks([c for _, c in cached], pieces.table[[p for p, _ in cached]], out, lay.disk_dtype,
                         lay.transpose)
    ops.sync()
    if keep is not None and cache is not None:  # only now: every stream is done with them
        for key, chunk in keep.chunks:
            cache.put(key, chunk)
    if opts.progress is not None:
        total = nbytes_of(out.shape, out.dtype.itemsize)
        opts.progress(total, total)
    got = nbytes[nbytes >= 0]
    stats.update(state["counts"], groups=state["groups"], batches=len(feed), fetch_s=state.get("fetch_s", 0.0), pieces=n,
                 missing=len(missing), cache_hits=len(cached), codec=lay.codec, encoded_bytes=int(got.sum()),
                 decoded_bytes=nbytes_of(out.shape, out.dtype.itemsize),
                 reader=f"remote ({lay.source.requests} requests in flight, decoded as they arrive)")


def _native_arrivals(lay: Layout, stage: CodecStage, out: Any, pieces: Pieces, keep: Keep | None, rt: Runtime,
                     cores: int) -> Any:
    """A :class:`~gpu_zarr.engine.native.Arrivals` set for a small remote read's pieces (where
    ``native_read.serves``): one worker per core, at most one per piece; a Blosc chunk's blocks
    by up to 8 workers, leaving a core to the rest of the machine (on 2 cores, splitting took
    the CPU from a loopback server sending the plane's other answers: they came 0.2-0.4 ms later)."""
    import gpu_zarr.engine.native as native
    import gpu_zarr.engine.native.chunkwise as native_read

    codec = native_read.native_codec(lay.codec)
    assert codec is not None
    n, inner = len(pieces), int(lay.inner_nbytes)
    split = max(1, min(8, cores - 1)) if codec == "blosc" else 1
    threads = max(1, min(cores, max(n, split)))
    keep_bufs = None
    if keep is not None and stage.decodes:
        keep_bufs = [rt.recycled.empty(inner) if keep.wants(k) else None for k in range(n)]
    scratch = rt.recycled.empty(max(1, min(threads, n) * inner))
    return native.Arrivals(codec, n, inner, pieces.table, out, lay.disk_dtype, lay.transpose, threads, scratch,
                           keep_bufs, split)


def _arrivals_done(lay: Layout, arrivals: Any, added: dict[int, tuple[Any, int]],
                   keep: Keep | None) -> list[tuple[Any, int]]:
    """Wait for a small remote read's native decodes; hand wanted chunks to ``keep``. Returns
    the (answer, position) of the pieces the library does not decode; raises on a corrupt one."""
    import gpu_zarr.engine.native as native
    import gpu_zarr.engine.native.chunkwise as native_read

    keep_bufs = arrivals.keep
    st, det = arrivals.close()
    left = []
    for p, (a, j) in sorted(added.items()):
        code = int(st[p])
        if code == native.OK:
            if keep_bufs is not None and keep_bufs[p] is not None:
                assert keep is not None
                keep(p, keep_bufs[p])
        elif code in native.UNSUPPORTED:
            left.append((a, j))
        else:
            raise native_read.decode_failed(lay.codec, a.names(j), code, int(det[p]))
    return left


def remote_reader(lay: Layout, rt: Runtime) -> Any:
    """The fetch stage of a remote array (None for local files)."""
    if lay.source is None:
        return None
    from gpu_zarr.engine.sources.remote_stream import RemoteReader

    copiers = min(8, os.cpu_count() or 1)
    return RemoteReader(lay.source.requests, rt.pool("remote-copy", copiers), copiers)


def _stop_of(opts: EngineOptions) -> Callable[[], bool] | None:
    """What the fetch asks while its answers travel: the read's cancel event is set (None: no event)."""
    cancel = opts.cancel
    return None if cancel is None else (lambda: bool(cancel.is_set()))
