"""plan -> fetch -> decode -> place: the engine's entry points (:func:`read`, :func:`read_many`,
:func:`decode_chunks`).

A read is planned, sized and checked to fit here; its source then makes its pieces into a
:class:`~gpu_zarr.engine.feed.Feed` -- local files located at once
(:mod:`gpu_zarr.engine.sources.locate`), a remote store's answers as they arrive
(:class:`~gpu_zarr.engine.sources.remote_feed.RemoteFeed`) -- and the one scheduler
(:mod:`gpu_zarr.engine.scheduler`) fetches, decodes and places its batches, on the device or
on the CPU. Memory stays bounded whatever the volume: ``slots`` staging buffers of
``batch_bytes`` and the same on the device for encoded and decoded bytes, checked to fit
before anything is planned or allocated.
"""

from __future__ import annotations

import importlib.util
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_zarr import settings
from gpu_zarr.engine.binary import packed_offsets
from gpu_zarr.engine.codecs import CodecStage
from gpu_zarr.engine.codecs.chain import stage_for
from gpu_zarr.engine.feed import decoded_stride, keeper, needs_host_check
from gpu_zarr.engine.fit import check_fits, nbytes_of
from gpu_zarr.engine.layout import Layout, batch_key
from gpu_zarr.engine.metadata import layout_of
from gpu_zarr.engine.ops import CpuOps, Ops, ops_for
from gpu_zarr.engine.options import EngineOptions
from gpu_zarr.engine.plan import (
    Batch,
    Part,
    Pieces,
    make_batches,
    merge_pieces,
    normalize_selection,
    plan_pieces,
)
from gpu_zarr.engine.runtime import Runtime, faults_as_errors, get_runtime, gpu_fault
from gpu_zarr.engine.scheduler import run_batches, run_feed, run_fused
from gpu_zarr.engine.sources.files import reader_of
from gpu_zarr.engine.sources.locate import Located, locate, merge_located
from gpu_zarr.engine.sources.remote_feed import RemoteFeed, arena_for
from gpu_zarr.errors import CorruptChunkError, GPUFault, GPUUnavailable, UnsupportedArrayError

__all__ = ["EngineOptions", "EngineResult", "decode_chunks", "last_read_stats", "read", "read_many"]

MiB = 1 << 20
GiB = 1 << 30


@dataclass
class EngineResult:
    """What an engine read returns: the data and what was measured.

    Attributes
    ----------
    data : cupy.ndarray or numpy.ndarray
    stats : dict
        Per-stage seconds, bytes and counts (``plan_s``, ``locate_s``, ``read_s``,
        ``decode_s``, ``place_s``, ``pieces``, ``batches``, ``encoded_bytes``, ...).
    """

    data: Any
    stats: dict[str, Any]


def last_read_stats() -> dict[str, Any] | None:
    """Deprecated: per-stage timings of this thread's most recent engine read.

    Use the ``stats`` of :func:`read`'s :class:`EngineResult` (or of
    :class:`gpu_zarr.zarr_io.ReadResult`), which belong to that read alone.
    """
    warnings.warn("last_read_stats() is deprecated: use the stats of the read's result",
                  DeprecationWarning, stacklevel=2)
    stats = getattr(get_runtime().last, "stats", None)
    return dict(stats) if stats else None


def _open(arr: Any) -> Any:
    if isinstance(arr, (str, os.PathLike)):
        from gpu_zarr.store import open_array

        return open_array(arr)
    return arr


