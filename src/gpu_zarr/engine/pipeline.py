"""plan -> fetch -> decode -> place, with batches double-buffered so the stages overlap.

While the GPU copies, decodes and places batch k (all ordered on one CUDA stream), the read
threads are already filling the pinned staging slots of batches k+1 and k+2. A slot is
refilled only after the host->device copy that read it has finished (a CUDA event).
Memory stays bounded whatever the volume: ``slots`` pinned buffers of ``batch_bytes`` and
the same on the device for encoded and decoded bytes.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from gpu_zarr.engine.fetch import make_reader
from gpu_zarr.engine.layout import Layout, layout_of
from gpu_zarr.engine.locate import locate
from gpu_zarr.engine.ops import ops_for
from gpu_zarr.engine.plan import make_batches, normalize_selection, plan_pieces
from gpu_zarr.engine.zstd_frames import check_frames
from gpu_zarr.errors import OutOfGPUMemory, ReadCancelled

__all__ = ["EngineOptions", "last_read_stats", "read"]

MiB = 1 << 20
GiB = 1 << 30
_stats_lock = threading.Lock()
_last_stats: dict | None = None


@dataclass
class EngineOptions:
    """Knobs of the direct engine.

    Attributes
    ----------
    batch_bytes : int
        Encoded (and decoded) bytes per batch; one nvCOMP call and one copy per batch
        (environment: ``GPU_ZARR_BATCH_MIB``). GPU memory beyond the output is about
        ``slots * batch`` (read buffers) plus ``4.1 * batch`` for zstd (decoded buffer and
        nvCOMP's scratch); larger batches decode faster.
    slots : int
        Batches in flight (staging buffers); 2 is double buffering, 3 lets reads run ahead
        (environment: ``GPU_ZARR_SLOTS``).
    threads : int
        Read threads (kvikio's pool or ours). kvikio's own default is 1; we use >= 8.
    reader : {"auto", "kvikio", "threads"}
        "auto" uses kvikio when installed on the GPU path, threads otherwise
        (environment: ``GPU_ZARR_READER``).
    direct_raw : bool
        Uncompressed arrays read by kvikio go straight into device memory (no pinned
        staging, no separate copy); zstd always stages on the host, where frames are
        checked before nvCOMP sees them (environment: ``GPU_ZARR_DIRECT_RAW=0`` turns it off).
    pinned_limit : int
        Upper bound of pinned host staging (slots * batch_bytes is reduced to fit).
    headroom : int
        GPU memory left free beyond output and scratch when checking a read fits.
    progress : callable, optional
        ``progress(done_bytes, total_bytes)`` after each batch (decoded bytes).
    cancel : object with ``is_set()``, optional
        Checked between batches; raises :class:`~gpu_zarr.errors.ReadCancelled`.
    """

    batch_bytes: int = field(default_factory=lambda: int(os.environ.get("GPU_ZARR_BATCH_MIB", 192)) * MiB)
    slots: int = field(default_factory=lambda: int(os.environ.get("GPU_ZARR_SLOTS", 3)))
    threads: int = field(default_factory=lambda: max(8, min(32, os.cpu_count() or 8)))
    reader: str = field(default_factory=lambda: os.environ.get("GPU_ZARR_READER", "auto"))
    direct_raw: bool = field(default_factory=lambda: os.environ.get("GPU_ZARR_DIRECT_RAW", "1") != "0")
    pinned_limit: int = 1 * GiB
    headroom: int = 256 * MiB
    progress: Callable[[int, int], None] | None = None
    cancel: object | None = None


def last_read_stats() -> dict | None:
    """Per-stage timings of the most recent engine read (seconds, bytes, counts)."""
    with _stats_lock:
        return dict(_last_stats) if _last_stats else None


_POOLS: dict = {}


def _pool(name: str, n: int) -> ThreadPoolExecutor:
    """Thread pools kept for the life of the process (starting threads per read costs)."""
    key = (name, n)
    if key not in _POOLS:
        _POOLS[key] = ThreadPoolExecutor(n, thread_name_prefix=f"gpu-zarr-{name}")
    return _POOLS[key]


def _open(arr):
    if isinstance(arr, (str, os.PathLike)):
        from gpu_zarr.zarr_io import open_array

        return open_array(arr)
    return arr


def read(arr, selection=Ellipsis, *, device: str = "gpu", options: EngineOptions | None = None,
         layout: Layout | None = None):
    """Read ``arr[selection]`` with the engine.

    Parameters
    ----------
    arr : zarr.Array or path
        Opened read-only (a path is opened read-only).
    selection : basic index
        Integers, slices with any step, Ellipsis.
    device : {"gpu", "cpu"}
        "gpu" returns a cupy array; "cpu" runs the CPU twin (numpy) of the same stages.
    options : EngineOptions, optional
    layout : Layout, optional
        Precomputed :func:`~gpu_zarr.engine.layout.layout_of` (saves re-parsing metadata).

    Returns
    -------
    cupy.ndarray or numpy.ndarray
        Equal to ``arr[selection]``, in native byte order.

    Raises
    ------
    UnsupportedArrayError
        The array's codecs or layout are not for the direct engine.
    CorruptChunkError
        A chunk or shard is truncated or corrupt (named in the message).
    OutOfGPUMemory
        The result does not fit in free GPU memory (checked before allocating).
    """
    opts = options or EngineOptions()
    stats: dict = {"device": device}
    t0 = time.perf_counter()
    arr = _open(arr)
    lay = layout or layout_of(arr)
    region = normalize_selection(lay.shape, selection)
    pieces = plan_pieces(lay, region.start, region.stop)
    ops = ops_for(device, max(1, opts.slots))
    box_shape = region.box_shape
    out_nbytes = int(np.prod(box_shape, dtype=np.int64)) * lay.out_dtype.itemsize

    slots = max(1, opts.slots)
    batch = max(lay.inner_nbytes, min(opts.batch_bytes, opts.pinned_limit // slots))
    per_batch = max(1, batch // lay.inner_nbytes)
    dec_cap = per_batch * (-(-lay.inner_nbytes // 16) * 16) if lay.codec == "zstd" else 0
    # per slot a device read buffer; one decoded buffer; nvCOMP's own decode scratch for
    # one batch (measured: about 3x the decoded batch), kept by its codec
    scratch = slots * batch + dec_cap + (dec_cap * 31 // 10 if device == "gpu" else 0)
    free = ops.free_bytes()
    if free is not None:
        extra = out_nbytes if not region.is_box else 0
        need = out_nbytes + extra + scratch + opts.headroom
        if need > free:
            raise OutOfGPUMemory(
                f"reading {box_shape} {lay.out_dtype} needs {out_nbytes / GiB:.2f} GiB for the result plus "
                f"{(need - out_nbytes) / GiB:.2f} GiB of scratch and headroom, but only {free / GiB:.2f} GiB "
                "of GPU memory is free. Read a region instead (gpu_zarr.engine.read_region(array, "
                "selection)), free GPU memory, or use a GPU with more memory."
            )
    stats["plan_s"] = time.perf_counter() - t0

    io_pool = _pool("locate", min(opts.threads, 64))
    reader = make_reader(opts.reader if device == "gpu" else "threads", opts.threads)
    try:
        t = time.perf_counter()
        loc = locate(lay, pieces, io_pool)
        stats["locate_s"] = time.perf_counter() - t
        t = time.perf_counter()
        out = ops.empty(box_shape, lay.out_dtype)
        stats["alloc_s"] = time.perf_counter() - t
        missing = np.flatnonzero(loc.nbytes < 0)
        if len(missing):
            ops.fill(out, pieces.table[missing], lay.fill_value)
        batches = make_batches(loc.file_id, loc.offset, loc.nbytes, lay.inner_nbytes, batch)
        stats.update(pieces=len(pieces), missing=len(missing), batches=len(batches),
                     encoded_bytes=int(loc.nbytes[loc.nbytes > 0].sum()), decoded_bytes=out_nbytes)
        _run_batches(lay, loc, pieces, batches, out, ops, reader, opts, stats)
        result = ops.finish(out, None if region.is_box else region.post)
        ops.sync()
    finally:
        reader.close()
    stats["total_s"] = time.perf_counter() - t0
    global _last_stats
    with _stats_lock:
        _last_stats = stats
    return result


class _Names:
    """Chunk names of a batch, looked up only when an error message needs one."""

    def __init__(self, names: list[str], pieces: np.ndarray):
        self._names, self._pieces = names, pieces

    def __len__(self) -> int:
        return len(self._pieces)

    def __getitem__(self, k: int) -> str:
        return self._names[int(self._pieces[k])]


def _run_batches(lay, loc, pieces, batches, out, ops, reader, opts, stats) -> None:
    if not batches:
        return
    t_setup = time.perf_counter()
    nslots = min(max(1, opts.slots), len(batches))
    cap = max(b.staging_bytes for b in batches)
    per = max(len(b.pieces) for b in batches)
    dstride = -(-lay.inner_nbytes // 16) * 16
    zstd = lay.codec == "zstd"
    # raw chunks read by kvikio land in device memory directly: nothing to check on the host
    direct = (not zstd) and ops.name == "gpu" and reader.name == "kvikio" and opts.direct_raw
    host = [None] * nslots if direct else [ops.host_buffer(cap, s) for s in range(nslots)]
    dev_in = [ops.device_buffer(cap, s) for s in range(nslots)]
    dev_out = ops.device_buffer(per * dstride) if zstd else None  # one: decode and place are in order
    released = [None] * nslots  # event: the slot's read buffer (pinned, or device when direct) is free
    consumed = [None] * nslots  # event: the work stream is done with the slot's device buffer
    dst_offsets = np.arange(per, dtype=np.int64) * dstride
    total = int(np.prod(out.shape, dtype=np.int64)) * out.dtype.itemsize
    done = 0
    timings = dict(read_s=0.0, wait_read_s=0.0, check_s=0.0, upload_s=0.0, decode_s=0.0, place_s=0.0)
    read_lock = threading.Lock()
    stats["setup_s"] = time.perf_counter() - t_setup

    def fetch(k: int) -> None:
        s = k % nslots
        ops.wait(released[s])  # the slot's previous batch has left its read buffer
        t = time.perf_counter()
        reader.read(loc.files, batches[k], dev_in[s] if direct else host[s])
        with read_lock:
            timings["read_s"] += time.perf_counter() - t

    # one coordinator per slot keeps `nslots` batches being read while the GPU works
    coord = _pool("fetch", nslots)
    futures = {}

    def _submit(k: int) -> None:
        # a slot's next read is submitted only after `released` holds the event that frees it
        if k < len(batches):
            futures[k] = coord.submit(fetch, k)
    try:
        ahead = nslots if ops.overlap else 1
        for k in range(min(ahead, len(batches))):
            futures[k] = coord.submit(fetch, k)
        for k, b in enumerate(batches):
            if opts.cancel is not None and opts.cancel.is_set():
                raise ReadCancelled("read cancelled: the partial result was discarded")
            s = k % nslots
            t = time.perf_counter()
            futures.pop(k).result()
            timings["wait_read_s"] += time.perf_counter() - t
            names = _Names(loc.names, b.pieces) if zstd else None
            if zstd:
                t = time.perf_counter()
                check_frames(host[s], b.src_offsets, b.src_sizes, lay.inner_nbytes, names)
                timings["check_s"] += time.perf_counter() - t
            t = time.perf_counter()
            uploaded = None
            if not direct:
                uploaded = released[s] = ops.upload(host[s], dev_in[s], b.staging_bytes, s, after=consumed[s])
            timings["upload_s"] += time.perf_counter() - t
            if not direct:  # the pinned slot is free once its copy is done: read ahead now
                _submit(k + ahead)
            if zstd:
                t = time.perf_counter()
                ops.decode_zstd(dev_in[s], b.src_offsets, b.src_sizes, dev_out, dst_offsets[:len(b.pieces)],
                                lay.inner_nbytes, names, s, wait=uploaded)
                timings["decode_s"] += time.perf_counter() - t
                src, src_off = dev_out, dst_offsets[:len(b.pieces)]
            else:
                src, src_off = dev_in[s], b.src_offsets
            t = time.perf_counter()
            ops.place(src, src_off, pieces.table[b.pieces], out, lay.disk_dtype, s,
                      wait=None if zstd else uploaded)
            consumed[s] = ops.record(s)
            if direct:  # the device slot is free only once this batch is placed
                released[s] = consumed[s]
                _submit(k + ahead)
            timings["place_s"] += time.perf_counter() - t
            done += int(np.prod(pieces.table[b.pieces][:, :, 2], axis=1).sum()) * out.dtype.itemsize
            if opts.progress is not None:
                opts.progress(min(done, total), total)
        t = time.perf_counter()
        ops.sync()
        timings["final_sync_s"] = time.perf_counter() - t
    finally:
        for f in futures.values():
            f.cancel()
        for f in futures.values():
            if not f.cancelled():
                try:
                    f.result()
                except Exception:
                    pass
        ops.sync()
    stats.update(timings)
    stats["reader"] = reader.name + (" (into device memory)" if direct else " (pinned staging)")
    stats["threads"] = getattr(reader, "threads", None)
    stats["slots"] = nslots
    stats["batch_bytes"] = cap
