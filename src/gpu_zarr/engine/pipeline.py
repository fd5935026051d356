"""plan -> fetch -> decode -> place, with batches in flight so the stages overlap.

While the GPU copies, decodes and places batch k (decode and place ordered on one CUDA
stream), the read threads are already filling the staging slots of batches k+1 and k+2. A
slot is refilled only after the work that reads it has finished (a CUDA event).
Memory stays bounded whatever the volume: ``slots`` staging buffers of ``batch_bytes`` and
the same on the device for encoded and decoded bytes, checked to fit before anything is
planned or allocated.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpu_zarr import settings
from gpu_zarr.engine.binary import align_up, packed_offsets
from gpu_zarr.engine.codecs import CodecStage, stage_for
from gpu_zarr.engine.fit import check_fits, nbytes_of
from gpu_zarr.engine.layout import Layout, batch_key, layout_of
from gpu_zarr.engine.locate import Located, check_sizes, locate, merge_located
from gpu_zarr.engine.ops import Ops, ops_for
from gpu_zarr.engine.plan import (
    Batch,
    LazyNames,
    Part,
    Pieces,
    make_batches,
    merge_pieces,
    normalize_selection,
    plan_pieces,
)
from gpu_zarr.engine.runtime import Runtime, faults_as_errors, get_runtime, gpu_fault, host_empty
from gpu_zarr.errors import CorruptChunkError, GPUFault, GPUUnavailable, ReadCancelled, UnsupportedArrayError

__all__ = ["EngineOptions", "EngineResult", "decode_chunks", "last_read_stats", "read", "read_many"]

MiB = 1 << 20
GiB = 1 << 30
_last = threading.local()  # only for the deprecated last_read_stats()


def _setting(name: str) -> Callable[[], Any]:
    return lambda: settings.get(name)


@dataclass
class EngineOptions:
    """Knobs of the direct engine for one read; defaults come from :mod:`gpu_zarr.settings`.

    Attributes
    ----------
    batch_bytes : int
        Encoded (and decoded) bytes per batch; one read, one copy and one batched decode
        per batch (``settings`` ``batch_bytes``, environment ``GPU_ZARR_BATCH_MIB``).
    slots : int
        Batches in flight (``GPU_ZARR_SLOTS``); 2 is double buffering, 3 lets reads run ahead.
    lanes : int
        GPU work streams decoding at once (``GPU_ZARR_LANES``, at most ``slots``).
    budget_bytes : int
        GPU memory the read may use beyond its result: staging, decoded buffers and decoder
        scratch (``GPU_ZARR_BUDGET_MIB``; 0: a quarter of the free memory, at most 3 GiB).
        Batches are sized to fit it; the stats report it.
    threads : int
        Read threads (kvikio's pool or ours; ``GPU_ZARR_THREADS``). kvikio's own default is 1.
    reader : {"auto", "kvikio", "threads"}
        "auto" uses kvikio when installed on the GPU path (``GPU_ZARR_READER``).
    direct_raw : bool
        Uncompressed chunks read by kvikio go straight into device memory
        (``GPU_ZARR_DIRECT_RAW=0`` turns it off).
    pinned_limit : int, optional
        Upper bound of this read's staging (``slots * batch_bytes`` is reduced to fit);
        default ``settings`` ``pinned_bytes``.
    cache : bool or "all"
        Serve decoded chunks from the runtime's chunk cache (``settings`` ``cache_bytes``;
        device memory on the GPU path, host memory for small reads decoded on the CPU) and
        keep there the chunks this read decodes but uses only part of: a neighbouring read
        (the next plane of thick chunks) wants the rest. ``"all"`` keeps every chunk it
        decodes (a prefetch of the plane a viewer shows next). Lazy arrays turn it on.
    progress : callable, optional
        ``progress(done_bytes, total_bytes)`` after each batch (decoded bytes).
    cancel : object with ``is_set()``, optional
        Checked between batches; raises :class:`~gpu_zarr.errors.ReadCancelled`.
    """

    batch_bytes: int = field(default_factory=_setting("batch_bytes"))
    slots: int = field(default_factory=_setting("slots"))
    lanes: int = field(default_factory=_setting("lanes"))
    budget_bytes: int = field(default_factory=_setting("budget_bytes"))
    threads: int = field(default_factory=_setting("threads"))
    reader: str = field(default_factory=_setting("reader"))
    direct_raw: bool = field(default_factory=_setting("direct_raw"))
    pinned_limit: int = field(default_factory=_setting("pinned_bytes"))
    cache: bool | str = False
    progress: Callable[[int, int], None] | None = None
    cancel: Any = None

    def with_(self, **changes: Any) -> EngineOptions:
        """A copy with some fields changed."""
        return replace(self, **changes)


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
    stats = getattr(_last, "stats", None)
    return dict(stats) if stats else None


def _open(arr: Any) -> Any:
    if isinstance(arr, (str, os.PathLike)):
        from gpu_zarr.store import open_array

        return open_array(arr)
    return arr


def read(arr: Any, selection: Any = Ellipsis, *, device: str = "gpu", options: EngineOptions | None = None,
         layout: Layout | None = None, ops: Ops | None = None, runtime: Runtime | None = None) -> EngineResult:
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
        Precomputed :func:`~gpu_zarr.engine.layout.layout_of` (saves re-parsing metadata).
    ops : Ops, optional
        The device calls (default: :func:`~gpu_zarr.engine.ops.ops_for` ``device``).
    runtime : Runtime, optional
        Owner of pools, streams and staging (default: :func:`get_runtime`).

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
        with faults_as_errors():  # a fault outside the batches' decode (they name their chunks)
            return _read(lay, selection, device, opts, ops, rt, stats, t0)
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
          stats: dict[str, Any], t0: float) -> EngineResult:
    stage = stage_for(lay)
    region = normalize_selection(lay.shape, selection)
    box_shape = region.box_shape
    out_nbytes = nbytes_of(box_shape, lay.out_dtype.itemsize)  # Python ints: never wraps
    slots = max(1, opts.slots)
    lanes = max(1, min(slots, opts.lanes)) if device == "gpu" else 1
    # a remote store on the CPU's host path streams its answers: no batches, no device scratch
    streams = lay.source is not None and (ops.host_is_device if ops is not None else device == "cpu")
    budget = _budget(opts, device, out_nbytes)
    batch, scratch = (0, 0) if streams else _size_batches(lay, stage, opts, slots, lanes, budget)
    if not region.is_box:
        scratch += out_nbytes  # the box, then the stepped/squeezed copy
    # before anything is planned or allocated: an absurd shape fails here, in microseconds
    check_fits(out_nbytes, scratch if device == "gpu" else 0, device=device,
               what=f"reading {box_shape} {lay.out_dtype} of {lay.root}")
    stats.update(budget_bytes=budget, planned_device_bytes=scratch, lanes=lanes)
    own_ops = ops is None
    ops = ops or ops_for(device, slots, lanes, rt)
    pieces = plan_pieces(lay, region.start, region.stop)
    stats["plan_s"] = time.perf_counter() - t0

    if streams:
        # a remote store on the CPU's host path: locate and fetch in one, each answer decoded
        # and placed as it arrives (the transfer overlaps the decode)
        t = time.perf_counter()
        out = ops.empty(box_shape, lay.out_dtype)
        cache = rt.chunk_cache(device) if opts.cache and stage.decodes and settings.get("cache_bytes") else None
        keep = _run_remote_stream(lay, stage, pieces, out, ops, rt, opts, stats, cache)
        result = ops.finish(out, None if region.is_box else region.post)
        if keep is not None and cache is not None:
            for key, chunk in keep.chunks:
                cache.put(key, chunk)
        stats["stream_s"] = time.perf_counter() - t
        stats["total_s"] = time.perf_counter() - t0
        _last.stats = stats
        return EngineResult(result, stats)

    if lay.source is not None:
        # a remote store on the GPU: each answer uploaded, decoded and placed while the rest
        # are still on the way
        t = time.perf_counter()
        out = ops.empty(box_shape, lay.out_dtype)
        stats["alloc_s"] = time.perf_counter() - t
        with _arena(rt, len(pieces), ops) as arena:
            _run_remote_groups(lay, stage, pieces, out, device, opts, ops, rt, stats, batch, arena)
        result = ops.finish(out, None if region.is_box else region.post)
        ops.sync()
        stats["total_s"] = time.perf_counter() - t0
        _last.stats = stats
        return EngineResult(result, stats)

    t = time.perf_counter()
    loc = locate(lay, pieces, rt.pool("locate", min(opts.threads, 64)), rt.shard_indexes())
    stats["locate_s"] = time.perf_counter() - t
    t = time.perf_counter()
    out = ops.empty(box_shape, lay.out_dtype)
    stats["alloc_s"] = time.perf_counter() - t
    result = _execute(lay, stage, loc, pieces, out, None if region.is_box else region.post, device, opts, ops,
                      own_ops, rt, stats, batch)
    stats["total_s"] = time.perf_counter() - t0
    _last.stats = stats
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
    key = batch_key(lay)
    shape = tuple(int(n) for n in (out.shape if out is not None else out_shape or ()))
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
    stage = stage_for(lay)
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


def _execute(lay: Layout, stage: CodecStage, loc: Located, pieces: Pieces, out: Any, post: tuple | None, device: str,
             opts: EngineOptions, ops: Ops, own_ops: bool, rt: Runtime, stats: dict[str, Any], batch: int) -> Any:
    """Fetch, decode and place the located ``pieces`` into ``out`` (fill value where a piece
    is missing), then apply ``post`` (steps, dropped axes): the stages after locate, shared
    by :func:`read` and :func:`read_many`."""
    missing = np.flatnonzero(loc.nbytes < 0)
    if len(missing):
        ops.fill(out, pieces.table[missing], lay.fill_value)
    cache = rt.chunk_cache(device) if opts.cache and stage.decodes and settings.get("cache_bytes") else None
    keys: list[Any] = []
    to_read = loc.nbytes
    held: list[Any] = []
    if cache is not None:
        keys = _cache_keys(loc)
        to_read, held = _place_cached(cache, keys, loc, pieces, out, ops, lay, stats)
    batches = make_batches(loc.file_id, loc.offset, to_read, lay.inner_nbytes, batch)
    stats.update(codec=lay.codec, pieces=len(pieces), missing=len(missing), batches=len(batches),
                 encoded_bytes=int(loc.nbytes[loc.nbytes > 0].sum()), decoded_bytes=nbytes_of(out.shape, out.dtype.itemsize))
    keep = _Keep(keys, pieces, every=opts.cache == "all") if cache is not None else None
    import gpu_zarr.engine.native_read as native_read

    if ops.host_is_device or (own_ops and device == "cpu" and native_read.serves(lay.codec, out)):
        # the CPU path with the native library: per chunk read, decode, place on C threads (no
        # staging, no batch buffers); small reads take this path on every CPU ops
        _run_chunkwise(lay, stage, loc, pieces, to_read, out, rt, opts.threads, stats, keep, opts)
    else:
        kind = _gpu_reader(opts.reader, lay, opts) if device == "gpu" else _cpu_reader(opts.reader)
        reader = _remote_reader(lay, rt) or rt.reader(kind, opts.threads)
        _run_batches(lay, stage, loc, pieces, batches, out, ops, reader, opts, stats, keep)
    result = ops.finish(out, post)
    ops.sync()
    if keep is not None and cache is not None:  # only now: every stream is done with them
        for key, chunk in keep.chunks:
            cache.put(key, chunk)
    del held
    return result


def decode_chunks(lay: Layout, encoded: Sequence[np.ndarray], *, names: Sequence[str] | None = None,
                  device: str = "gpu") -> tuple[Any, np.ndarray]:
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

    Returns
    -------
    (buffer, offsets)
        Chunk k decoded is ``buffer[offsets[k] : offsets[k] + lay.inner_nbytes]``.
    """
    if device == "gpu":
        _refuse_after_fault()
    stage = stage_for(lay)
    ops = ops_for(device, 1, 1)
    n = len(encoded)
    names = list(names) if names is not None else [f"#{k}" for k in range(n)]
    sizes = np.array([int(e.nbytes) for e in encoded], np.int64)
    offsets, total = packed_offsets(sizes)
    batch = Batch(np.arange(n), np.zeros(n, np.int64), np.zeros(n, np.int64), offsets, sizes,
                  np.stack([np.arange(n), np.arange(1, n + 1)], axis=1).astype(np.int64), total)
    with faults_as_errors(lambda: (names[:8], max(0, n - 8))), ops.host_buffers(total, 1) as (host,):
        for e, o, size in zip(encoded, offsets.tolist(), sizes.tolist()):
            host[o:o + size] = np.frombuffer(memoryview(e).cast("B"), np.uint8)
        prep = stage.prepare(host, batch, lay, names) if _needs_host_check(stage, ops) else None
        dev_in = ops.device_buffer(total)
        uploaded = ops.upload(host, dev_in, total, 0)
        if not stage.decodes:
            ops.sync()
            return dev_in, offsets
        dst_offsets = np.arange(n, dtype=np.int64) * _stride(lay)
        dev_out = ops.device_buffer(n * _stride(lay))
        stage.decode(ops, dev_in, batch, prep, dev_out, dst_offsets, lay, names, 0, uploaded)
        ops.sync()
    return dev_out, dst_offsets