def read(arr: Any, selection: Any = Ellipsis, *, device: str = "gpu", options: EngineOptions | None = None,
         layout: Layout | None = None, ops: Ops | None = None, runtime: Runtime | None = None,
         out: Any = None) -> EngineResult:
    """Read ``arr[selection]`` with the engine.

    Parameters
    ----------
    arr : zarr.Array, path, or None when ``layout`` is given
        Opened read-only (a path is opened read-only).
    selection : basic index
        Integers, slices with any step, Ellipsis.
    device : {"gpu", "cpu"}
        "gpu" returns a cupy array; "cpu" runs the CPU twin (numpy) of the same stages.
    options : EngineOptions, optional
    layout : Layout, optional
        Precomputed :func:`~gpu_zarr.engine.metadata.layout_of` (saves re-parsing metadata).
    ops : Ops, optional
        The device calls (default: :func:`~gpu_zarr.engine.ops.ops_for` ``device``).
    runtime : Runtime, optional
        Owner of pools, streams and staging (default: :func:`get_runtime`).
    out : array, optional
        Where the selection's bounding box is placed (an array of ``ops``'s kind: numpy for
        ``device="cpu"``), C-contiguous, of the box's shape and the array's native-order
        dtype (e.g. page-locked memory that is copied to the GPU next); ``data`` is then a
        view of it, or a copy for a stepped selection.

    Returns
    -------
    EngineResult
        ``data`` equal to ``arr[selection]`` in native byte order, and the read's stats.

    Raises
    ------
    UnsupportedArrayError
        The array's codecs or layout are not for the direct engine.
    CorruptChunkError
        A chunk or shard is truncated or corrupt (named in the message).
    GPUFault
        The GPU faulted while decoding (the chunks in flight are named); the GPU is then
        unusable in this process, and later GPU reads raise GPUUnavailable at once.
    OutOfGPUMemory, OutOfHostMemory
        The result and its scratch do not fit (checked before planning or allocating).
    """
    opts = options or EngineOptions()
    if device == "gpu":
        _refuse_after_fault()
    rt = runtime or get_runtime()
    stats: dict[str, Any] = {"device": device}
    t0 = time.perf_counter()
    lay = layout or layout_of(_open(arr))
    try:
        if device != "gpu":  # (no CUDA, no fault to translate: a plane's requests leave sooner)
            return _read(lay, selection, device, opts, ops, rt, stats, t0, out)
        with faults_as_errors():  # a fault outside the batches' decode (they name their chunks)
            return _read(lay, selection, device, opts, ops, rt, stats, t0, out)
    except (CorruptChunkError, GPUFault) as exc:
        if str(lay.root) in str(exc):
            raise
        # the stages name the chunk (its key); the message names the store too
        raise type(exc)(f"{lay.root}: {exc}") from exc


def _refuse_after_fault() -> None:
    fault = gpu_fault()
    if fault:
        raise GPUUnavailable(f"the GPU faulted earlier in this process ({fault}); CUDA cannot recover a context "
                             "after a fault, so the GPU is unusable until Python restarts. Restart it, or read on "
                             "the CPU meanwhile (backend='cpu').")


def _read(lay: Layout, selection: Any, device: str, opts: EngineOptions, ops: Ops | None, rt: Runtime,
          stats: dict[str, Any], t0: float, given: Any = None) -> EngineResult:
    stage = stage_for(lay, rt)
    region = normalize_selection(lay.shape, selection)
    box_shape = region.box_shape
    out_nbytes = nbytes_of(box_shape, lay.out_dtype.itemsize)  # Python ints: never wraps
    slots = max(1, opts.slots)
    lanes = max(1, min(slots, opts.lanes)) if device == "gpu" else 1
    budget = _budget(opts, device, out_nbytes)
    batch, scratch = _size_batches(lay, stage, opts, slots, lanes, budget)
    if not region.is_box:
        scratch += out_nbytes  # the box, then the stepped/squeezed copy
    # before anything is planned or allocated: an absurd shape fails here, in microseconds
    check_fits(out_nbytes, scratch if device == "gpu" else 0, device=device,
               what=lambda: f"reading {box_shape} {lay.out_dtype} of {lay.root}")
    if given is not None and (tuple(given.shape) != tuple(box_shape) or given.dtype != lay.out_dtype
                              or not given.flags.c_contiguous):
        raise ValueError(f"out must be a C-contiguous {lay.out_dtype} array of shape {tuple(box_shape)} "
                         f"(the selection's box); got {given.dtype} {tuple(given.shape)}")
    stats.update(budget_bytes=budget, planned_device_bytes=scratch, lanes=lanes)
    own_ops = ops is None
    if ops is None and device == "cpu" and lay.source is not None:
        # a remote read on the CPU decodes answers where they landed, natively as they arrive
        ops = rt.resource(("remote-decode-ops", opts.threads),
                          lambda: CpuOps(rt.pool("cpu-decode", opts.threads), opts.threads, fast=True, runtime=rt))
    ops = ops or ops_for(device, slots, lanes, rt)
    pieces = plan_pieces(lay, region.start, region.stop)
    stats["plan_s"] = time.perf_counter() - t0
    post = None if region.is_box else region.post
    if lay.source is None:
        t = time.perf_counter()
        loc = locate(lay, pieces, rt.pool("locate", min(opts.threads, 64)), rt.shard_indexes())
        stats["locate_s"] = time.perf_counter() - t
    t = time.perf_counter()
    out = ops.empty(box_shape, lay.out_dtype) if given is None else given
    stats["alloc_s"] = time.perf_counter() - t
    if lay.source is not None:
        result = _execute_remote(lay, stage, pieces, out, post, device, opts, ops, rt, stats, batch)
    else:
        result = _execute(lay, stage, loc, pieces, out, post, device, opts, ops, own_ops, rt, stats, batch)
    stats["total_s"] = time.perf_counter() - t0
    rt.last.stats = stats
    return EngineResult(result, stats)


