"""One array's write: batches of units read, gathered into chunks, encoded and written.

For each batch (a few shards, about ``batch_bytes`` of data): read the blocks (slice, or one
dask compute), move them where the encoder works (one copy to or from the GPU), cut them
into their inner chunks in ONE contiguous buffer (one copy per unit, no Python per chunk),
encode the whole batch (one nvCOMP call, or numcodecs on worker threads), lay out each
shard (chunks, then its crc32c index) and write the batch's files, a group of files a call
(:meth:`~gpu_zarr.write.output.Destination.write_files`: native threads, or ``writev`` on
writer threads); a GPU batch's frames come to the host a group at a time, through one
reused staging buffer (:class:`~gpu_zarr.write.encode.StagedFrames`). ``lanes`` batches run
at once, each on its own thread (and its own CUDA stream), so one batch's encode overlaps
another's file writes.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np

from gpu_zarr import settings
from gpu_zarr.errors import WriteError
from gpu_zarr.write.encode import EncodedBatch
from gpu_zarr.write.output import Output
from gpu_zarr.write.plan import Unit, WritePlan
from gpu_zarr.write.shard import shard_layout
from gpu_zarr.write.source import Source, is_cupy

__all__ = ["Progress", "Stages", "write_array"]


class Stages:
    """Seconds spent per stage, summed over threads (lanes overlap, so the sum can exceed the wall time)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)


class Progress:
    """Bytes done across every array of one write, for the free-space projection."""

    def __init__(self, total_raw: int) -> None:
        self.total_raw = total_raw
        self.raw_done = 0
        self.stored = 0
        self._lock = threading.Lock()

    def add(self, raw: int, stored: int) -> None:
        with self._lock:
            self.raw_done += raw
            self.stored += stored

    def check_space(self, dest: Output) -> None:
        """Raise :class:`WriteError` when the rest, at the compression ratio so far, will not fit."""
        with self._lock:
            if not self.raw_done:
                return
            need = (self.total_raw - self.raw_done) * self.stored / self.raw_done
        free = dest.free_bytes()
        if free is None:  # an object store: no free space to project against
            return
        if need * 1.05 > free:
            raise WriteError(f"not enough free space at {dest.path.parent}: the rest of this write needs about "
                             f"{need / 2**30:.2f} GiB at its compression ratio so far, {free / 2**30:.2f} GiB "
                             "are free; free space or write elsewhere")


def _to_xp(block: Any, xp_name: str) -> Any:
    if xp_name == "cupy" and not is_cupy(block):
        import cupy

        return cupy.asarray(block)
    if xp_name == "numpy" and is_cupy(block):
        return block.get()
    return np.asarray(block) if xp_name == "numpy" else block


def _gather(blocks: list[Any], units: list[Unit], plan: WritePlan, fill: Any, xp: Any) -> Any:
    """The present inner chunks of ``units`` as one contiguous ``(n, *chunks)`` array."""
    n_total = int(sum(int(u.present.sum()) for u in units))
    fill = 0 if fill is None else fill  # None: zarr's default fill value (0, False, 0.0)
    out = xp.empty((n_total, *plan.chunks), plan.dtype)
    unit_shape = plan.unit_shape
    cpu = plan.chunks_per_unit
    split = [d for pair in zip(cpu, plan.chunks, strict=True) for d in pair]
    order = list(range(0, 2 * len(cpu), 2)) + list(range(1, 2 * len(cpu), 2))
    k = 0
    for unit, block in zip(units, blocks, strict=True):
        if tuple(block.shape) != unit_shape:  # an edge unit: padded with the fill value, as zarr pads
            full = xp.full(unit_shape, fill, plan.dtype)
            full[tuple(slice(0, s) for s in block.shape)] = block
            block = full
        view = block.reshape(split).transpose(order).reshape(-1, *plan.chunks)
        m = int(unit.present.sum())
        out[k:k + m] = view if m == len(unit.present) else view[xp.asarray(unit.present)]
        k += m
    return out


def _producers_done() -> None:
    """Wait for every GPU stream of the device. The lanes run on the runtime's non-blocking
    streams, which are not ordered after the legacy default stream or a caller's streams: a
    cupy array the caller has just made (``cupy.asarray`` of a numpy array returns while its copy
    may still be landing) or a dask task has just computed could be read before its bytes are
    there, and stale memory would be encoded and written."""
    import cupy

    cupy.cuda.Device().synchronize()


def _read_blocks(source: Source, units: list[Unit], stages: Stages) -> list[Any]:
    """The blocks of ``units``; a dask source's cupy blocks waited for (dask's threads computed
    them on their streams)."""
    with stages.time("read"):
        blocks = source.read([u.region for u in units])
        if source.on_gpu and source.kind == "dask":
            _producers_done()
    return blocks


def _file_groups(units: list[Unit], sizes: np.ndarray, limit: int | None,
                 min_files: int = 1) -> list[tuple[int, int, int, int]]:
    """Runs of whole files of an encoded batch, ``(first unit, end unit, first frame, end frame)``,
    each taking at most ``limit`` frame bytes unless it holds fewer than ``min_files`` files
    (a file alone when it takes more; None: one run). One search per run, not a step per file."""
    ends = np.cumsum([int(u.present.sum()) for u in units])  # each file's end among the frames
    upto = np.concatenate([[0], np.cumsum(sizes)])[ends]  # frame bytes up to each file's end
    n = len(units)
    if limit is None or n == 0:
        return [(0, n, 0, int(ends[-1]) if n else 0)]
    groups: list[tuple[int, int, int, int]] = []
    u0 = 0
    while u0 < n:
        before = int(upto[u0 - 1]) if u0 else 0
        u1 = int(np.searchsorted(upto, before + limit, side="right"))  # files that fit the limit
        u1 = min(n, max(u1, u0 + max(1, min_files)))
        groups.append((u0, u1, int(ends[u0 - 1]) if u0 else 0, int(ends[u1 - 1])))
        u0 = u1
    return groups


