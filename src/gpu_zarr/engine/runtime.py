"""The one owner of what lives across reads.

A :class:`Runtime` holds the engine's thread pools, readers, CUDA streams, the pinned host
staging (one bounded pool shared by every thread, not one per thread), and any other
long-lived resource a stage registers with :meth:`Runtime.resource` (nvCOMP decoders and
their scratch, kernels, caches). It is created lazily by :func:`get_runtime`, is safe to
use from many threads at once (napari slices from several), reports what it holds
(:meth:`Runtime.report`) and releases everything with :meth:`Runtime.close`; the next
:func:`get_runtime` then starts a fresh one.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_zarr import settings
from gpu_zarr.errors import GPUFault

MiB = 1 << 20

__all__ = ["HostPool", "Recycled", "Runtime", "host_empty", "close_runtime", "get_runtime", "faults_as_errors", "gpu_fault",
           "is_gpu_fault", "record_gpu_fault"]

#: CUDA's sticky errors: after one, every call on the process's context fails
_STICKY = ("IllegalAddress", "LaunchFailure", "IllegalInstruction", "MisalignedAddress", "HardwareStackError",
           "InvalidPc", "ILLEGAL_ADDRESS", "LAUNCH_FAILED", "ILLEGAL_INSTRUCTION", "MISALIGNED_ADDRESS",
           "HARDWARE_STACK_ERROR", "INVALID_PC", "an illegal memory access", "unspecified launch failure")
#: what faulted the GPU in this process (at most one entry: the first fault). Process-wide, as
#: the CUDA context is: no Runtime can outlive it.
_fault: list[str] = []
_fault_lock = threading.Lock()


def is_gpu_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a CUDA error that leaves the process's context unusable (an illegal
    address or a failed launch in a kernel), as cupy raises it."""
    return type(exc).__name__ in ("CUDARuntimeError", "CUDADriverError") and any(
        s in str(exc) for s in _STICKY)


def record_gpu_fault(what: str) -> None:
    """Remember that the GPU faulted (``what``: while doing what): from now on
    :func:`gpu_zarr.capabilities.probe` reports no usable GPU, so ``auto`` reads on the CPU, and a GPU read says why at once."""
    with _fault_lock:
        if not _fault:
            _fault.append(what)


@contextlib.contextmanager
def faults_as_errors(names: Callable[[], tuple[Sequence[str], int]] | None = None) -> Iterator[None]:
    """A CUDA fault raised in the block becomes a :class:`GPUFault` naming the chunks whose
    decode was in flight (``names()``: up to 8 of them and how many more), and is recorded:
    later GPU reads in this process are refused at once."""
    try:
        yield
    except Exception as exc:
        if not is_gpu_fault(exc):
            raise
        shown, more = names() if names is not None else ([], 0)
        listed = ", ".join(shown) + (f" and {more} more" if more else "") if shown else "of this read"
        record_gpu_fault(f"decoding chunks {listed}")
        raise GPUFault(f"the GPU faulted while decoding chunks {listed} ({type(exc).__name__}: {exc}). nvCOMP's "
                       "decoders are undefined on corrupt input, and damage inside a compressed block passes the "
                       "checks that run before them: one of these chunks is most likely corrupt. CUDA cannot recover "
                       "a context after a fault, so the GPU is unusable until Python restarts; read the array with "
                       "backend='cpu' to find the damaged chunk (its error names it).") from exc


def gpu_fault() -> str | None:
    """What faulted the GPU in this process, or None."""
    return _fault[0] if _fault else None


def host_empty(nbytes: int) -> np.ndarray:
    """``nbytes`` of ordinary host memory (uint8, untouched). Buffers of 4 MiB and more are mapped
    in 4 KiB pages: numpy asks for transparent huge pages there, whose first touch is slow on some VMs."""
    if nbytes < 4 << 20:
        return np.empty(max(0, nbytes), np.uint8)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.uint8)


@dataclass
class _Resource:
    value: Any
    close: Callable[[Any], None] | None
    nbytes: Callable[[Any], int] | None