def read_many(parts: Sequence[Part], out_shape: Sequence[int] | None = None, *, device: str = "gpu",
              options: EngineOptions | None = None, ops: Ops | None = None, runtime: Runtime | None = None,
              out: Any = None) -> EngineResult:
    """Read boxes of several arrays into their places in one output, with ONE engine read.

    Every part is planned and located on its own; then their pieces are fetched, decoded and
    placed together, as the pieces of one array are by :func:`read`: one native call on the
    CPU's small-read path, or batches through the GPU pipeline (a plate's wells: one read, not
    one per well). The arrays must share their chunk format (equal
    :func:`~gpu_zarr.engine.layout.batch_key`: codec, chunk shape, dtype, order, fill value).

    Parameters
    ----------
    parts : sequence of Part
        Each a box ``[start, stop)`` of one array (its layout) and where it lands (``at``).
        Boxes must not overlap in the output.
    out_shape : sequence of int, optional
        Shape of the output the engine allocates (not with ``out``).
    device : {"gpu", "cpu"}
    options, ops, runtime
        As for :func:`read`.
    out : array, optional
        The output to place into (numpy for ``device="cpu"``, C-contiguous, native byte
        order, the arrays' dtype). Elements no part covers keep their values; in an output
        the engine allocates they are undefined (``empty``): the caller fills them.

    Returns
    -------
    EngineResult
        ``data`` the output; stats as for :func:`read`, with ``arrays`` (parts read).

    Raises
    ------
    UnsupportedArrayError
        The parts' arrays differ in their chunk format, or one is remote.
    ValueError
        A box outside its array or outside the output.
    CorruptChunkError
        A chunk is truncated or corrupt (named with its array).
    """
    if not parts:
        raise ValueError("read_many needs at least one part")
    if device == "gpu":
        _refuse_after_fault()
    opts = options or EngineOptions()
    rt = runtime or get_runtime()
    stats: dict[str, Any] = {"device": device, "arrays": len(parts)}
    t0 = time.perf_counter()
    lay = parts[0].layout
    shape = tuple(int(n) for n in (out.shape if out is not None else out_shape or ()))
    _check_parts(parts, shape)
    stage = stage_for(lay, rt)
    out_nbytes = nbytes_of(shape, lay.out_dtype.itemsize)
    slots = max(1, opts.slots)
    lanes = max(1, min(slots, opts.lanes)) if device == "gpu" else 1
    budget = _budget(opts, device, out_nbytes)
    batch, scratch = _size_batches(lay, stage, opts, slots, lanes, budget)
    check_fits(out_nbytes if out is None else 0, scratch if device == "gpu" else 0, device=device,
               what=f"reading {shape} {lay.out_dtype} of {len(parts)} arrays ({lay.root}, ...)")
    stats.update(budget_bytes=budget, planned_device_bytes=scratch, lanes=lanes)
    own_ops = ops is None
    ops = ops or ops_for(device, slots, lanes, rt)
    planned = [plan_pieces(p.layout, p.start, p.stop) for p in parts]
    pieces = merge_pieces(planned, [p.at for p in parts])
    stats["plan_s"] = time.perf_counter() - t0
    t = time.perf_counter()
    pool = rt.pool("locate", min(opts.threads, 64))
    loc = merge_located([locate(p.layout, pp, pool, rt.shard_indexes()) for p, pp in zip(parts, planned)],
                        [p.layout.root for p in parts])
    stats["locate_s"] = time.perf_counter() - t
    t = time.perf_counter()
    if out is None:
        out = ops.empty(shape, lay.out_dtype)
    elif np.dtype(out.dtype) != lay.out_dtype:
        raise ValueError(f"out has dtype {out.dtype}; the arrays read as {lay.out_dtype}")
    stats["alloc_s"] = time.perf_counter() - t
    result = _execute(lay, stage, loc, pieces, out, None, device, opts, ops, own_ops, rt, stats, batch)
    stats["total_s"] = time.perf_counter() - t0
    return EngineResult(result, stats)


