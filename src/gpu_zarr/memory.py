"""Peak memory of a block of work: the host's (resident memory) and the GPU's (cupy's pool).

One definition of each, used by the writer's results (:class:`gpu_zarr.write.api.WriteResult`)
and by the benchmarks (the read bench's "peak extra GiB", the write bench's columns):

* :class:`HostMemory` -- the process's peak resident set during the block, above its value
  at the start. On Linux the kernel's high-water mark (``VmHWM``) is reset to the current
  resident size by writing ``5`` to ``/proc/self/clear_refs``, so ``VmHWM`` at the end minus
  ``VmRSS`` at the start is the peak growth, exactly (page granularity), with no sampling.
  Where that reset is refused (another OS, a locked-down ``/proc``), ``ru_maxrss`` gives a
  lower bound when the block set a new process-wide high-water mark, else nothing: ``method``
  says which.
* :class:`GpuMemory` -- growth of cupy's default memory pool during the block (after freeing
  its cached blocks), optionally with a sampled device-wide figure.
* :class:`PeakSampler` -- what a library call may measure without touching the process: a
  thread samples the resident set (and cupy's pool in use) every few milliseconds. The two
  above reset the kernel's high-water mark (which ``getrusage``'s ``ru_maxrss`` reports too),
  free cupy's cached blocks and synchronise the device: right for a benchmark, which owns its
  process, wrong inside a user's pipeline. The writer's results use this one.

Both are process-wide measures: work running beside the block (another thread's read or
write) is counted in, and a measurement started inside another one resets the high-water mark
for both (the outer one then misses what came before the inner one started).
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from typing import Any

__all__ = ["GpuMemory", "HostMemory", "PeakSampler"]

_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux


def _status_bytes(field: str) -> int | None:
    """``field`` (e.g. "VmRSS", "VmHWM") of /proc/self/status in bytes, or None."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(field.encode() + b":"):
                    return int(line.split()[1]) * 1024  # "VmHWM:   123456 kB"
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_high_water_mark() -> str | None:
    """Reset the kernel's ``VmHWM`` to the current resident size; None when done, else why not."""
    if not os.path.exists("/proc/self/clear_refs"):
        return "no /proc/self/clear_refs (not Linux)"
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError as exc:
        return f"/proc/self/clear_refs refused: {exc.strerror or exc}"
    return None


