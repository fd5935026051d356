"""The direct read engine: plan -> fetch -> decode -> place.

Public entry points: :func:`read` (the engine itself, GPU or its CPU twin),
:func:`read_region` (a selection through any backend, what napari layer data use) and
:func:`last_read_stats` (per-stage timings of the last engine read).
"""

from __future__ import annotations

from gpu_zarr.engine.pipeline import EngineOptions, last_read_stats, read

__all__ = ["EngineOptions", "last_read_stats", "read", "read_region"]


def read_region(array, selection=Ellipsis, *, backend: str = "auto", options: EngineOptions | None = None):
    """Read ``array[selection]`` through a backend.

    Parameters
    ----------
    array : zarr.Array or path
        Opened read-only (a path is opened read-only).
    selection : basic index
        Integers, slices (any step) and Ellipsis, as numpy.
    backend : {"auto", "kvikio", "zarr-gpu", "cpu"}
        "kvikio" is the direct engine; "auto" picks as :func:`gpu_zarr.zarr_io.choose_backend`.
    options : EngineOptions, optional
        Engine knobs (direct engine only).

    Returns
    -------
    cupy.ndarray or numpy.ndarray
        cupy for GPU backends, numpy for "cpu"; equal to ``array[selection]``.
    """
    from gpu_zarr.zarr_io import read_selection

    return read_selection(array, selection, prefer=backend, options=options).data
