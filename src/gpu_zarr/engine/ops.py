"""The device calls of the engine, for the GPU (cupy, nvCOMP) and for its CPU twins (numpy).

The pipeline and the codec stages are written once against :class:`Ops`; only these calls
differ between the GPU path and the CPU twins that CI runs. :class:`CpuOps` runs every call
at once, in order; :class:`AsyncCpuOps` runs them on worker threads ordered by "events"
(futures), as the GPU's streams are, so CI exercises the slot/event ordering too.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from gpu_zarr.engine.decode import copy_spans_cpu, decode_batch_cpu, decode_batch_gpu, native_stream_codec
from gpu_zarr.engine.nvcomp_batch import copy_spans
from gpu_zarr.engine.place import place_cpu, place_gpu
from gpu_zarr.errors import INSTALL_HINT, GPUUnavailable

__all__ = ["AsyncCpuOps", "CpuOps", "GpuOps", "Ops", "ops_for"]


class Ops(Protocol):
    """What the pipeline and the codec stages call; ``name`` ("gpu" or "cpu") is for reports only.

    Stages ask ops what they can do (the attributes below) and let ops do what differs between
    the GPU and its CPU twins (the methods): no stage branches on ``name``. The runtime that
    owns long-lived state (pools, streams, kernels, staging) travels with the ops.
    """

    name: str
    overlap: bool
    lanes: int  # independent work streams: slot s decodes and places on lane s % lanes
    xp: Any
    runtime: Any  # the Runtime whose pools, streams, staging and kernels these ops use
    on_device: bool  # buffers live in device memory: a reader may fill them directly (kvikio)
    host_is_device: bool  # fetched host bytes are what decode reads (no staging copy: the CPU's fast path)
    native_decoders: bool  # a codec's own C decoder may decode whole streams (it checks its input)
    whole_chunks: bool  # whole chunks may go through a whole-chunk decoder (Blosc)
    native_threads: int  # threads of one native call

    def needs_host_check(self, device_checks: bool, native_checks: bool) -> bool:
        """Whether a codec's host check must run before these ops decode (not where the decoder
        checks its input itself: the GPU's frame walk, ``device_checks``; a C decoder on the
        CPU's fast path, ``native_checks``)."""
        ...
    def map_chunks(self, fn: Any, n: int) -> None: ...
    def elementwise(self, fn: Any, n: int, slot: int = 0) -> None:
        """``fn(xp, lo, hi)`` (array operations of numpy or cupy on chunks ``lo:hi`` of a
        batch of ``n``) for every chunk, after the work queued on the slot's work stream and
        before what is queued next there."""
        ...
    def scratch(self, nbytes: int, slot: int = 0) -> Any: ...
    def to_device(self, host: np.ndarray, slot: int = 0) -> Any: ...
    def unshuffle(self, src: Any, dec: Any, stream_raw: np.ndarray, stream_src: np.ndarray, stream_dst: np.ndarray,
                  b_first: np.ndarray, b_nsplit: np.ndarray, b_size: np.ndarray, b_ts: np.ndarray,
                  b_mode: np.ndarray, dst: Any, b_dst: np.ndarray, slot: int = 0, wait: Any = None) -> None:
        """Blosc: ONE unshuffle of every block of a batch into ``dst``, each block's streams read
        where they are (``src`` at ``stream_src`` where ``stream_raw``, else ``dec`` at
        ``stream_dst``), after ``wait`` and the slot's queued decodes."""
        ...
    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any: ...
    def host_buffers(self, nbytes: int, count: int) -> Any: ...
    def device_buffer(self, nbytes: int, slot: int = 0) -> Any: ...
    def upload(self, host: np.ndarray, dev: Any, nbytes: int, slot: int = 0, after: Any = None) -> Any: ...
    def wait(self, event: Any) -> None: ...
    def record(self, slot: int = 0) -> Any: ...
    def decode_batch(self, algo: str, src: Any, src_offsets: np.ndarray, src_sizes: np.ndarray, dst: Any,
                     dst_offsets: np.ndarray, dst_sizes: np.ndarray, names: Sequence[str] | None,
                     slot: int = 0, wait: Any = None, crc32: np.ndarray | None = None,
                     adler32: np.ndarray | None = None, walked: bool = False) -> None: ...
    def copy_spans(self, src: Any, src_offsets: np.ndarray, dst: Any, dst_offsets: np.ndarray,
                   sizes: np.ndarray, slot: int = 0, wait: Any = None) -> None: ...
    def place(self, src: Any, src_offsets: np.ndarray, table: np.ndarray, out: Any, disk_dtype: np.dtype,
              slot: int = 0, wait: Any = None, perm: tuple[int, ...] | None = None) -> None: ...
    def take(self, buf: Any, offset: int, nbytes: int, slot: int = 0) -> Any: ...
    def place_chunks(self, chunks: list[Any], table: np.ndarray, out: Any, disk_dtype: np.dtype,
                     perm: tuple[int, ...] | None = None) -> None: ...
    def fill(self, out: Any, table: np.ndarray, value: Any) -> None: ...
    def sync(self) -> None: ...
    def free_bytes(self) -> int | None: ...
    def finish(self, out: Any, post: tuple | None) -> Any: ...


