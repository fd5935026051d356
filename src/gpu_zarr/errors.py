"""Errors raised by gpu_zarr.

Every message says what was expected, what was found and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "CorruptChunkError",
    "GPUUnavailable",
    "GpuZarrError",
    "NotAZarrError",
    "OutOfGPUMemory",
    "ReadCancelled",
    "UnsupportedArrayError",
]

INSTALL_HINT = 'pip install "napari-gpu-zarr[cuda13]"  (or [cuda12] for a CUDA 12 driver)'


class GpuZarrError(Exception):
    """Base class of the errors gpu_zarr raises on purpose."""


class GPUUnavailable(GpuZarrError, RuntimeError):
    """No usable CUDA GPU (cupy missing, no device, or driver problem)."""


class BackendUnavailable(GpuZarrError, RuntimeError):
    """A forced backend cannot serve this machine or this array."""


class UnsupportedArrayError(BackendUnavailable):
    """The direct engine cannot read this array (codec, order, dtype...); zarr-gpu can."""


class NotAZarrError(GpuZarrError, ValueError):
    """The path is not a zarr array or group."""


class CorruptChunkError(GpuZarrError, ValueError):
    """A chunk (or shard) on disk is truncated or corrupt."""


class OutOfGPUMemory(GpuZarrError, MemoryError):
    """The requested read does not fit in free GPU memory."""


class ReadCancelled(GpuZarrError):
    """A read was cancelled by its caller (widget's cancel button)."""