class HostPool:
    """Host buffers shared by all reads and reused, bounded by ``settings.pinned_bytes``.

    The runtime keeps two: page-locked staging for host-to-device copies (``pinned``), and
    ordinary memory for the CPU's small reads (``host_scratch``: reused because fresh memory
    costs a page fault per 4 KiB). A read leases the buffers it needs for its duration;
    concurrent reads get distinct buffers. When the bound is reached and nothing is free, a
    lease gets a fresh ordinary buffer instead: slower, never a wait or a failure.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[np.ndarray] = []
        self.held_bytes = 0  # bytes allocated by the pool (free or leased)
        self.pageable_leases = 0

    def _take(self, nbytes: int, alloc: Callable[[int], np.ndarray]) -> tuple[np.ndarray, bool]:
        if nbytes > MiB:
            # a size class (1/16 of the next power of two): reads whose batches differ by a few
            # bytes share buffers instead of each allocating (and pinning) its own
            granule = 1 << max(20, nbytes.bit_length() - 4)
            nbytes = -(-nbytes // granule) * granule
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if b.nbytes >= nbytes]
            if fits:
                return self._free.pop(min(fits, key=lambda i: self._free[i].nbytes)), True
            limit = settings.get("pinned_bytes")
            # drop free buffers that are too small to make room for a bigger one
            while self._free and self.held_bytes + nbytes > limit:
                self.held_bytes -= self._free.pop().nbytes
            if self.held_bytes + nbytes > limit:
                self.pageable_leases += 1
                return host_empty(nbytes), False
            self.held_bytes += nbytes
        return alloc(nbytes), True

    @contextlib.contextmanager
    def lease(self, nbytes: int, count: int, alloc: Callable[[int], np.ndarray]) -> Iterator[list[np.ndarray]]:
        """``count`` host buffers of at least ``nbytes`` each, returned to the pool on exit."""
        taken = [self._take(max(nbytes, 1), alloc) for _ in range(count)]
        try:
            yield [buf[:nbytes] for buf, _ in taken]
        finally:
            with self._lock:
                self._free.extend(buf for buf, pinned in taken if pinned)

    def clear(self) -> None:
        with self._lock:
            for b in self._free:
                self.held_bytes -= b.nbytes
            self._free.clear()


class Recycled:
    """Host arrays a read hands on (a CPU read's result; a remote answer kept in the byte cache)
    whose memory comes back, already touched, once the last array over it is gone.

    Fresh memory costs a page fault per 4 KiB (on a VM the host faults it in too), and memory
    the caller frees goes back to the system: for a viewer's plane those faults cost more than
    decoding it. A block is lent to the caller through a small
    buffer object over it; when that object dies (no array or view over it is left) the block
    returns to a free list. Arrays under 256 KiB or over ``pinned_bytes // 4`` are plain
    ``np.empty``; at most ``pinned_bytes // 2`` bytes of free blocks are kept (the oldest go
    first); :meth:`Runtime.close` frees them.
    """

    MIN_BYTES = 256 << 10
    lasting = True  # as a remote read's landing (engine.remote.Bodies): its answers may be cached

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a block can come back on any thread, in a GC run inside empty()
        self._free: list[np.ndarray] = []  # oldest first
        self._lent: dict[int, tuple[Any, np.ndarray]] = {}  # id(weak reference) -> it, the block lent
        self.free_bytes = 0
        self.reused = 0  # blocks lent again (stats, tests)

    @property
    def limit(self) -> int:
        """The most bytes one array may have and still be recycled."""
        return int(settings.get("pinned_bytes")) // 4

    def take(self, nbytes: int) -> np.ndarray:
        """``nbytes`` bytes (a remote read's answers land in them)."""
        return self.empty(max(1, int(nbytes)))

    def empty(self, shape: Sequence[int] | int, dtype: Any = np.uint8) -> np.ndarray:
        """Like ``np.empty(shape, dtype)``: C order, contents undefined, owned by the caller."""
        dt = np.dtype(dtype)
        shp = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)
        nbytes = math.prod(shp) * dt.itemsize  # (not np.prod: slow on a tuple, on every plane's buffers)
        if nbytes < self.MIN_BYTES or nbytes > self.limit or dt.hasobject:
            return np.empty(shp, dt)
        return np.frombuffer(self._lend(nbytes), dt, count=nbytes // dt.itemsize).reshape(shp)

    def _lend(self, nbytes: int) -> Any:
        """A buffer object over a block of at least ``nbytes`` (reused when one is free) whose
        death gives the block back."""
        granule = 1 << max(16, nbytes.bit_length() - 4)  # size classes: 1/16 of the next power of two
        size = -(-nbytes // granule) * granule
        with self._lock:
            for k in range(len(self._free) - 1, -1, -1):  # the newest of this size
                if self._free[k].nbytes == size:
                    self.free_bytes -= size
                    self.reused += 1
                    return self._track(self._free.pop(k))
        block = host_empty(size)
        with self._lock:
            return self._track(block)

    def _track(self, block: np.ndarray) -> Any:  # (under the lock)
        lent = (ctypes.c_ubyte * block.nbytes).from_buffer(block)
        # a plain weak reference, kept here until it fires (weakref.finalize costs more)
        ref = weakref.ref(lent, self._returned)
        self._lent[id(ref)] = (ref, block)
        return lent

    def _returned(self, ref: Any) -> None:
        with self._lock:
            _, block = self._lent.pop(id(ref), (None, None))
        if block is None:
            return
        bound = int(settings.get("pinned_bytes")) // 2
        with self._lock:
            self._free.append(block)
            self.free_bytes += block.nbytes
            while self.free_bytes > bound:
                self.free_bytes -= self._free.pop(0).nbytes

    def clear(self) -> None:
        """Drop the free blocks (those lent out come back to an empty list, within the bound)."""
        with self._lock:
            self._free.clear()
            self.free_bytes = 0


class Runtime:
    """Long-lived engine state: pools, readers, streams, pinned staging, registered resources."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._pools: dict[tuple[str, int], ThreadPoolExecutor] = {}
        self._resources: dict[Hashable, _Resource] = {}
        self.pinned = HostPool()  # page-locked staging (leased with pinned_alloc)
        self.host_scratch = HostPool()  # ordinary memory, already touched: the CPU's small reads
        self.recycled = Recycled()  # memory of arrays handed on (results, cached answers), taken back
        self.last = threading.local()  # per thread: the most recent read's stats and backend choice

    # -- thread pools -------------------------------------------------------------
    def pool(self, name: str, threads: int) -> ThreadPoolExecutor:
        """A thread pool kept for the life of the runtime (starting threads per read costs)."""
        key = (name, threads)
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                pool = self._pools[key] = ThreadPoolExecutor(threads, thread_name_prefix=f"gpu-zarr-{name}")
            return pool

    # -- registered resources -----------------------------------------------------
    def resource(self, key: Hashable, factory: Callable[[], Any], *, close: Callable[[Any], None] | None = None,
                 nbytes: Callable[[Any], int] | None = None) -> Any:
        """The object registered under ``key`` (e.g. ``("nvcomp", "zstd", device, stream)``),
        made by ``factory()`` on first use (once, under the runtime's lock). :meth:`close` calls
        ``close(obj)``; ``nbytes(obj)`` is the memory it holds, for :meth:`report`."""
        with self._lock:
            res = self._resources.get(key)
            if res is None:
                res = self._resources[key] = _Resource(factory(), close, nbytes)
            return res.value

    def drop(self, key: Hashable) -> None:
        """Release one registered resource (no error when absent)."""
        with self._lock:
            res = self._resources.pop(key, None)
        if res is not None and res.close is not None:
            res.close(res.value)

    # -- GPU pieces ---------------------------------------------------------------
    def streams(self, copies: int, lanes: int = 1) -> tuple[list[Any], list[Any]]:
        """``copies`` copy streams and ``lanes`` work streams (non-blocking) of the current device.

        The same streams are handed to every read: concurrent reads order their work on them.
        """
        import cupy

        dev = cupy.cuda.runtime.getDevice()
        with self._lock:
            pools = self.resource(("streams", dev), lambda: {"copy": [], "work": []})
            for kind, n in (("copy", copies), ("work", lanes)):
                while len(pools[kind]) < n:
                    pools[kind].append(cupy.cuda.Stream(non_blocking=True))
            return pools["copy"][:copies], pools["work"][:lanes]

    @staticmethod
    def pinned_alloc(nbytes: int) -> np.ndarray:
        """Allocate page-locked host memory (about 0.5 s per GiB: keep and reuse it)."""
        import cupy

        mem = cupy.cuda.alloc_pinned_memory(nbytes)
        return np.frombuffer(mem, np.uint8, nbytes)

    # -- decoded-chunk cache ---------------------------------------------------------
    def chunk_cache(self, device: str) -> Any:
        """The bounded LRU cache of decoded chunks for ``device`` ("gpu": the current CUDA
        device; "cpu"), sized by ``settings`` ``cache_bytes`` when first used."""
        from gpu_zarr.engine.cache import ChunkCache

        key: tuple[Any, ...] = ("chunk-cache", device)
        if device == "gpu":
            import cupy

            key = (*key, cupy.cuda.runtime.getDevice())
        return self.resource(key, lambda: ChunkCache(settings.get("cache_bytes")), close=lambda c: c.clear(),
                             nbytes=lambda c: c.nbytes)

    def shard_indexes(self) -> Any:
        """Checked shard indexes of local files kept across reads (a 64 MiB
        :class:`~gpu_zarr.engine.cache.ChunkCache` keyed by shard path, size and mtime): a
        viewer's plane reads touch the same shards again and again."""
        from gpu_zarr.engine.cache import ChunkCache

        return self.resource("shard-indexes", lambda: ChunkCache(64 * MiB), close=lambda c: c.clear(),
                             nbytes=lambda c: c.nbytes)

    def clear_caches(self) -> int:
        """Drop every cached decoded chunk (the widget's "Free GPU memory"); returns the bytes
        that were held on the GPU."""
        with self._lock:
            caches = [(k, r.value) for k, r in self._resources.items()
                      if isinstance(k, tuple) and k[:1] == ("chunk-cache",)]
        freed = 0
        for key, cache in caches:
            if key[1] == "gpu":
                freed += cache.nbytes
            cache.clear()
        self.shard_indexes().clear()
        return freed

    # -- report / close -----------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """What the runtime holds now (threads, streams, pinned bytes, resources)."""
        with self._lock:
            resources = {}
            for key, res in self._resources.items():
                size = res.nbytes(res.value) if res.nbytes is not None else None
                resources[" ".join(map(str, key if isinstance(key, tuple) else (key,)))] = size
            return {
                "thread_pools": {name: threads for name, threads in self._pools},
                "pinned_bytes": self.pinned.held_bytes,
                "pinned_limit": settings.get("pinned_bytes"),
                "pageable_fallbacks": self.pinned.pageable_leases,
                "host_scratch_bytes": self.host_scratch.held_bytes,
                "recycled_free_bytes": self.recycled.free_bytes,
                "resources": resources,
            }

    def close(self) -> None:
        """Release everything: pools shut down, resources closed, pinned memory freed."""
        with self._lock:
            pools, self._pools = self._pools, {}
            resources, self._resources = self._resources, {}
        for pool in pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
        for res in resources.values():
            if res.close is not None:
                with contextlib.suppress(Exception):
                    res.close(res.value)
        self.pinned.clear()
        self.host_scratch.clear()
        self.recycled.clear()


_current: Runtime | None = None
_current_lock = threading.Lock()


def get_runtime() -> Runtime:
    """The process-wide runtime, created on first use."""
    global _current
    with _current_lock:
        if _current is None:
            _current = Runtime()
        return _current


def close_runtime() -> None:
    """Close the process-wide runtime (the next :func:`get_runtime` makes a new one)."""
    global _current
    with _current_lock:
        rt, _current = _current, None
    if rt is not None:
        rt.close()