class _HostLease:
    """Plain numpy staging (the CPU twins need no pinned memory)."""

    def __init__(self, nbytes: int, count: int) -> None:
        self.buffers = [np.empty(max(nbytes, 1), np.uint8)[:nbytes] for _ in range(count)]

    def __enter__(self) -> list[np.ndarray]:
        return self.buffers

    def __exit__(self, *exc: object) -> None:
        return None


def _fill_boxes(out: Any, table: np.ndarray, value: Any) -> None:
    for t in table:
        out[tuple(slice(int(a), int(a + n)) for a, n in zip(t[:, 3], t[:, 2]))] = value


class CpuOps:
    """numpy buffers, numcodecs decode, numpy placement; every call completes at once.

    With a thread pool, a batch's streams are decoded by all its threads (numcodecs and
    zlib release the GIL): the small-read path that spares reads of a few chunks nvCOMP's
    per-call latency. With the native library (:mod:`gpu_zarr.engine.native`), a batch's
    decode and its place are each ONE call on ``native_threads`` native threads (default
    ``settings`` ``threads``); ``GPU_ZARR_NATIVE=0`` gives the pure-Python calls.
    """

    name = "cpu"
    overlap = False
    lanes = 1
    on_device = False

    def __init__(self, pool: ThreadPoolExecutor | None = None, threads: int = 1, *, fast: bool = False,
                 native_threads: int | None = None, runtime: Any = None) -> None:
        import gpu_zarr.engine.native as native
        from gpu_zarr import settings
        from gpu_zarr.engine.runtime import Runtime

        self.xp: Any = np
        # the read's runtime; ops made on their own (tests, probes) own a private one
        self.runtime: Any = runtime if runtime is not None else Runtime()
        self._pool, self._threads = pool, max(1, threads)
        self.native = native.available()
        self.native_threads = max(1, native_threads or max(threads, int(settings.get("threads"))))
        # fast: the small-read path, where speed matters more than being the GPU's twin:
        # fetched bytes are decoded where they were read (no staging copy), and stages may
        # use the codecs' own C decoders for whole chunks (numcodecs Blosc)
        self.host_is_device = fast
        self.native_decoders = fast
        # whole chunks through a whole-chunk decoder (Blosc) after the usual host check
        self.whole_chunks = fast

    def needs_host_check(self, device_checks: bool, native_checks: bool) -> bool:
        return not native_checks if self.native_decoders else True

    def scratch(self, nbytes: int, slot: int = 0) -> np.ndarray:
        return self.runtime.recycled.take(max(nbytes, 1))  # memory comes back touched once dropped

    def elementwise(self, fn: Any, n: int, slot: int = 0) -> None:
        """The chunks split into one group a thread (numpy releases the GIL in its loops)."""
        groups = max(1, min(n, self._threads if self._pool is not None else 1))
        bounds = np.linspace(0, n, groups + 1).astype(int).tolist()

        def run() -> None:
            self.map_chunks(lambda g: fn(self.xp, bounds[g], bounds[g + 1]), groups)
        self._run(run, slot=slot)

    def to_device(self, host: np.ndarray, slot: int = 0) -> np.ndarray:
        return host

    def unshuffle(self, src: Any, dec: Any, stream_raw: np.ndarray, stream_src: np.ndarray, stream_dst: np.ndarray,
                  b_first: np.ndarray, b_nsplit: np.ndarray, b_size: np.ndarray, b_ts: np.ndarray,
                  b_mode: np.ndarray, dst: Any, b_dst: np.ndarray, slot: int = 0, wait: Any = None) -> None:
        from gpu_zarr.engine.codecs.shuffle import unshuffle_cpu

        self.wait(wait)
        self.wait(self.record(slot))  # the decodes queued so far have finished (the twin may run them on a thread)
        space = np.concatenate([np.asarray(src).reshape(-1), dec])
        s_addr = np.where(stream_raw, stream_src, len(space) - len(dec) + stream_dst)
        unshuffle_cpu(space, s_addr, b_first, b_nsplit, b_size, b_ts, b_mode, dst, b_dst)

    def map_chunks(self, fn: Any, n: int) -> None:
        """``fn(k)`` for every k < n, on the pool's threads when there is one."""
        if self._pool is None or self._threads < 2 or n < 2:
            for k in range(n):
                fn(k)
            return
        for f in [self._pool.submit(fn, k) for k in range(n)]:
            f.result()

    def _decode_parallel(self, algo: str, src: np.ndarray, src_offsets: np.ndarray, src_sizes: np.ndarray,
                         dst: np.ndarray, dst_offsets: np.ndarray, dst_sizes: np.ndarray,
                         names: Sequence[str] | None, crc32: np.ndarray | None = None,
                         adler32: np.ndarray | None = None, walked: bool = False) -> None:
        n = len(src_offsets)
        if self.native and native_stream_codec(algo):  # one native call for the batch
            decode_batch_cpu(algo, src, src_offsets, src_sizes, dst, dst_offsets, dst_sizes, names, crc32, adler32,
                             threads=self.native_threads, walked=walked)
            return
        parts = np.array_split(np.arange(n), max(1, min(n, self._threads)))

        def part(i: int) -> None:
            p = parts[i]
            decode_batch_cpu(algo, src, src_offsets[p], src_sizes[p], dst, dst_offsets[p], dst_sizes[p],
                             [names[int(k)] for k in p] if names is not None else None,
                             None if crc32 is None else crc32[p], None if adler32 is None else adler32[p])
        self.map_chunks(part, len(parts))

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return self.runtime.recycled.empty(shape, dtype)  # memory the caller drops comes back already touched

    def host_buffers(self, nbytes: int, count: int) -> _HostLease:
        return _HostLease(nbytes, count)

    def device_buffer(self, nbytes: int, slot: int = 0) -> np.ndarray:
        return self.runtime.recycled.take(max(nbytes, 1))  # a read's buffers come back touched for the next

    def _run(self, fn: Any, *args: Any, slot: int = 0, after: Any = None) -> Any:
        fn(*args)
        return None

    def upload(self, host: np.ndarray, dev: np.ndarray, nbytes: int, slot: int = 0, after: Any = None) -> Any:
        if dev is host:  # host_is_device: nothing to copy
            return None

        def copy() -> None:
            dev[:nbytes] = host[:nbytes]
        return self._run(copy, slot=slot, after=after)

    def wait(self, event: Any) -> None:
        return None

    def record(self, slot: int = 0) -> Any:
        return None

    def decode_batch(self, algo: str, src: np.ndarray, src_offsets: np.ndarray, src_sizes: np.ndarray,
                     dst: np.ndarray, dst_offsets: np.ndarray, dst_sizes: np.ndarray,
                     names: Sequence[str] | None, slot: int = 0, wait: Any = None, crc32: np.ndarray | None = None,
                     adler32: np.ndarray | None = None, walked: bool = False) -> None:
        self._run(self._decode_parallel, algo, src, np.asarray(src_offsets), np.asarray(src_sizes), dst,
                  np.asarray(dst_offsets), np.asarray(dst_sizes), names, crc32, adler32, walked, slot=slot,
                  after=wait)

    def copy_spans(self, src: np.ndarray, src_offsets: np.ndarray, dst: np.ndarray, dst_offsets: np.ndarray,
                   sizes: np.ndarray, slot: int = 0, wait: Any = None) -> None:
        self._run(copy_spans_cpu, src, src_offsets, dst, dst_offsets, sizes, slot=slot, after=wait)

    def place(self, src: np.ndarray, src_offsets: np.ndarray, table: np.ndarray, out: np.ndarray,
              disk_dtype: np.dtype, slot: int = 0, wait: Any = None, perm: tuple[int, ...] | None = None) -> None:
        fn = self._place_native if self.native and out.flags.c_contiguous and out.flags.writeable else place_cpu
        self._run(fn, src, src_offsets, table, out, disk_dtype, perm, slot=slot, after=wait)

    def _place_native(self, src: np.ndarray | None, at: Any, table: np.ndarray, out: np.ndarray,
                      disk_dtype: np.dtype, perm: tuple[int, ...] | None = None) -> None:
        """One native placement of the pieces at offsets ``at`` of ``src``, or (``src`` None) of
        the whole chunks ``at`` in buffers of their own (the chunk cache's)."""
        import gpu_zarr.engine.native as native

        if len(at) == 0:
            return
        nbytes = int(np.prod(table[0, :, 0])) * disk_dtype.itemsize
        if src is None:
            st = native.place_chunks(at, nbytes, table, out, disk_dtype, perm, self.native_threads)
        else:
            st = native.place(src, at, nbytes, table, out, disk_dtype, perm, self.native_threads)
        if (st != native.OK).any():
            k = int(np.flatnonzero(st != native.OK)[0])
            what = "piece" if src is not None else "cached chunk"
            raise ValueError(f"placing {what} {k}: {native.describe(int(st[k]))} (a bug: the placement table and "
                             "the buffers disagree)")

    def place_chunks(self, chunks: list[Any], table: np.ndarray, out: np.ndarray, disk_dtype: np.dtype,
                     perm: tuple[int, ...] | None = None) -> None:
        """Place whole decoded chunks held in separate buffers (the chunk cache's): one native
        call for all of them where the library is loaded (a viewer scrolling through 64^3
        chunks places a thousand a plane), else one numpy placement each."""
        if not chunks:
            return
        if self.native and out.flags.c_contiguous and out.flags.writeable:
            self._run(self._place_native, None, chunks, table, out, disk_dtype, perm)
            return
        zero = np.zeros(1, np.int64)
        for k, chunk in enumerate(chunks):
            self._run(place_cpu, chunk, zero, table[k:k + 1], out, disk_dtype, perm)

    def take(self, buf: np.ndarray, offset: int, nbytes: int, slot: int = 0) -> np.ndarray:
        """A copy of ``buf[offset:offset + nbytes]``, made after the slot's queued work."""
        copy = self.runtime.recycled.take(nbytes)  # a chunk the cache evicts comes back touched

        def fill() -> None:
            copy[:] = buf[offset:offset + nbytes]
        self._run(fill, slot=slot)
        return copy

    def fill(self, out: np.ndarray, table: np.ndarray, value: Any) -> None:
        _fill_boxes(out, table, value)

    def sync(self) -> None:
        return None

    def free_bytes(self) -> int | None:
        return None

    def finish(self, out: np.ndarray, post: tuple | None) -> np.ndarray:
        if post is None:
            return out
        res = out[post]
        if res.ndim and res.flags.c_contiguous and res.nbytes == out.nbytes:
            return res  # only axes dropped (a plane of a box): the box itself, no copy into fresh memory
        # np.array, not ascontiguousarray, which turns a 0-d result (all-integer index) into shape (1,)
        return np.array(res, order="C")


