"""The one scheduler of a read: fetch -> check -> decode -> place for the batches of a
:class:`~gpu_zarr.engine.feed.Feed`, whatever the source (local files: all batches known at
once; a remote store: batches of answers as they arrive) and the target (device cupy, host
numpy).

Each batch runs on one of two executors, chosen per read from the target and the codec:
- **staged** (:func:`run_feed`): while the device (or the CPU twin) uploads, decodes and
  places batch k (decode and place ordered on one stream), the read threads fill the staging
  slots of batches k+1 and k+2; a slot is refilled only after the work reading it is done
  (an event). A batch whose answers already lie in one buffer (a remote read's arena block)
  is decoded -- or uploaded -- from there.
- **fused** (:func:`run_fused`): on the CPU with the native library, per chunk read, decode
  and place on native threads in one call (no staging, no batch buffers): a viewer's plane
  costs no pipeline. Chunks the library does not decode (Blosc's blosclz and snappy) return
  to the staged executor.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from gpu_zarr.engine.codecs import CodecStage
from gpu_zarr.engine.feed import Feed, Keep, check_cancel, decoded_stride, needs_host_check, piece_names
from gpu_zarr.engine.layout import Layout
from gpu_zarr.engine.ops import Ops
from gpu_zarr.engine.options import EngineOptions
from gpu_zarr.engine.plan import Batch, Pieces
from gpu_zarr.engine.runtime import Runtime, faults_as_errors, gpu_fault
from gpu_zarr.engine.sources.locate import Located

__all__ = ["run_batches", "run_feed", "run_fused"]

MiB = 1 << 20


def run_fused(lay: Layout, loc: Located, pieces: Pieces, todo: np.ndarray, out: Any, rt: Runtime,
              opts: EngineOptions, stats: dict[str, Any], keep: Keep | None = None) -> np.ndarray:
    """The fused executor: the located pieces ``todo`` read, decoded and placed on native
    threads, in groups of about ``opts.batch_bytes`` decoded (progress and cancel are looked
    at between groups). Returns the pieces the library does not decode (for :func:`run_feed`)."""
    import gpu_zarr.engine.native.chunkwise as chunkwise

    t = time.perf_counter()
    per = max(1, opts.batch_bytes // max(1, lay.inner_nbytes))
    left, total, done = [np.zeros(0, np.int64)], int(lay.inner_nbytes) * len(todo), 0
    for a in range(0, len(todo), per):
        check_cancel(opts)
        group = todo[a:a + per]
        left.append(chunkwise.read_chunkwise(lay, loc, pieces, group, out, rt, opts.threads, keep, stats))
        done += int(lay.inner_nbytes) * len(group)
        if opts.progress is not None:
            opts.progress(done, total)
    rest = np.concatenate(left)
    stats["chunkwise_native"] = len(todo) - len(rest)
    stats["fused_s"] = time.perf_counter() - t
    return rest


def run_batches(lay: Layout, stage: CodecStage, loc: Located, pieces: Pieces, batches: list[Batch], out: Any,
                ops: Ops, reader: Any, opts: EngineOptions, stats: dict[str, Any],
                keep: Keep | None = None) -> None:
    """:func:`run_feed` of batches all known at once."""
    if not batches:
        return
    nslots = min(max(1, opts.slots), len(batches))
    cap = max(b.staging_bytes for b in batches)
    per = max(len(b.pieces) for b in batches)
    run_feed(lay, stage, loc, pieces, Feed(batches), out, ops, reader, opts, stats, keep, nslots, cap, per)


def run_feed(lay: Layout, stage: CodecStage, loc: Any, pieces: Pieces, feed: Feed, out: Any, ops: Ops,
             reader: Any, opts: EngineOptions, stats: dict[str, Any], keep: Keep | None, nslots: int, cap: int,
             per: int) -> None:
    """The staged executor: run the batches of ``feed`` (at most ``cap`` staging bytes and
    ``per`` pieces each) in ``nslots`` slots; ``loc`` has the ``files`` and ``names`` of the
    pieces, ``reader`` reads a batch's bytes from them into a slot."""
    # raw chunks read by kvikio land in device memory directly: nothing to check on the host
    direct = (not stage.decodes) and ops.on_device and reader.name == "kvikio" and opts.direct_raw
    with reader.session(), ops.host_buffers(0 if direct else cap, 0 if direct else nslots) as host:
        _Staged(lay, stage, loc, pieces, feed, out, ops, reader, opts, stats, nslots, cap, per, direct, host,
                keep).run()
    stats["reader"] = reader.name + (" (into device memory)" if direct else " (staging)")
    stats["threads"] = getattr(reader, "threads", None)
    stats["slots"] = nslots
    stats["batch_bytes"] = cap


