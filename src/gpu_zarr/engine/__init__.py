"""The direct read engine: plan -> fetch -> decode -> place.

Public entry points: :func:`read` (the engine itself, GPU or its CPU twin; returns the data
and the read's stats), :func:`read_many` (boxes of several arrays of one chunk format, one
read), :class:`EngineOptions`, and :func:`get_runtime` (the owner of what
lives across reads). The engine imports nothing above it: backend choice and
``read_region`` live in :mod:`gpu_zarr.zarr_io`.
"""

from __future__ import annotations

from gpu_zarr.engine.pipeline import EngineOptions, EngineResult, decode_chunks, last_read_stats, read, read_many
from gpu_zarr.engine.runtime import close_runtime, get_runtime

__all__ = ["EngineOptions", "EngineResult", "close_runtime", "decode_chunks", "get_runtime", "last_read_stats",
           "read", "read_many"]