def _check_parts(parts: Sequence[Part], shape: tuple[int, ...]) -> None:
    """Every part is of one local chunk format and fits its array and the output."""
    lay = parts[0].layout
    key = batch_key(lay)
    for p in parts:
        other = batch_key(p.layout)
        if key is None or other != key:
            raise UnsupportedArrayError(
                f"one engine read reads local arrays of one chunk format; {p.layout.root} "
                f"({'remote' if other is None else other[:3]}) differs from {lay.root} ({key and key[:3]})")
        nd = p.layout.ndim
        if not (len(p.start) == len(p.stop) == len(p.at) == nd == len(shape)) or any(
                not 0 <= a <= b <= n or not 0 <= o <= o + b - a <= m
                for a, b, n, o, m in zip(p.start, p.stop, p.layout.shape, p.at, shape)):
            raise ValueError(f"part [{p.start}, {p.stop}) of {p.layout.root} (shape {p.layout.shape}) placed at "
                             f"{p.at} does not fit its array or the output of shape {shape}")


def _execute(lay: Layout, stage: CodecStage, loc: Located, pieces: Pieces, out: Any, post: tuple | None, device: str,
             opts: EngineOptions, ops: Ops, own_ops: bool, rt: Runtime, stats: dict[str, Any], batch: int) -> Any:
    """Fetch, decode and place the located ``pieces`` of local files into ``out`` (fill value
    where a piece is missing), then apply ``post`` (steps, dropped axes): the stages after
    locate, shared by :func:`read` and :func:`read_many`. On the CPU with the native library
    the fused executor reads, decodes and places; the staged one takes the rest."""
    import gpu_zarr.engine.native.chunkwise as chunkwise

    missing = np.flatnonzero(loc.nbytes < 0)
    if len(missing):
        ops.fill(out, pieces.table[missing], lay.fill_value)
    cache = _cache_of(rt, device, opts, stage)
    keys: list[Any] = []
    to_read = loc.nbytes
    held: list[Any] = []
    if cache is not None:
        keys = _cache_keys(loc)
        to_read, held = _place_cached(cache, keys, loc, pieces, out, ops, lay, stats)
    batches = make_batches(loc.file_id, loc.offset, to_read, lay.inner_nbytes, batch)
    stats.update(codec=lay.codec, pieces=len(pieces), missing=len(missing), batches=len(batches),
                 encoded_bytes=int(loc.nbytes[loc.nbytes > 0].sum()), decoded_bytes=nbytes_of(out.shape, out.dtype.itemsize))
    keep = keeper(keys, pieces, cache, opts.cache)
    todo = np.flatnonzero(to_read >= 0)
    if len(todo) and (ops.host_is_device or (own_ops and device == "cpu")) and chunkwise.serves(lay, out):
        rest = run_fused(lay, loc, pieces, todo, out, rt, opts, stats, keep)
        left = np.full(len(to_read), -1, np.int64)
        left[rest] = to_read[rest]
        batches = make_batches(loc.file_id, loc.offset, left, lay.inner_nbytes, batch) if len(rest) else []
    kind = _gpu_reader(opts.reader, lay, opts) if device == "gpu" else _cpu_reader(opts.reader)
    if batches:
        run_batches(lay, stage, loc, pieces, batches, out, ops, reader_of(rt, kind, opts.threads), opts, stats, keep)
    result = ops.finish(out, post)
    ops.sync()
    if keep is not None and cache is not None:  # only now: every stream is done with them
        for key, chunk in keep.chunks:
            cache.put(key, chunk)
    del held
    return result