class AsyncCpuOps(CpuOps):
    """The CPU twin with overlap on: copies run on one worker thread per slot ("copy
    streams"), decode and place in order on one work thread per lane ("work streams"); events
    are futures. Used by tests to prove that the pipeline never refills a slot, nor reuses a
    lane's decoded buffer, before the work that reads it has finished.
    """

    overlap = True

    def __init__(self, slots: int = 3, lanes: int | None = None) -> None:
        super().__init__()  # each lane decodes on its own thread, one batch after the other
        self.lanes = max(1, min(slots, lanes or slots))
        self._copy = [ThreadPoolExecutor(1, thread_name_prefix=f"cpu-copy-{s}") for s in range(slots)]
        self._lanes = [ThreadPoolExecutor(1, thread_name_prefix=f"cpu-lane-{n}") for n in range(self.lanes)]
        self._last: list[Future[Any]] = []

    def _submit(self, pool: ThreadPoolExecutor, fn: Any, *args: Any, after: Any = None) -> Future[Any]:
        def run() -> None:
            if after is not None:
                after.result()
            fn(*args)
        fut = pool.submit(run)
        self._last.append(fut)
        return fut

    def _run(self, fn: Any, *args: Any, slot: int = 0, after: Any = None) -> Any:
        return self._submit(self._lanes[slot % self.lanes], fn, *args, after=after)

    def upload(self, host: np.ndarray, dev: np.ndarray, nbytes: int, slot: int = 0, after: Any = None) -> Any:
        def copy() -> None:
            dev[:nbytes] = host[:nbytes]
        return self._submit(self._copy[slot % len(self._copy)], copy, after=after)

    def wait(self, event: Any) -> None:
        if event is not None:
            event.result()

    def record(self, slot: int = 0) -> Any:
        return self._lanes[slot % self.lanes].submit(lambda: None)

    def sync(self) -> None:
        pending, self._last = self._last, []
        for fut in pending:
            fut.result()

    def close(self) -> None:
        for p in (*self._copy, *self._lanes):
            p.shutdown(wait=True)


