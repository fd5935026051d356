"""kvikio reader: chunk and shard bytes read by kvikio's thread pool, decoded on the GPU.

This is the ``"kvikio"`` backend of :func:`gpu_zarr.zarr_io.read_zarr_to_gpu` and the one
place the kvikio read path is exposed: the direct engine (:mod:`gpu_zarr.engine`) with
kvikio as its reader (GDS native where the system has it, POSIX compat mode otherwise).
It serves the codecs the engine decodes (see :func:`supports`), zarr v2 and v3, sharded or
not, every numeric dtype and both byte orders; missing chunks read as the fill value.
Anything else raises :class:`~gpu_zarr.errors.UnsupportedArrayError`, which ``auto`` uses
to fall back to zarr-gpu.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_zarr.engine import EngineOptions, EngineResult, read
from gpu_zarr.engine.layout import Layout
from gpu_zarr.engine.metadata import describe, layout_of
from gpu_zarr.errors import INSTALL_HINT, BackendUnavailable, UnsupportedArrayError
from gpu_zarr.store import open_array

__all__ = ["describe", "read_with_stats", "read_zarr_via_kvikio", "supports"]


def supports(array_or_path: Any, *, storage_options: Mapping[str, Any] | None = None) -> tuple[bool, str]:
    """Whether the kvikio reader can serve this array, and why (not).

    ``storage_options``: options of a remote store when ``array_or_path`` is a URL.

    Returns
    -------
    (bool, str)
    """
    try:
        lay = layout_of(open_array(array_or_path, storage_options))
    except UnsupportedArrayError as exc:
        return False, str(exc)
    return True, describe(lay)


def read_with_stats(array: Any, selection: Any = Ellipsis, *, layout: Layout | None = None,
                    options: EngineOptions | None = None,
                    storage_options: Mapping[str, Any] | None = None) -> EngineResult:
    """Read ``array[selection]`` onto the GPU with the engine; the data and the read's stats.

    Parameters
    ----------
    array : zarr.Array or path
    selection : basic index
    layout : Layout, optional
        Already computed by :func:`gpu_zarr.engine.metadata.layout_of` (saves re-parsing).
    options : EngineOptions, optional
    storage_options : mapping, optional
        Options of a remote store when ``array`` is a URL (see :mod:`gpu_zarr.location`).

    Returns
    -------
    gpu_zarr.engine.EngineResult
    """
    return read(None if layout is not None else open_array(array, storage_options), selection, device="gpu",
                options=options, layout=layout)


def read_zarr_via_kvikio(array_path: Any, selection: Any = Ellipsis, *, threads: int | None = None,
                         options: EngineOptions | None = None,
                         storage_options: Mapping[str, Any] | None = None) -> Any:
    """Read a zarr array (or a selection of it) onto the GPU with kvikio.

    Parameters
    ----------
    array_path : str, pathlib.Path or zarr.Array
    selection : basic index, optional
    threads : int, optional
        kvikio thread-pool size (kvikio's default is 1; the engine uses at least 8).
    options : EngineOptions, optional
    storage_options : mapping, optional
        Options of a remote store when ``array_path`` is a URL (see :mod:`gpu_zarr.location`).

    Returns
    -------
    cupy.ndarray

    Notes
    -----
    Without nvidia-fs (e.g. in a VM) kvikio runs in POSIX compat mode: reads go through
    host bounce buffers, still in parallel. Never force ``KVIKIO_COMPAT_MODE=OFF`` there.
    """
    try:
        import kvikio  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailable(f"kvikio is not installed: {INSTALL_HINT}") from exc
    opts = (options or EngineOptions()).with_(reader="kvikio", **({"threads": threads} if threads else {}))
    return read_with_stats(array_path, selection, options=opts, storage_options=storage_options).data