def _execute_remote(lay: Layout, stage: CodecStage, pieces: Pieces, out: Any, post: tuple | None, device: str,
                    opts: EngineOptions, ops: Ops, rt: Runtime, stats: dict[str, Any], batch: int) -> Any:
    """The pieces of a remote array: fetched by a :class:`RemoteFeed`, its batches run by the
    scheduler as they arrive; then ``post`` as for :func:`_execute`."""
    cache = _cache_of(rt, device, opts, stage)
    t = time.perf_counter()
    with arena_for(rt, len(pieces), ops) as arena:
        src = RemoteFeed(lay, stage, pieces, out, ops, rt, opts, cache, batch, arena)
        try:
            src.start()
            run_feed(lay, stage, src.located, pieces, src.feed, out, ops, src.reader, opts, stats, src.keep,
                     src.nslots, src.cap, src.per)
        finally:
            src.close()  # nothing writes into the arena or the output after this (also on an error)
        src.finish(stats)
    result = ops.finish(out, post)
    ops.sync()
    stats["stream_s"] = time.perf_counter() - t
    return result


def _cache_of(rt: Runtime, device: str, opts: EngineOptions, stage: CodecStage) -> Any:
    """The runtime's decoded-chunk cache where the read uses one, else None."""
    return rt.chunk_cache(device) if opts.cache and stage.decodes and settings.get("cache_bytes") else None


def decode_chunks(lay: Layout, encoded: Sequence[np.ndarray], *, names: Sequence[str] | None = None,
                  device: str = "gpu", runtime: Runtime | None = None) -> tuple[Any, np.ndarray]:
    """Decode whole chunks already in host memory (read by someone else, e.g. zarr-python)
    with the layout's codec stage: the same host check and ONE batched device decode.

    Parameters
    ----------
    lay : Layout
        See :func:`gpu_zarr.engine.layout.chunk_layout`.
    encoded : sequence of uint8 ndarray
        The chunks' encoded bytes.
    names : sequence of str, optional
        Chunk names for error messages.
    device : {"gpu", "cpu"}
    runtime : Runtime, optional
        Owner of what lives across reads (default: :func:`get_runtime`).

    Returns
    -------
    (buffer, offsets)
        Chunk k decoded is ``buffer[offsets[k] : offsets[k] + lay.inner_nbytes]``.
    """
    if device == "gpu":
        _refuse_after_fault()
    rt = runtime or get_runtime()
    stage = stage_for(lay, rt)
    ops = ops_for(device, 1, 1, rt)
    n = len(encoded)
    names = list(names) if names is not None else [f"#{k}" for k in range(n)]
    sizes = np.array([int(e.nbytes) for e in encoded], np.int64)
    offsets, total = packed_offsets(sizes)
    batch = Batch(np.arange(n), np.zeros(n, np.int64), np.zeros(n, np.int64), offsets, sizes,
                  np.stack([np.arange(n), np.arange(1, n + 1)], axis=1).astype(np.int64), total)
    with faults_as_errors(lambda: (names[:8], max(0, n - 8))), ops.host_buffers(total, 1) as (host,):
        for e, o, size in zip(encoded, offsets.tolist(), sizes.tolist()):
            host[o:o + size] = np.frombuffer(memoryview(e).cast("B"), np.uint8)
        prep = stage.prepare(host, batch, lay, names) if needs_host_check(stage, ops) else None
        dev_in = ops.device_buffer(total)
        uploaded = ops.upload(host, dev_in, total, 0)
        if not stage.decodes:
            ops.sync()
            return dev_in, offsets
        dst_offsets = np.arange(n, dtype=np.int64) * decoded_stride(lay)
        dev_out = ops.device_buffer(n * decoded_stride(lay))
        stage.decode(ops, dev_in, batch, prep, dev_out, dst_offsets, lay, names, 0, uploaded)
        ops.sync()
    return dev_out, dst_offsets