class _Staged:
    """One run of the staged executor: its buffers, events and timings."""

    def __init__(self, lay: Layout, stage: CodecStage, loc: Any, pieces: Pieces, feed: Feed, out: Any, ops: Ops,
                 reader: Any, opts: EngineOptions, stats: dict[str, Any], nslots: int, cap: int, per: int,
                 direct: bool, host: list[np.ndarray], keep: Keep | None) -> None:
        t = time.perf_counter()
        self.lay, self.stage, self.loc, self.pieces, self.feed, self.out = lay, stage, loc, pieces, feed, out
        self.ops, self.reader, self.opts, self.stats, self.keep = ops, reader, opts, stats, keep
        self.nslots, self.direct, self.host = nslots, direct, host
        dstride = decoded_stride(lay)
        # the CPU's fast path decodes the fetched bytes where they are
        self.in_place = ops.host_is_device and not direct
        self.dev_in = host if self.in_place else [ops.device_buffer(cap, s) for s in range(nslots)]
        # per lane one decoded buffer: a lane decodes and places its batches in order
        self.dev_out = [ops.device_buffer(per * dstride, lane) for lane in range(ops.lanes)] if stage.decodes else []
        self.released: list[Any] = [None] * nslots  # event: the slot's read buffer (host, or device when direct) is free
        self.consumed: list[Any] = [None] * nslots  # event: the work stream is done with the slot's device buffer
        self.dst_offsets = np.arange(per, dtype=np.int64) * dstride
        self.total = int(np.prod(out.shape, dtype=np.int64)) * out.dtype.itemsize
        self.done = 0
        self.timings = dict(read_s=0.0, wait_read_s=0.0, check_s=0.0, upload_s=0.0, decode_s=0.0, place_s=0.0)
        self.read_lock = threading.Lock()
        self.check = needs_host_check(stage, ops)
        # one coordinator per slot keeps `nslots` batches being read while the device works (a
        # feed of arriving batches has threads of its own: its reads wait for answers)
        self.coord = ops.runtime.pool("fetch" if feed.known else "fetch-arriving", nslots)
        self.futures: dict[int, Any] = {}
        self.ahead = nslots if ops.overlap else 1
        self.recent: list[Any] = []  # names of the batches whose device work may still be in flight
        stats["setup_s"] = time.perf_counter() - t

    def fetch(self, k: int) -> tuple[Batch, Any] | None:
        """Read batch k into its slot, then run the codec's host check there: on the read
        threads, off the thread that drives the device (the check reads only the slot). None:
        there is no batch k (the feed's batches are all done)."""
        s = k % self.nslots
        b = self.feed.get(k)  # a remote read's: waits for answers to arrive
        if b is None:
            return None
        t = time.perf_counter()
        if b.home is None:
            self.ops.wait(self.released[s])  # the slot's previous batch has left its read buffer
            self.reader.read(self.loc.files, b, self.dev_in[s] if self.direct else self.host[s])
        t1 = time.perf_counter()
        prep = (self.stage.prepare(self.host[s] if b.home is None else b.home, b, self.lay,
                                   piece_names(self.loc, b.pieces)) if self.check else None)
        t2 = time.perf_counter()
        with self.read_lock:
            self.timings["read_s"] += t1 - t
            if self.check:
                self.timings["check_s"] += t2 - t1
                for key, val in getattr(prep, "stats", dict)().items():  # e.g. Blosc streams per codec
                    self.timings[key] = self.timings.get(key, 0) + val
        return b, prep

    def submit(self, k: int) -> None:
        # a slot's next read is submitted only after `released` holds the event that frees it
        if self.feed.known is None or k < self.feed.known:
            self.futures[k] = self.coord.submit(self.fetch, k)

    def in_flight(self) -> tuple[list[str], int]:
        listed: list[str] = []
        for group in self.recent:
            listed += group[:max(0, 8 - len(listed))]
        return listed, sum(len(g) for g in self.recent) - len(listed)

    def upload(self, k: int, b: Batch) -> tuple[Any, Any]:
        """Batch k's bytes where the decode reads them, and the event of their upload."""
        s, ops = k % self.nslots, self.ops
        if b.home is not None:  # where the answers landed (the host slot stays free)
            self.timings["in_place_batches"] = self.timings.get("in_place_batches", 0) + 1
            if self.in_place:
                self.submit(k + self.ahead)
                return b.home, None
            uploaded = ops.upload(b.home, self.dev_in[s], b.staging_bytes, s, after=self.consumed[s])
            self.submit(k + self.ahead)
            return self.dev_in[s], uploaded
        if self.direct or self.in_place:  # read where it is decoded: the slot is free once placed
            return self.dev_in[s], None
        uploaded = self.released[s] = ops.upload(self.host[s], self.dev_in[s], b.staging_bytes, s,
                                                 after=self.consumed[s])
        self.submit(k + self.ahead)  # the host slot is free once its copy is done: read ahead now
        return self.dev_in[s], uploaded

    def step(self, k: int, b: Batch, prep: Any) -> None:
        """Upload, decode and place batch k."""
        s, ops, lay, stage = k % self.nslots, self.ops, self.lay, self.stage
        names = piece_names(self.loc, b.pieces)
        self.recent = [*self.recent[-self.nslots:], names]
        t = time.perf_counter()
        src, uploaded = self.upload(k, b)
        self.timings["upload_s"] += time.perf_counter() - t
        src_off = b.src_offsets
        if stage.decodes:
            t = time.perf_counter()
            dst, src_off = self.dev_out[s % ops.lanes], self.dst_offsets[:len(b.pieces)]
            stage.decode(ops, src, b, prep, dst, src_off, lay, names, s, uploaded)
            self.timings["decode_s"] += time.perf_counter() - t
            src = dst
            if self.keep is not None:  # copies for the chunk cache, ordered after the decode
                for j, piece in enumerate(b.pieces.tolist()):
                    if self.keep.wants(piece):
                        self.keep(piece, ops.take(src, int(src_off[j]), lay.inner_nbytes, s))
        t = time.perf_counter()
        table = self.pieces.table[b.pieces]
        ops.place(src, src_off, table, self.out, lay.disk_dtype, s, wait=None if stage.decodes else uploaded,
                  perm=lay.transpose)
        self.consumed[s] = ops.record(s)
        if b.home is None and (self.direct or self.in_place):  # the slot is free only once this batch is placed
            self.released[s] = self.consumed[s]
            self.submit(k + self.ahead)
        self.timings["place_s"] += time.perf_counter() - t
        self.done += int(np.prod(table[:, :, 2], axis=1).sum()) * self.out.dtype.itemsize
        if self.opts.progress is not None:
            self.opts.progress(min(self.done, self.total), self.total)

    def loop(self) -> None:
        for k in range(self.ahead):
            self.submit(k)
        k = 0
        while True:
            check_cancel(self.opts)
            t = time.perf_counter()
            got = self.futures.pop(k).result() if k in self.futures else None  # read and checked on the fetch thread
            self.timings["wait_read_s"] += time.perf_counter() - t
            if got is None:  # no batch k: all are done
                break
            self.step(k, *got)
            k += 1
        t = time.perf_counter()
        self.ops.sync()
        self.timings["final_sync_s"] = time.perf_counter() - t

    def run(self) -> None:
        ok = False
        try:
            with faults_as_errors(self.in_flight):
                self.loop()
            ok = True
        finally:
            if not ok:
                self.feed.stop()  # a feed's reads waiting for answers give up
            for f in self.futures.values():
                f.cancel()
            for f in self.futures.values():
                if not f.cancelled():
                    try:
                        f.result()
                    except Exception:  # noqa: BLE001 - the read already failed or was cancelled
                        pass
            if gpu_fault() is None:  # after a fault every CUDA call fails: the error above says why
                self.ops.sync()
            self.stats.update(self.timings)