class GpuOps:
    """cupy device buffers, pinned host staging, nvCOMP decode.

    Each slot copies on its own stream; decoding and placing happen in order on the work
    stream of the slot's lane (``slot % lanes``). nvCOMP's batched decode is latency-bound
    (a call takes 5-16 ms whatever it holds), so several lanes keep several calls in flight;
    each lane has its own decoded buffer and decoder scratch. CUDA events order a slot's
    copy before its decode, and the decode before the slot is refilled. Streams and pinned
    staging belong to the runtime.
    """

    name = "gpu"
    overlap = True
    on_device = True
    host_is_device = False
    native_decoders = False
    whole_chunks = False
    native_threads = 1

    def __init__(self, slots: int, runtime: Any, lanes: int = 1) -> None:
        try:
            import cupy
        except ImportError as exc:
            raise GPUUnavailable(f"the GPU path needs cupy, which is not installed: {INSTALL_HINT}") from exc
        try:
            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise GPUUnavailable("cupy found no CUDA device; use backend 'cpu' on this machine")
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            raise GPUUnavailable(f"cupy cannot reach a CUDA device ({exc}); check the NVIDIA driver "
                                 "(nvidia-smi) or use backend 'cpu'") from exc
        self.xp: Any = cupy
        self._cupy = cupy
        self._rt = self.runtime = runtime
        self.lanes = max(1, min(slots, lanes))
        self.copy_streams: list[Any]
        self.work_streams: list[Any]
        self.copy_streams, self.work_streams = self._rt.streams(max(1, slots), self.lanes)
        self.stream = self.work_streams[0]
        self._pending: dict[int, list[Any]] = {}  # per lane, decoded batches whose statuses are unread

    def _copy(self, slot: int) -> Any:
        return self.copy_streams[slot % len(self.copy_streams)]

    def _work(self, slot: int) -> Any:
        return self.work_streams[slot % self.lanes]

    def _after(self, event: Any, slot: int = 0) -> None:
        if event is not None:
            self._work(slot).wait_event(event)

    def needs_host_check(self, device_checks: bool, native_checks: bool) -> bool:
        return not device_checks

    def map_chunks(self, fn: Any, n: int) -> None:
        for k in range(n):
            fn(k)

    def scratch(self, nbytes: int, slot: int = 0) -> Any:
        """A device byte buffer allocated on the slot's work stream (cupy's pool reuses memory
        in the order of the stream it was allocated on: decode and copy_spans run there)."""
        with self._work(slot):
            return self._cupy.empty(max(nbytes, 1), np.uint8)

    def to_device(self, host: np.ndarray, slot: int = 0) -> Any:
        with self._work(slot):
            return self._cupy.asarray(host)

    def elementwise(self, fn: Any, n: int, slot: int = 0) -> None:
        """``fn(cupy, 0, n)`` with the slot's work stream current: its kernels queue there."""
        with self._work(slot):
            fn(self._cupy, 0, n)

    def unshuffle(self, src: Any, dec: Any, stream_raw: np.ndarray, stream_src: np.ndarray, stream_dst: np.ndarray,
                  b_first: np.ndarray, b_nsplit: np.ndarray, b_size: np.ndarray, b_ts: np.ndarray,
                  b_mode: np.ndarray, dst: Any, b_dst: np.ndarray, slot: int = 0, wait: Any = None) -> None:
        """One kernel launch on the slot's work stream (after the decodes queued there)."""
        from gpu_zarr.engine.codecs.shuffle import unshuffle_gpu

        s_addr = np.where(stream_raw, np.uint64(src.data.ptr) + stream_src.astype(np.uint64),
                          np.uint64(dec.data.ptr) + np.maximum(stream_dst, 0).astype(np.uint64))
        self._after(wait, slot)
        unshuffle_gpu(s_addr, b_first, b_nsplit, b_size, b_ts, b_mode, dst, b_dst, self._work(slot), runtime=self._rt)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        with self.stream:
            out = self._cupy.empty(shape, dtype)
        return out

    def host_buffers(self, nbytes: int, count: int) -> Any:
        """A lease of ``count`` pinned staging buffers from the runtime's shared, bounded pool."""
        return self._rt.pinned.lease(nbytes, count, self._rt.pinned_alloc)

    def device_buffer(self, nbytes: int, slot: int = 0) -> Any:
        s = self._work(slot)
        with s:
            buf = self._cupy.empty(max(nbytes, 1), np.uint8)
        s.synchronize()  # copy streams and kvikio write into it
        return buf

    def upload(self, host: np.ndarray, dev: Any, nbytes: int, slot: int = 0, after: Any = None) -> Any:
        """Copy staging to the device on the slot's stream, once ``after`` has happened."""
        s = self._copy(slot)
        if after is not None:
            s.wait_event(after)
        if nbytes:
            dev[:nbytes].set(host[:nbytes], stream=s)
        return s.record()

    def wait(self, event: Any) -> None:
        if event is not None:
            event.synchronize()

    def record(self, slot: int = 0) -> Any:
        """An event after the work queued so far on the slot's work stream."""
        return self._work(slot).record()

    def decode_batch(self, algo: str, src: Any, src_offsets: np.ndarray, src_sizes: np.ndarray, dst: Any,
                     dst_offsets: np.ndarray, dst_sizes: np.ndarray, names: Sequence[str] | None,
                     slot: int = 0, wait: Any = None, crc32: np.ndarray | None = None,
                     adler32: np.ndarray | None = None, walked: bool = False) -> None:
        """ONE nvCOMP batched call on the slot's work stream; CRC-32 / Adler-32 checked on the GPU
        (LZ4 blocks walked there first unless ``walked`` on the host)."""
        self._after(wait, slot)
        # one nvCOMP decoder (one scratch) per lane: the slots of a lane decode on its stream in order
        lane = slot % self.lanes
        # a batch's statuses are looked at later: waiting for them here would serialise the
        # lanes. The previous-but-one batch of this lane is checked now (long done: it bounds
        # what pending batches hold), the rest by sync() before the read returns.
        queue = self._pending.setdefault(lane, [])
        while len(queue) >= 2:
            queue.pop(0).check()
        pending = decode_batch_gpu(algo, src, src_offsets, src_sizes, dst, dst_offsets, dst_sizes, self._work(slot),
                                   names, lane, check=False, crc32=crc32, adler32=adler32, runtime=self._rt,
                                   walked=walked)
        if pending is not None:
            queue.append(pending)

    def copy_spans(self, src: Any, src_offsets: np.ndarray, dst: Any, dst_offsets: np.ndarray, sizes: np.ndarray,
                   slot: int = 0, wait: Any = None) -> None:
        self._after(wait, slot)
        copy_spans(src, src_offsets, dst, dst_offsets, sizes, self._work(slot), runtime=self._rt)

    def place(self, src: Any, src_offsets: np.ndarray, table: np.ndarray, out: Any, disk_dtype: np.dtype,
              slot: int = 0, wait: Any = None, perm: tuple[int, ...] | None = None) -> None:
        self._after(wait, slot)
        place_gpu(src, src_offsets, table, out, disk_dtype, self._work(slot), perm)

    def place_chunks(self, chunks: list[Any], table: np.ndarray, out: Any, disk_dtype: np.dtype,
                     perm: tuple[int, ...] | None = None) -> None:
        """Place whole decoded chunks held in separate device buffers: one kernel launch."""
        ptrs = np.fromiter((c.data.ptr for c in chunks), np.int64, len(chunks))
        place_gpu(None, ptrs, table, out, disk_dtype, self.stream, perm)

    def take(self, buf: Any, offset: int, nbytes: int, slot: int = 0) -> Any:
        """A device copy of ``buf[offset:offset + nbytes]``, ordered on the slot's work stream."""
        with self._work(slot):
            return buf[offset:offset + nbytes].copy()

    def fill(self, out: Any, table: np.ndarray, value: Any) -> None:
        with self.stream:
            _fill_boxes(out, table, value)

    def sync(self) -> None:
        """Wait for every stream, then look at the statuses of every decoded batch (raises
        CorruptChunkError naming the first bad chunk: the read's result is then discarded)."""
        for s in (*self.copy_streams, *self.work_streams):
            s.synchronize()
        pending = [p for queue in self._pending.values() for p in queue]
        self._pending.clear()
        for p in pending:
            p.check()

    def free_bytes(self) -> int:
        free, _ = self._cupy.cuda.runtime.memGetInfo()
        return int(free) + int(self._cupy.get_default_memory_pool().free_bytes())

    def finish(self, out: Any, post: tuple | None) -> Any:
        if post is None:
            return out
        with self.stream:
            res = self._cupy.array(out[post], order="C")  # 0-d stays 0-d
        self.stream.synchronize()
        return res


def ops_for(device: str, slots: int, lanes: int, runtime: Any) -> Ops:
    """``"gpu"`` or ``"cpu"``, with ``slots`` batches in flight and ``lanes`` work streams on the GPU,
    keeping what lives across reads in ``runtime``.

    The CPU's ops use the native library's whole-chunk decoders where it is loaded (the
    GPU path's exact twin, stream by stream, runs with ``GPU_ZARR_NATIVE=0`` and with
    ``CpuOps()`` made directly)."""
    if device == "gpu":
        return GpuOps(slots, runtime, lanes=lanes)
    if device == "cpu":
        from gpu_zarr import settings

        threads = int(settings.get("threads"))  # element steps split a batch's chunks over them
        ops = CpuOps(runtime.pool("cpu-decode", threads), threads, runtime=runtime)
        # with the native library, whole Blosc chunks decode natively (one call per batch) rather
        # than stream by stream as on the GPU; GPU_ZARR_NATIVE=0 runs the GPU's exact twin
        ops.whole_chunks = ops.native
        return ops
    raise ValueError(f"device must be 'gpu' or 'cpu', not {device!r}")
