"""The one memory-fit check: does a read fit, with headroom, before anything is allocated."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable

from gpu_zarr import settings
from gpu_zarr.errors import INSTALL_HINT, GPUUnavailable, OutOfGPUMemory, OutOfHostMemory

__all__ = ["check_fits", "device_memory", "headroom_bytes", "host_available_bytes", "nbytes_of"]

GiB = 1 << 30
MiB = 1 << 20


def nbytes_of(shape: Iterable[int], itemsize: int = 1) -> int:
    """Bytes of an array of ``shape``, in Python integers: never wraps (``np.prod(...,
    dtype=np.int64)`` wraps to 0 or a negative number for shapes like ``[2**32, 2**32]``, and a
    wrapped size passes every fit check). Negative extents count as 0."""
    return math.prod([max(int(s), 0) for s in shape]) * int(itemsize)


def headroom_bytes(total: int) -> int:
    """GPU memory every read leaves free: ``settings.headroom_bytes``, or by default the
    larger of 512 MiB and 5 % of the device (for napari, the CUDA context, other work)."""
    fixed = settings.get("headroom_bytes")
    return fixed if fixed else max(512 * MiB, total // 20)


def device_memory() -> tuple[int, int]:
    """(free, total) bytes of the current CUDA device; cupy's cached free blocks count as free."""
    try:
        import cupy
    except ImportError as exc:
        raise GPUUnavailable(f"cupy is not installed: {INSTALL_HINT}") from exc
    free, total = cupy.cuda.runtime.memGetInfo()
    return int(free) + int(cupy.get_default_memory_pool().free_bytes()), int(total)


#: host reads of at most this many bytes are not checked against the available memory
_HOST_SURE = 64 << 20


def host_available_bytes() -> int | None:
    """Memory the host can still give (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(result_bytes: int, scratch_bytes: int = 0, *, device: str = "gpu",
               what: str | Callable[[], str] = "the read", free_total: tuple[int, int] | None = None) -> None:
    """Raise OutOfGPUMemory or OutOfHostMemory (saying how much was needed, how much is free,
    and what to do) unless the result's bytes plus the scratch the read needs beside it
    (buffers, decoder scratch), plus headroom on the GPU, fit on ``device`` now.

    ``what``: what is read, for the message (a callable is called only for a message, not on
    every plane); ``free_total``: (free, total) device bytes when the caller already knows them.
    """
    need = int(result_bytes) + int(scratch_bytes)
    if device == "cpu" and need <= _HOST_SURE:  # a viewer's plane: /proc/meminfo is not read for it
        return
    if callable(what):
        what = what()
    if device == "cpu":
        avail = host_available_bytes()
        if avail is not None and need > avail:
            raise OutOfHostMemory(
                f"{what} needs {need / GiB:,.2f} GiB of host memory ({result_bytes / GiB:,.2f} GiB for the "
                f"result), but only {avail / GiB:,.2f} GiB is available. Read a region instead "
                "(gpu_zarr.zarr_io.read_region(array, selection)) or a coarser level.")
        return
    free, total = free_total if free_total is not None else device_memory()
    room = headroom_bytes(total)
    if need + room > free:
        raise OutOfGPUMemory(
            f"{what} needs {result_bytes / GiB:,.2f} GiB of GPU memory for the result plus "
            f"{scratch_bytes / GiB:,.2f} GiB of scratch and {room / GiB:.2f} GiB of headroom, but only "
            f"{free / GiB:,.2f} GiB of {total / GiB:,.2f} GiB is free. Read a region instead "
            "(gpu_zarr.zarr_io.read_region(array, selection)), a coarser level, free GPU memory, "
            "or use a GPU with more memory.")