def _gpu_reader(kind: str, lay: Layout, opts: EngineOptions) -> str:
    """The GPU path's reader for ``reader="auto"``: native threads into pinned staging for
    compressed chunks (kvikio opens each file from Python, which is slower), kvikio for raw
    chunks, which it reads straight into device memory (``benchmarks/sweep_engine.py``)."""
    import gpu_zarr.engine.native as native

    if kind != "auto":
        return kind
    direct = lay.codec == "raw" and not lay.frames and opts.direct_raw
    if not native.available() or (direct and importlib.util.find_spec("kvikio")):
        return "auto"  # kvikio when installed, else native, else threads (make_reader)
    return "native"


def _cpu_reader(kind: str) -> str:
    """The CPU path's reader: native threads when built (kvikio fills device memory: not here)."""
    import gpu_zarr.engine.native as native

    if kind in ("native", "threads"):
        return kind
    return "native" if native.available() else "threads"


def _budget(opts: EngineOptions, device: str, out_nbytes: int) -> int:
    """GPU bytes the read may use beyond its result (see :class:`EngineOptions`)."""
    if opts.budget_bytes:
        return opts.budget_bytes
    if device != "gpu":
        return 3 * GiB
    from gpu_zarr.engine.fit import device_memory

    free, _ = device_memory()
    return int(max(256 * MiB, min(3 * GiB, (free - out_nbytes) // 4)))


def _size_batches(lay: Layout, stage: CodecStage, opts: EngineOptions, slots: int, lanes: int,
                  budget: int) -> tuple[int, int]:
    """(staging bytes per batch, device bytes beyond the result) within ``budget``.

    Per slot a device buffer for the fetched bytes; per lane a decoded buffer and the
    decoder's scratch. A batch holds at least one chunk whatever the budget.
    """
    inner = lay.inner_nbytes
    per_lane = (decoded_stride(lay) + stage.scratch_bytes(1, lay)) if stage.decodes else 0
    per_chunk = lanes * per_lane + slots * inner
    per_batch = max(1, budget // per_chunk)
    batch = max(inner, min(opts.batch_bytes, per_batch * inner, max(opts.pinned_limit, inner) // slots))
    per_batch = max(1, batch // inner)
    device_bytes = slots * batch + (lanes * (per_batch * decoded_stride(lay) + stage.scratch_bytes(per_batch, lay))
                                    if stage.decodes else 0)
    return batch, device_bytes


def _cache_keys(loc: Located) -> list[Any]:
    """Per piece, where its bytes are on disk (file, offset, size, modification time): a
    chunk rewritten on disk gets another key. None for missing pieces."""
    mtimes = loc.mtime_ns.tolist()
    return [(str(loc.files[f]), o, n, mtimes[f]) if n >= 0 else None
            for f, o, n in zip(loc.file_id.tolist(), loc.offset.tolist(), loc.nbytes.tolist())]


def _place_cached(cache: Any, keys: list[Any], loc: Located, pieces: Pieces, out: Any, ops: Ops, lay: Layout,
                  stats: dict[str, Any]) -> tuple[np.ndarray, list[Any]]:
    """Place the pieces the cache holds; return sizes with those marked as not to be read, and
    the chunks placed (the caller holds them until the read is done: an eviction meanwhile
    must not free memory a kernel still reads)."""
    to_read = loc.nbytes.copy()
    found: list[int] = []
    chunks: list[Any] = []
    for k, chunk in enumerate(cache.get_many(keys)):
        if chunk is not None:
            found.append(k)
            chunks.append(chunk)
    if found:
        ops.place_chunks(chunks, pieces.table[found], out, lay.disk_dtype, lay.transpose)
        to_read[found] = -1
    stats["cache_hits"] = len(found)
    return to_read, chunks
