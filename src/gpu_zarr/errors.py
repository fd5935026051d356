"""Errors raised by gpu_zarr.

Every message says what was expected, what was found and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "BenchReaderFailed",
    "CorruptChunkError",
    "GPUUnavailable",
    "GpuZarrError",
    "InvalidOmeMetadata",
    "NotAZarrError",
    "NotOmeZarrError",
    "OutOfGPUMemory",
    "OutOfHostMemory",
    "OutOfMemory",
    "ReadCancelled",
    "UnsafeArrayError",
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


class UnsafeArrayError(NotAZarrError):
    """An array gpu_zarr refuses to open: Python-object data, or a codec that runs code (pickle)."""


class CorruptChunkError(GpuZarrError, ValueError):
    """A chunk (or shard) on disk is truncated or corrupt."""


class OutOfMemory(GpuZarrError, MemoryError):
    """The requested read does not fit in free memory (GPU or host)."""


class OutOfGPUMemory(OutOfMemory):
    """The requested read does not fit in free GPU memory."""


class OutOfHostMemory(OutOfMemory):
    """The requested read does not fit in the host's available memory."""


class NotOmeZarrError(NotAZarrError):
    """The path is a zarr node but carries no OME-NGFF ``multiscales`` metadata."""


class InvalidOmeMetadata(GpuZarrError, ValueError):
    """OME-NGFF metadata is present but malformed or inconsistent with the arrays."""


class ReadCancelled(GpuZarrError):
    """A read was cancelled by its caller (widget's cancel button)."""


class BenchReaderFailed(GpuZarrError):
    """A benchmark reader failed; its error is already written into the reader's record."""