def _trim_heap() -> None:
    """Give the C heap's free memory back to the system (glibc's ``malloc_trim``; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class HostMemory:
    """Peak resident host memory of a block, above the resident size at its start.

    Parameters
    ----------
    trim : bool
        Return the C heap's free memory to the system first (glibc ``malloc_trim``). Memory
        freed by earlier work but kept by the allocator is reused without growing the resident
        set, so without it a block that follows other work can read low; with it, the block's
        fresh pages cost page faults again. The write benchmark trims (one process measures
        many writers); a write's own result does not.

    Attributes (after the block)
    ----------------------------
    peak_bytes : int or None
        Peak growth of the process's resident set during the block; None when unmeasured.
    method : str
        How it was measured: ``"VmHWM"`` (exact), ``"ru_maxrss (lower bound)"``, or
        ``"unmeasured: <why>"``.
    """

    def __init__(self, trim: bool = False) -> None:
        self.trim = trim
        self.peak_bytes: int | None = None
        self.method = "unmeasured: the block has not run"

    def __enter__(self) -> HostMemory:
        if self.trim:
            _trim_heap()
        self._why_not = _reset_high_water_mark()
        self._rss0 = _status_bytes("VmRSS")
        self._maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _MAXRSS_UNIT
        return self

    def __exit__(self, *exc: object) -> None:
        hwm = _status_bytes("VmHWM")
        if self._why_not is None and hwm is not None and self._rss0 is not None:
            self.peak_bytes, self.method = max(0, hwm - self._rss0), "VmHWM"
            return
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _MAXRSS_UNIT
        if self._rss0 is not None and maxrss > self._maxrss0:  # a new high-water mark was set in the block
            self.peak_bytes, self.method = max(0, maxrss - self._rss0), "ru_maxrss (lower bound)"
        else:
            self.peak_bytes, self.method = None, f"unmeasured: {self._why_not or 'no resident size'}"


class GpuMemory:
    """Peak GPU memory of a block (a read, a write).

    Two measures:

    * ``pool``: growth of cupy's default memory pool during the block, after
      ``free_all_blocks()`` before it. The pool keeps freed blocks until told, so its
      size after the block is its high-water mark: an upper bound of the peak bytes
      in use through cupy (nvCOMP scratch included when routed through the pool).
    * ``device`` (optional, ``sample=True``): lowest free device memory seen by a
      thread polling ``cudaMemGetInfo`` every ~1 ms, relative to the start. It sees
      allocations outside cupy too, but can miss short spikes.
    """

    def __init__(self, sample: bool = False, interval_s: float = 0.001) -> None:
        self.sample = sample
        self.interval_s = interval_s
        self.result: dict[str, Any] = {}

    def __enter__(self) -> GpuMemory:
        import cupy

        self._cupy = cupy
        self._pool = cupy.get_default_memory_pool()
        self._pool.free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
        self._used0 = self._pool.used_bytes()
        self._total0 = self._pool.total_bytes()
        self._free0 = cupy.cuda.runtime.memGetInfo()[0]
        self._min_free = self._free0
        self._stop = threading.Event()
        self._thread = None
        if self.sample:
            dev = cupy.cuda.Device().id

            def poll() -> None:
                cupy.cuda.runtime.setDevice(dev)
                while not self._stop.is_set():
                    free = cupy.cuda.runtime.memGetInfo()[0]
                    if free < self._min_free:
                        self._min_free = free
                    time.sleep(self.interval_s)

            self._thread = threading.Thread(target=poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        cupy = self._cupy
        cupy.cuda.runtime.deviceSynchronize()
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        free = cupy.cuda.runtime.memGetInfo()[0]
        self._min_free = min(self._min_free, free)
        self.result = {
            "pool_peak_bytes": int(self._pool.total_bytes() - self._total0),
            "pool_held_before_bytes": int(self._used0),
        }
        if self.sample:
            self.result["device_peak_bytes_sampled"] = int(self._free0 - self._min_free)


def _resident_bytes() -> int | None:
    """The process's resident set now (``/proc/self/statm``), or None off Linux."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class PeakSampler:
    """Peak growth of resident host memory (and of cupy's pool in use, with ``gpu``) during a
    block, sampled by a thread every ``interval_s``: nothing of the process is reset, freed or
    synchronised, so a library call can measure itself. A spike shorter than the interval can
    be missed; what a write holds for longer (its batches in flight) is not.

    Attributes (after the block)
    ----------------------------
    host_bytes, gpu_bytes : int or None
        Peak growth above the values at the start; None when not measurable here.
    method : str
    """

    def __init__(self, gpu: bool = False, interval_s: float = 0.002) -> None:
        self.gpu, self.interval_s = gpu, interval_s
        self.host_bytes: int | None = None
        self.gpu_bytes: int | None = None
        self.method = f"sampled every {interval_s * 1e3:g} ms"
        self._stop = threading.Event()
        self._pool: Any = None
        self._device: int | None = None
        self._rss0: int | None = None
        self._used0: int | None = None
        self._rss_max = 0
        self._used_max = 0

    def _pool_used(self) -> int | None:
        if self._pool is None:
            return None
        return int(self._pool.used_bytes())

    def _sample(self) -> None:
        rss, used = _resident_bytes(), self._pool_used()
        if rss is not None and self._rss0 is not None:
            self._rss_max = max(self._rss_max, rss)
        if used is not None:
            self._used_max = max(self._used_max, used)

    def _run(self) -> None:
        if self._device is not None:  # the pool answers for the thread's current device
            import cupy

            cupy.cuda.runtime.setDevice(self._device)
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> PeakSampler:
        self._pool = None
        if self.gpu:
            try:
                import cupy

                self._pool = cupy.get_default_memory_pool()
                self._device = int(cupy.cuda.runtime.getDevice())
            except Exception:  # noqa: BLE001 - no cupy after all: host only
                self._pool = self._device = None
        self._rss0 = _resident_bytes()
        self._rss_max = self._rss0 or 0
        self._used0 = self._pool_used()
        self._used_max = self._used0 or 0
        self._thread = threading.Thread(target=self._run, name="gpu-zarr-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        if self._rss0 is not None:
            self.host_bytes = max(0, self._rss_max - self._rss0)
        else:
            self.method = "host: unmeasured (no /proc/self/statm)"
        if self._used0 is not None:
            self.gpu_bytes = max(0, self._used_max - self._used0)