def _run_chunkwise(lay: Layout, stage: CodecStage, loc: Located, pieces: Pieces, to_read: np.ndarray, out: Any,
                   rt: Runtime, threads: int, stats: dict[str, Any], keep: _Keep | None = None,
                   opts: EngineOptions | None = None) -> None:
    """The small-read path on the CPU: the few chunks of a viewer's plane, with no staging
    slots and no pipeline, spread over the pool's threads.

    Codecs whose CPU decoder validates its input (``stage.native_checks``: libzstd) run one
    task per chunk: read, decode, place, with nothing between them holding the GIL for
    long. The others need the host check, which holds the GIL (per chunk it cost as much as
    a c-blosc decode): every chunk is read, the check runs once for all of them, then the
    chunks are decoded and placed. The encoded and decoded bytes live in reused scratch
    (fresh memory costs page faults). ``keep`` receives copies of the chunks the cache wants.
    """
    import gpu_zarr.engine.native_read as native_read
    from gpu_zarr.engine.fetch import read_range
    from gpu_zarr.engine.ops import CpuOps

    t = time.perf_counter()
    todo = np.flatnonzero(to_read >= 0)
    assert lay.source is None, "remote reads take the stream paths (_run_remote_stream, _run_remote_groups)"
    if len(todo) and native_read.serves(lay.codec, out):
        # one native call: per chunk read, decode, place on C threads; what it cannot decode
        # (Blosc with blosclz / snappy, Blosc2 chunks) continues below with numcodecs
        # in groups of about batch_bytes decoded, so that progress and cancel are looked at
        per = max(1, (opts.batch_bytes if opts is not None else 256 * MiB) // max(1, lay.inner_nbytes))
        left, total, done = [], int(lay.inner_nbytes) * len(todo), 0
        for a in range(0, len(todo), per):
            if opts is not None and opts.cancel is not None and opts.cancel.is_set():
                raise ReadCancelled("read cancelled: the partial result was discarded")
            left.append(native_read.read_chunkwise(lay, loc, pieces, todo[a:a + per], out, rt, threads, keep, stats))
            done += int(lay.inner_nbytes) * len(todo[a:a + per])
            if opts is not None and opts.progress is not None:
                opts.progress(done, total)
        rest = np.concatenate(left)
        stats["chunkwise_native"] = len(todo) - len(rest)
        todo = rest
    n = len(todo)
    if n == 0:
        stats["chunkwise_s"] = time.perf_counter() - t
        return
    ops = CpuOps(rt.pool("chunkwise", threads), threads, fast=True, runtime=rt)
    sizes = loc.nbytes[todo].astype(np.int64)
    src_offsets, encoded = packed_offsets(sizes)
    batch = Batch(todo, loc.file_id[todo], loc.offset[todo], src_offsets, sizes,
                  np.stack([np.arange(n), np.arange(1, n + 1)], axis=1).astype(np.int64), encoded)
    stride = _stride(lay)
    decoded = n * stride if stage.decodes else 0
    files, file_id, offset = loc.files, batch.file_id.tolist(), batch.file_offset.tolist()
    so, sz, pieces_ = src_offsets.tolist(), sizes.tolist(), todo.tolist()
    table, inner = pieces.table[todo], lay.inner_nbytes
    names = _names(loc, todo)
    check = _needs_host_check(stage, ops)
    with rt.host_scratch.lease(encoded + decoded, 1, host_empty) as (scratch,):
        buf = scratch[:encoded]
        src = scratch[encoded:encoded + decoded] if stage.decodes else buf
        src_off = np.arange(n, dtype=np.int64) * stride if stage.decodes else src_offsets

        def read(i: int) -> None:
            read_range(files[file_id[i]], offset[i], buf[so[i]:so[i] + sz[i]])

        def place(i: int) -> None:
            ops.place(src, src_off[i:i + 1], table[i:i + 1], out, lay.disk_dtype, perm=lay.transpose)
            if keep is not None and keep.wants(pieces_[i]):
                keep(pieces_[i], src[int(src_off[i]):int(src_off[i]) + inner].copy())

        if stage.decodes and not check:
            one_ops = CpuOps(fast=True, runtime=rt)  # no pool: each task decodes its own chunk

            def whole(i: int) -> None:
                read(i)
                stage.decode(one_ops, buf, batch.one(i), None, src, src_off[i:i + 1], lay, names[i:i + 1], 0, None)
                place(i)
            ops.map_chunks(whole, n)
        else:
            ops.map_chunks(read, n)
            stats["chunkwise_read_s"] = time.perf_counter() - t
            if stage.decodes:
                stage.decode(ops, buf, batch, stage.prepare(buf, batch, lay, names), src, src_off, lay, names, 0, None)
                stats["chunkwise_decode_s"] = time.perf_counter() - t - stats["chunkwise_read_s"]
            ops.map_chunks(place, n)
    stats["chunkwise_s"] = time.perf_counter() - t


#: remote reads of more pieces than this land in a :class:`~gpu_zarr.engine.remote.BodyArena`
#: (reused buffers; a viewer's few chunks get buffers of their own and go to the byte cache)
ARENA_PIECES = 64
SMALL_PIECES = 16


def _one_home(items: list[tuple[np.ndarray, Any]]) -> np.ndarray | None:
    """The one buffer (an arena block) every answer of ``items`` is a view of, or None."""
    home = None
    for _, a in items:
        d = a.data
        if not isinstance(d, np.ndarray) or d.base is None or (home is not None and d.base is not home):
            return None
        home = d.base
    ok = isinstance(home, np.ndarray) and home.ndim == 1 and home.dtype == np.uint8 and home.flags.c_contiguous
    return home if ok else None


def _arena(rt: Runtime, pieces: int, ops: Ops | None = None) -> Any:
    """Where a remote read of ``pieces`` pieces lands its answers: a body arena (of ``ops``'s
    staging memory when it uploads: pinned on the GPU, where the batches are uploaded from
    the answers themselves), or (a viewer's few chunks, which go to the byte cache) the
    runtime's recycled memory."""
    if pieces <= ARENA_PIECES:
        return contextlib.nullcontext(rt.recycled)
    from gpu_zarr.engine.remote import BodyArena

    uploads = ops is not None and not ops.host_is_device
    return BodyArena(rt.host_scratch, settings.get("pinned_bytes") // 4,
                     (lambda n: ops.host_buffers(n, 1)) if uploads and ops is not None else None)


def _run_remote_stream(lay: Layout, stage: CodecStage, pieces: Pieces, out: Any, ops: Ops, rt: Runtime,
                       opts: EngineOptions, stats: dict[str, Any], cache: Any) -> _Keep | None:
    """The CPU's host path for a remote array: :func:`~gpu_zarr.engine.remote_fetch.stream_remote`
    requests every object at once and hands each answer on as it arrives; answers queue up,
    and a few drain tasks on the decode pool take whatever has arrived: missing pieces
    filled, cached ones placed, the rest decoded with one native call (where they landed when
    one arena block holds them all, else packed into one staging buffer first) and placed with
    another (no Python per chunk: with hundreds of small answers the interpreter, not the
    decoder, was the limit); that call gets the cores shared among the drains decoding then. Returns the chunk cache's keeper (its
    chunks go to the cache once the read is done)."""
    import gpu_zarr.engine.native_read as native_read
    from gpu_zarr.engine.ops import CpuOps
    from gpu_zarr.engine.remote_fetch import Arrived, stream_remote

    assert lay.source is not None
    # decode is CPU work: the drains running at once share the cores between their native calls
    # (4 drains of 8 threads each on a 2-core machine spent more time switching than decoding;
    # a plane's chunks, arriving together, are one drain's take and get every core)
    cores = os.cpu_count() or 2
    drains = max(2, min(4, opts.threads, cores))
    pool = rt.pool("remote-decode", drains)
    one_ops = CpuOps(fast=True, runtime=rt, native_threads=1)
    shares: dict[int, Any] = {}

    def ops_for(share: int) -> Any:
        if share not in shares:
            shares[share] = CpuOps(fast=True, runtime=rt, native_threads=share)
        return shares[share]
    check = _needs_host_check(stage, one_ops)
    stride = _stride(lay)
    keys: list[Any] = [None] * len(pieces)
    keep = _Keep(keys, pieces, every=opts.cache == "all") if cache is not None else None
    lock = threading.Lock()
    queue: list[Arrived] = []
    futures: list[Any] = []
    running = [0]
    busy = [0]  # drains decoding a take now
    hits = [0]
    spent = [0.0, 0.0, 0.0]  # copy, decode, place: seconds summed over the drains

    def present(a: Arrived) -> tuple[np.ndarray, Arrived]:
        """Fill a's missing pieces, place its cached ones; the positions left to decode."""
        miss = a.nbytes < 0
        if miss.any():
            ops.fill(out, pieces.table[a.pieces[miss]], lay.fill_value)
        pos = np.flatnonzero(~miss)
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
        home = _one_home(items)
        if home is not None:  # every answer lies in one arena block: decoded where it landed
            at = home.ctypes.data
            src_off = np.concatenate([a.offset[pos] + (a.data.ctypes.data - at) for pos, a in items]).astype(np.int64)
            total = 0
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

    small = len(pieces) <= SMALL_PIECES
    # a viewer's few chunks: each decoded and placed on a native thread the moment its answer is
    # in (no Python thread between), else (no native decoder) all decoded at once when all are in.
    # The native set is opened at the first answer: the requests go out first
    on_arrival = small and native_read.serves(lay.codec, out)
    native: list[Any] = []  # the set, once opened
    added: dict[int, tuple[Arrived, int]] = {}

    def arrived(a: Arrived) -> None:
        if on_arrival:
            pos, a = present(a)
            if not len(pos):
                return
            if not native:
                native.append(_native_arrivals(lay, stage, out, pieces, keep, rt, cores))
            data = a.data if isinstance(a.data, np.ndarray) else np.frombuffer(a.data, np.uint8)
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
    with _arena(rt, len(pieces)) as arena:
        try:
            counts = stream_remote(lay, pieces, lay.source, arrived, arena)
            stats["fetch_s"] = time.perf_counter() - t
            if native:
                left = _arrivals_done(lay, native[0], added, keep)
                stats["decoded_on_arrival"] = len(added) - len(left)
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
    return keep


GROUP_BYTES = 8 << 20  # encoded bytes that start a decode while more answers are on the way
FEED_BATCH_BYTES = 32 << 20  # a batch of arriving answers: several decode calls in flight on the lanes
_MISSING, _DECODED = object(), object()  # what a remote piece's last answer said (else: its cached chunk)


def _run_remote_groups(lay: Layout, stage: CodecStage, pieces: Pieces, out: Any, device: str, opts: EngineOptions,
                       ops: Ops, rt: Runtime, stats: dict[str, Any], batch: int, arena: Any) -> None:
    """The GPU path for a remote array: :func:`~gpu_zarr.engine.remote_fetch.stream_remote`
    requests every object at once on a thread of its own and queues each answer as it
    arrives; the batch pipeline (:func:`_run_feed`) takes whatever has arrived -- once
    ``GROUP_BYTES`` of it is in, or all -- as the next batches, and copies them into staging,
    uploads, decodes and places them while the rest are still on the way, one group's decode
    beside the next one's copy (before, nothing was decoded until every answer was in: a
    128 MiB sharded array at 20 ms a request spent 47 ms fetching, then 13 copying and 11
    decoding on the H200). A group is at least ``GROUP_BYTES`` unless it is the last: a decode
    call costs 5-16 ms whatever it holds (a viewer's plane is one group). Missing pieces are
    filled and cached ones placed at the end. ``arena``: where the answers land; it outlives
    this call, and nothing is left writing into it when this returns or raises."""
    from gpu_zarr.engine.remote import RemoteBlob
    from gpu_zarr.engine.remote_fetch import Arrived, stream_remote, whole_cap

    assert lay.source is not None
    n = len(pieces)
    files: list[Any] = []
    file_id = np.full(n, -1, np.int64)
    offset = np.zeros(n, np.int64)
    nbytes = np.full(n, -1, np.int64)
    whose: list[Any] = [None] * n  # per piece (its answer, its position there): names for messages
    keys: list[Any] = [None] * n
    cache = rt.chunk_cache(device) if opts.cache and stage.decodes and settings.get("cache_bytes") else None
    keep = _Keep(keys, pieces, every=opts.cache == "all") if cache is not None else None
    # what each piece's last answer said: missing (the fill value), cached (the chunk), or decoded
    # (a shard that changed while read is read again, and the second answer wins)
    last: dict[int, Any] = {}
    # staging per slot: FEED_BATCH_BYTES (a group that came at once is cut into batches decoded
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
    state: dict[str, Any] = {"done": False, "error": None, "counts": {}, "stop": False, "groups": 0}
    t0 = time.perf_counter()

    def arrived(a: Arrived) -> None:
        with cond:
            if state["stop"]:  # the read failed: raising here cancels the requests still in flight
                raise ReadCancelled("the read failed: its remaining requests were cancelled")
            queue.append(a)
            cond.notify_all()

    def fetch_all() -> None:
        try:
            state["counts"] = stream_remote(lay, pieces, lay.source, arrived, arena)
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
        return sum(int(a.nbytes[a.nbytes > 0].sum()) for a in queue) >= GROUP_BYTES

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
        owner, at = None, []
        for p in b.pieces.tolist():
            a, j = whose[p]
            if not arena.holds(a.data) or (owner is not None and a.data.base is not owner):
                return b
            owner = a.data.base
            at.append(a.data.ctypes.data - owner.ctypes.data + int(a.offset[j]))
        if owner is None or owner.dtype != np.uint8 or owner.ndim != 1:
            return b
        starts = np.asarray(at, np.int64)
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
    feed = _Feed(more=more, stop=stop)
    ok = False
    try:
        _run_feed(lay, stage, loc, pieces, feed, out, ops, _remote_reader(lay, rt), opts, stats, keep, nslots, cap,
                  per)
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


def _native_arrivals(lay: Layout, stage: CodecStage, out: Any, pieces: Pieces, keep: _Keep | None, rt: Runtime,
                     cores: int) -> Any:
    """A :class:`~gpu_zarr.engine.native.Arrivals` set for a small remote read's pieces (where
    ``native_read.serves``): one worker per core."""
    import gpu_zarr.engine.native as native
    import gpu_zarr.engine.native_read as native_read

    codec = native_read.native_codec(lay.codec)
    assert codec is not None
    n, inner = len(pieces), int(lay.inner_nbytes)
    threads = max(1, min(cores, n))
    keep_bufs = None
    if keep is not None and stage.decodes:
        keep_bufs = [rt.recycled.empty(inner) if keep.wants(k) else None for k in range(n)]
    scratch = rt.recycled.empty(max(1, threads * inner))
    return native.Arrivals(codec, n, inner, pieces.table, out, lay.disk_dtype, lay.transpose, threads, scratch,
                           keep_bufs)


def _arrivals_done(lay: Layout, arrivals: Any, added: dict[int, tuple[Any, int]],
                   keep: _Keep | None) -> list[tuple[Any, int]]:
    """Wait for a small remote read's native decodes; hand wanted chunks to ``keep``. Returns
    the (answer, position) of the pieces the library does not decode; raises on a corrupt one."""
    import gpu_zarr.engine.native as native
    import gpu_zarr.engine.native_read as native_read

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


def _gpu_reader(kind: str, lay: Layout, opts: EngineOptions) -> str:
    """The GPU path's reader for ``reader="auto"``, as measured on the H200 (4 GiB volumes,
    ``benchmarks/sweep_engine.py --configs 192x3:kvikio,192x3:native``): native threads into
    pinned staging for compressed chunks (zstd 1 MiB 15.0 GiB/s against kvikio's 8.6, 4 MiB
    23.6 / 20.2, Blosc lz4 16.5 / 14.6: kvikio opens each file from Python), kvikio for raw
    chunks, which it reads straight into device memory (34.1 / 26.9)."""
    import gpu_zarr.engine.native as native

    if kind != "auto":
        return kind
    if not native.available() or (lay.codec == "raw" and opts.direct_raw and importlib.util.find_spec("kvikio")):
        return "auto"  # kvikio when installed, else native, else threads (make_reader)
    return "native"


def _cpu_reader(kind: str) -> str:
    """The CPU path's reader: native threads when built (kvikio fills device memory: not here)."""
    import gpu_zarr.engine.native as native

    if kind in ("native", "threads"):
        return kind
    return "native" if native.available() else "threads"


def _remote_reader(lay: Layout, rt: Runtime) -> Any:
    """The fetch stage of a remote array (None for local files)."""
    if lay.source is None:
        return None
    from gpu_zarr.engine.remote_fetch import RemoteReader

    copiers = min(8, os.cpu_count() or 1)
    return RemoteReader(lay.source.requests, rt.pool("remote-copy", copiers), copiers)


def _needs_host_check(stage: CodecStage, ops: Ops) -> bool:
    """Whether the stage's host half (``prepare``) must run before ``ops`` decode: not where
    the decoder checks its input itself (the batched GPU decoder's frame walk:
    ``device_checks``; the codec's own C decoder on the CPU's fast path: ``native_checks``)."""
    return stage.decodes and ops.needs_host_check(stage.device_checks, stage.native_checks)


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
    per_lane = (_stride(lay) + stage.scratch_bytes(1, lay)) if stage.decodes else 0
    per_chunk = lanes * per_lane + slots * inner
    per_batch = max(1, budget // per_chunk)
    batch = max(inner, min(opts.batch_bytes, per_batch * inner, max(opts.pinned_limit, inner) // slots))
    per_batch = max(1, batch // inner)
    device_bytes = slots * batch + (lanes * (per_batch * _stride(lay) + stage.scratch_bytes(per_batch, lay))
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
    for k, key in enumerate(keys):
        chunk = cache.get(key) if key is not None else None
        if chunk is not None:
            found.append(k)
            chunks.append(chunk)
    if found:
        ops.place_chunks(chunks, pieces.table[found], out, lay.disk_dtype, lay.transpose)
        to_read[found] = -1
    stats["cache_hits"] = len(found)
    return to_read, chunks


def _stride(lay: Layout) -> int:
    """Bytes between decoded chunks in the decoded buffer (16-byte aligned)."""
    return int(align_up(lay.inner_nbytes))


class _Keep:
    """Which decoded chunks a read keeps for the chunk cache, and the ones kept (put into the
    cache once the read is done: every stream is through with them by then)."""

    def __init__(self, keys: list[Any], pieces: Pieces, every: bool) -> None:
        self.keys = keys
        t = pieces.table
        # a piece that is the whole chunk: nothing of it is left for a neighbouring read
        whole = ((t[:, :, 1] == 0) & (t[:, :, 2] == t[:, :, 0])).all(axis=1) if len(t) else np.zeros(0, bool)
        self._wanted = np.ones(len(t), bool) if every else ~whole
        self.chunks: list[tuple[Any, Any]] = []

    def wants(self, k: int) -> bool:
        return bool(self._wanted[k])

    def __call__(self, k: int, chunk: Any) -> None:
        self.chunks.append((self.keys[k], chunk))


def _names(loc: Located, pieces: np.ndarray) -> LazyNames:
    """Names of the located pieces ``pieces`` (a batch's), in that order."""
    return LazyNames(len(pieces), lambda k: loc.names[int(pieces[k])])


class _Feed:
    """The batches of a read: all known at once (a list), or arriving while the read runs (a
    remote read on the GPU path, :func:`_run_remote_groups`). ``get(k)`` is batch k -- made by
    ``more()`` while it is not there yet -- or None once there are no more; ``stop()`` tells
    ``more`` that the read failed (it must not wait for answers any longer)."""

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


def _run_batches(lay: Layout, stage: CodecStage, loc: Located, pieces: Pieces, batches: list[Batch], out: Any,
                 ops: Ops, reader: Any, opts: EngineOptions, stats: dict[str, Any],
                 keep: _Keep | None = None) -> None:
    if not batches:
        return
    nslots = min(max(1, opts.slots), len(batches))
    cap = max(b.staging_bytes for b in batches)
    per = max(len(b.pieces) for b in batches)
    _run_feed(lay, stage, loc, pieces, _Feed(batches), out, ops, reader, opts, stats, keep, nslots, cap, per)


def _run_feed(lay: Layout, stage: CodecStage, loc: Any, pieces: Pieces, feed: _Feed, out: Any, ops: Ops,
              reader: Any, opts: EngineOptions, stats: dict[str, Any], keep: _Keep | None, nslots: int, cap: int,
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


def _run(lay: Layout, stage: CodecStage, loc: Any, pieces: Pieces, feed: _Feed, out: Any, ops: Ops,
         reader: Any, opts: EngineOptions, stats: dict[str, Any], nslots: int, cap: int, per: int, direct: bool,
         host: list[np.ndarray], keep: _Keep | None) -> None:
    t_setup = time.perf_counter()
    dstride = _stride(lay)
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

    check = _needs_host_check(stage, ops)

    def fetch(k: int) -> tuple[Batch, Any] | None:
        """Read batch k into its slot, then run the codec's host check there: on the read
        threads, off the thread that drives the GPU (the check reads only the slot). None:
        there is no batch k (the feed's batches are all done)."""
        s = k % nslots
        b = feed.get(k)  # a remote read's: waits for answers to arrive
        if b is None:
            return None
        t = time.perf_counter()
        if b.home is None or dev_in is host:
            ops.wait(released[s])  # the slot's previous batch has left its read buffer
            if b.home is None:
                reader.read(loc.files, b, dev_in[s] if direct else host[s])
            else:  # (the CPU's fast path decodes in its staging)
                host[s][:b.staging_bytes] = b.home[:b.staging_bytes]
                b = replace(b, home=None)
        t1 = time.perf_counter()
        prep = stage.prepare(host[s] if b.home is None else b.home, b, lay, _names(loc, b.pieces)) if check else None
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
                names = _names(loc, b.pieces)
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
