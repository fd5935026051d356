"""The batch pipeline: fetch -> upload -> decode -> place for batches of pieces, with batches
in flight so the stages overlap.

While the GPU copies, decodes and places batch k (decode and place ordered on one CUDA
stream), the read threads are already filling the staging slots of batches k+1 and k+2. A
slot is refilled only after the work that reads it has finished (a CUDA event). The
batches are all known at once (a local read: :func:`run_batches`) or arrive while the read
runs (a remote read on the GPU path: :func:`run_feed` with a :class:`Feed` that waits for
answers). Also here, what the read paths share: the chunk cache's :class:`Keep`,
:func:`decoded_stride`, :func:`needs_host_check` and :func:`piece_names`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpu_zarr.engine.binary import align_up
from gpu_zarr.engine.codecs import CodecStage
from gpu_zarr.engine.layout import Layout
from gpu_zarr.engine.ops import Ops
from gpu_zarr.engine.options import EngineOptions
from gpu_zarr.engine.plan import Batch, LazyNames, Pieces
from gpu_zarr.engine.runtime import faults_as_errors, gpu_fault
from gpu_zarr.engine.sources.locate import Located
from gpu_zarr.errors import ReadCancelled

__all__ = ["Feed", "Keep", "decoded_stride", "needs_host_check", "piece_names", "run_batches", "run_feed"]


def needs_host_check(stage: CodecStage, ops: Ops) -> bool:
    """Whether the stage's host half (``prepare``) must run before ``ops`` decode: not where
    the decoder checks its input itself (the batched GPU decoder's frame walk:
    ``device_checks``; the codec's own C decoder on the CPU's fast path: ``native_checks``)."""
    return stage.decodes and ops.needs_host_check(stage.device_checks, stage.native_checks)


def decoded_stride(lay: Layout) -> int:
    """Bytes between decoded chunks in the decoded buffer (16-byte aligned)."""
    return int(align_up(lay.inner_nbytes))


class Keep:
    """Which decoded chunks a read keeps for the chunk cache, and the ones kept (put into the
    cache once the read is done: every stream is through with them by then)."""

    def __init__(self, keys: list[Any], pieces: Pieces, every: bool) -> None:
        self.keys = keys
        self._table, self._every = pieces.table, every
        self._wanted: np.ndarray | None = None  # worked out at the first question (not before a read's requests leave)
        self.chunks: list[tuple[Any, Any]] = []

    def wants(self, k: int) -> bool:
        if self._wanted is None:
            t = self._table
            # a piece that is the whole chunk: nothing of it is left for a neighbouring read
            whole = ((t[:, :, 1] == 0) & (t[:, :, 2] == t[:, :, 0])).all(axis=1) if len(t) else np.zeros(0, bool)
            self._wanted = np.ones(len(t), bool) if self._every else ~whole
        return bool(self._wanted[k])

    def __call__(self, k: int, chunk: Any) -> None:
        self.chunks.append((self.keys[k], chunk))


def piece_names(loc: Located, pieces: np.ndarray) -> LazyNames:
    """Names of the located pieces ``pieces`` (a batch's), in that order."""
    return LazyNames(len(pieces), lambda k: loc.names[int(pieces[k])])


class Feed:
    """The batches of a read: all known at once (a list), or arriving while the read runs (a
    remote read on the GPU path, :func:`~gpu_zarr.engine.remote_read.run_remote_groups`).
    ``get(k)`` is batch k -- made by ``more()`` while it is not there yet -- or None once there
    are no more; ``stop()`` tells ``more`` that the read failed (it must not wait for answers
    any longer)."""

    def __init__(self, batches: Sequence[Batch] | None = None,
                 more: Callable[[], tuple[list[Batch], bool]] | None = None,
                 stop: Callable[[], None] | None = None) -> None:
        self._batches = list(batches) if batches is not None else []
        self._more = more  # () -> (new batches, no more will come); may wait for them
        self._stop = stop
        self._done = more is None
        self._lock = threading.Lock()

    def get(self, k: int) -> Batch | None:
        with self._lock:  # batches are made in order, by one thread at a time
            while k >= len(self._batches) and not self._done:
                assert self._more is not None
                got, self._done = self._more()
                self._batches.extend(got)
            return self._batches[k] if k < len(self._batches) else None

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()

    @property
    def known(self) -> int | None:
        """How many batches there are, when all are known (None while more may come)."""
        return len(self._batches) if self._more is None else None

    def __len__(self) -> int:
        """Batches made so far."""
        return len(self._batches)


def run_batches(lay: Layout, stage: CodecStage, loc: Located, pieces: Pieces, batches: list[Batch], out: Any,
                ops: Ops, reader: Any, opts: EngineOptions, stats: dict[str, Any],
                keep: Keep | None = None) -> None:
    if not batches:
        return
    nslots = min(max(1, opts.slots), len(batches))
    cap = max(b.staging_bytes for b in batches)
    per = max(len(b.pieces) for b in batches)
    run_feed(lay, stage, loc, pieces, Feed(batches), out, ops, reader, opts, stats, keep, nslots, cap, per)


def run_feed(lay: Layout, stage: CodecStage, loc: Any, pieces: Pieces, feed: Feed, out: Any, ops: Ops,
             reader: Any, opts: EngineOptions, stats: dict[str, Any], keep: Keep | None, nslots: int, cap: int,
             per: int) -> None:
    """Run the batches of ``feed`` (at most ``cap`` staging bytes and ``per`` pieces each) in
    ``nslots`` slots; ``loc`` has the ``files`` and ``names`` of the pieces."""
    # raw chunks read by kvikio land in device memory directly: nothing to check on the host
    direct = (not stage.decodes) and ops.on_device and reader.name == "kvikio" and opts.direct_raw
    with reader.session(), ops.host_buffers(0 if direct else cap, 0 if direct else nslots) as host:
        _run(lay, stage, loc, pieces, feed, out, ops, reader, opts, stats, nslots, cap, per, direct, host, keep)
    stats["reader"] = reader.name + (" (into device memory)" if direct else " (staging)")
    stats["threads"] = getattr(reader, "threads", None)
    stats["slots"] = nslots
    stats["batch_bytes"] = cap


def _run(lay: Layout, stage: CodecStage, loc: Any, pieces: Pieces, feed: Feed, out: Any, ops: Ops,
         reader: Any, opts: EngineOptions, stats: dict[str, Any], nslots: int, cap: int, per: int, direct: bool,
         host: list[np.ndarray], keep: Keep | None) -> None:
    t_setup = time.perf_counter()
    dstride = decoded_stride(lay)
    if ops.host_is_device and not direct:
        dev_in = host  # the CPU's fast path decodes the fetched bytes where they are
    else:
        dev_in = [ops.device_buffer(cap, s) for s in range(nslots)]
    # per lane one decoded buffer: a lane decodes and places its batches in order
    dev_out = [ops.device_buffer(per * dstride, lane) for lane in range(ops.lanes)] if stage.decodes else []
    released: list[Any] = [None] * nslots  # event: the slot's read buffer (host, or device when direct) is free
    consumed: list[Any] = [None] * nslots  # event: the work stream is done with the slot's device buffer
    dst_offsets = np.arange(per, dtype=np.int64) * dstride
    total = int(np.prod(out.shape, dtype=np.int64)) * out.dtype.itemsize
    done = 0
    timings = dict(read_s=0.0, wait_read_s=0.0, check_s=0.0, upload_s=0.0, decode_s=0.0, place_s=0.0)
    read_lock = threading.Lock()
    stats["setup_s"] = time.perf_counter() - t_setup

    check = needs_host_check(stage, ops)

    def fetch(k: int) -> tuple[Batch, Any] | None:
        """Read batch k into its slot, then run the codec's host check there: on the read
        threads, off the thread that drives the GPU (the check reads only the slot). None:
        there is no batch k (the feed's batches are all done)."""
        s = k % nslots
        b = feed.get(k)  # a remote read's: waits for answers to arrive
        if b is None:
            return None
        t = time.perf_counter()
        if b.home is None:
            ops.wait(released[s])  # the slot's previous batch has left its read buffer
            reader.read(loc.files, b, dev_in[s] if direct else host[s])
        else:  # uploaded from where it is: only ops that upload get such batches
            assert dev_in is not host and not direct
        t1 = time.perf_counter()
        prep = stage.prepare(host[s] if b.home is None else b.home, b, lay, piece_names(loc, b.pieces)) if check else None
        t2 = time.perf_counter()
        with read_lock:
            timings["read_s"] += t1 - t
            if check:
                timings["check_s"] += t2 - t1
                for key, val in getattr(prep, "stats", dict)().items():  # e.g. Blosc streams per codec
                    timings[key] = timings.get(key, 0) + val
        return b, prep

    # one coordinator per slot keeps `nslots` batches being read while the GPU works (a feed
    # of arriving batches has threads of its own: its reads wait for answers)
    coord = ops.runtime.pool("fetch" if feed.known else "fetch-arriving", nslots)
    futures: dict[int, Any] = {}
    ahead = nslots if ops.overlap else 1

    def submit(k: int) -> None:
        # a slot's next read is submitted only after `released` holds the event that frees it
        if feed.known is None or k < feed.known:
            futures[k] = coord.submit(fetch, k)

    recent: list[Any] = []  # names of the batches whose GPU work may still be in flight

    def in_flight() -> tuple[list[str], int]:
        listed: list[str] = []
        for group in recent:
            listed += group[:max(0, 8 - len(listed))]
        return listed, sum(len(g) for g in recent) - len(listed)
    ok = False
    try:
        with faults_as_errors(in_flight):
            for k in range(ahead):
                submit(k)
            k = -1
            while True:
                k += 1
                if opts.cancel is not None and opts.cancel.is_set():
                    raise ReadCancelled("read cancelled: the partial result was discarded")
                s = k % nslots
                t = time.perf_counter()
                got = futures.pop(k).result() if k in futures else None  # read and host-checked on the fetch thread
                timings["wait_read_s"] += time.perf_counter() - t
                if got is None:  # no batch k: all are done
                    break
                b, prep = got
                names = piece_names(loc, b.pieces)
                recent = [*recent[-nslots:], names]
                t = time.perf_counter()
                uploaded = None
                if b.home is not None:  # uploaded from where the answers landed (the host slot stays free)
                    uploaded = ops.upload(b.home, dev_in[s], b.staging_bytes, s, after=consumed[s])
                    submit(k + ahead)
                    timings["in_place_batches"] = timings.get("in_place_batches", 0) + 1
                elif not direct:
                    uploaded = released[s] = ops.upload(host[s], dev_in[s], b.staging_bytes, s, after=consumed[s])
                    submit(k + ahead)  # the host slot is free once its copy is done: read ahead now
                timings["upload_s"] += time.perf_counter() - t
                if stage.decodes:
                    t = time.perf_counter()
                    stage.decode(ops, dev_in[s], b, prep, dev_out[s % ops.lanes], dst_offsets[:len(b.pieces)], lay,
                                 names, s, uploaded)
                    timings["decode_s"] += time.perf_counter() - t
                    src, src_off = dev_out[s % ops.lanes], dst_offsets[:len(b.pieces)]
                    if keep is not None:  # copies for the chunk cache, ordered after the decode
                        for j, piece in enumerate(b.pieces.tolist()):
                            if keep.wants(piece):
                                keep(piece, ops.take(src, int(src_off[j]), lay.inner_nbytes, s))
                else:
                    src, src_off = dev_in[s], b.src_offsets
                t = time.perf_counter()
                ops.place(src, src_off, pieces.table[b.pieces], out, lay.disk_dtype, s,
                          wait=None if stage.decodes else uploaded, perm=lay.transpose)
                consumed[s] = ops.record(s)
                if direct:  # the device slot is free only once this batch is placed
                    released[s] = consumed[s]
                    submit(k + ahead)
                timings["place_s"] += time.perf_counter() - t
                done += int(np.prod(pieces.table[b.pieces][:, :, 2], axis=1).sum()) * out.dtype.itemsize
                if opts.progress is not None:
                    opts.progress(min(done, total), total)
            t = time.perf_counter()
            ops.sync()
            timings["final_sync_s"] = time.perf_counter() - t
        ok = True
    finally:
        if not ok:
            feed.stop()  # a feed's reads waiting for answers give up
        for f in futures.values():
            f.cancel()
        for f in futures.values():
            if not f.cancelled():
                try:
                    f.result()
                except Exception:  # noqa: BLE001 - the read already failed or was cancelled
                    pass
        if gpu_fault() is None:  # after a fault every CUDA call fails: the error above says why
            ops.sync()
        stats.update(timings)