def _shard_files(units: list[Unit], parts: list[Any], sizes: np.ndarray, plan: WritePlan,
                 prefix: str) -> tuple[list[tuple[str, list[Any]]], int]:
    """Each unit's file, ``(key, parts)`` (a shard: its chunks, then its index), from the
    units' encoded chunks ``parts`` (``sizes`` bytes each, in order), and their total bytes."""
    files: list[tuple[str, list[Any]]] = []
    k = 0
    total = 0
    for unit in units:
        m = int(unit.present.sum())
        key = f"{prefix}/{plan.key(unit.index)}" if prefix else plan.key(unit.index)
        chunk_parts = list(parts[k:k + m])
        if plan.shards is not None:
            inner = np.zeros(len(unit.present), np.int64)
            inner[unit.present] = sizes[k:k + m]
            _, index, nbytes = shard_layout(inner, unit.present)
            chunk_parts.append(index)
        else:
            nbytes = int(sizes[k])
        total += nbytes
        files.append((key, chunk_parts))
        k += m
    return files, total


def _write_encoded(units: list[Unit], enc: EncodedBatch, plan: WritePlan, prefix: str, dest: Output,
                   writers: ThreadPoolExecutor, threads: int, lanes: int, stages: Stages) -> int:
    """Write an encoded batch's files a group at a time (the frames of a group on the host at
    once: a staging buffer, not the whole batch); returns the bytes stored."""
    total = 0
    try:
        at_once = -(-dest.files_at_once // max(1, lanes))  # the lanes' groups together
        for u0, u1, f0, f1 in _file_groups(units, enc.sizes, enc.group_bytes, at_once):
            with stages.time("copy"):
                parts = enc.frames(f0, f1)
            with stages.time("write"):
                files, nbytes = _shard_files(units[u0:u1], parts, enc.sizes[f0:f1], plan, prefix)
                dest.write_files(files, writers, threads)  # every file finished (or failed) when it returns
            total += nbytes
    finally:
        enc.release()
    return total


def write_array(source: Source, plan: WritePlan, encoder: Any, dest: Output, prefix: str, *,
                fill_value: Any, stages: Stages, progress: Progress, batch_bytes: int, lanes: int,
                writers: ThreadPoolExecutor) -> int:
    """Write every chunk (or shard) of one array under ``prefix``; returns the bytes stored.

    The caller writes the metadata documents; this writes the data files only.
    """
    if encoder.xp_name == "cupy":
        import cupy

        xp: Any = cupy
    else:
        xp = np
    from gpu_zarr.engine.runtime import get_runtime

    runtime = get_runtime()
    threads = int(settings.get("threads"))
    lanes = max(1, lanes)
    stored = [0]
    lock = threading.Lock()
    # the runtime's work streams and lane threads are kept across writes, so nvCOMP codecs
    # (kept per stream and thread; making one is slow) are made once, not per batch
    streams = runtime.streams(0, lanes)[1] if xp is not np else []
    free: queue.SimpleQueue[int] = queue.SimpleQueue()
    for lane in range(lanes):
        free.put(lane)

    if source.on_gpu:  # the caller's array, and a pyramid level made on its stream, before any lane reads it
        _producers_done()

    def one_batch(units: list[Unit]) -> None:
        lane = free.get()
        stream_ctx: Any = streams[lane] if streams else None
        if stream_ctx is not None:
            stream_ctx.__enter__()
        try:
            blocks = _read_blocks(source, units, stages)
            with stages.time("transfer"):
                blocks = [_to_xp(b, encoder.xp_name) for b in blocks]
            with stages.time("gather"):
                chunks = _gather(blocks, units, plan, fill_value, xp)
            del blocks
            with stages.time("encode"):
                enc = encoder.encode(chunks)
            del chunks
            total = _write_encoded(units, enc, plan, prefix, dest, writers, threads, lanes, stages)
            del enc
            raw = sum(int(np.prod([b - a for a, b in zip(u.start, u.stop, strict=True)])) for u in units)
            progress.add(raw * plan.dtype.itemsize, total)
            with lock:
                stored[0] += total
        finally:
            if stream_ctx is not None:
                stream_ctx.synchronize()
                stream_ctx.__exit__(None, None, None)
            free.put(lane)

    pool = runtime.pool("write-lanes", lanes)
    pending: list[Future] = []
    try:
        for units in plan.batches(batch_bytes):
            pending.append(pool.submit(one_batch, units))
            while len(pending) >= lanes:  # bounded: at most `lanes` batches in memory
                pending.pop(0).result()
                progress.check_space(dest)
        while pending:
            pending.pop(0).result()
    finally:
        for f in pending:
            f.cancel()
        for f in pending:
            if not f.cancelled():
                f.exception()  # wait: nothing of this write runs after it returns or raises
    return stored[0]
