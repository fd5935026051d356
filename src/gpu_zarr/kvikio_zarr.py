"""kvikio reader: chunk and shard bytes read by kvikio's thread pool, decoded on the GPU.

This is the ``"kvikio"`` backend of :func:`gpu_zarr.zarr_io.read_zarr_to_gpu`: the direct
engine (:mod:`gpu_zarr.engine`) with kvikio as its reader. It serves uncompressed and zstd
arrays, zarr v2 and v3, sharded or not, C order, every numeric dtype and both byte orders;
missing chunks read as the fill value. Anything else raises
:class:`~gpu_zarr.errors.UnsupportedArrayError`, which ``auto`` uses to fall back to zarr-gpu.
"""

from __future__ import annotations

from gpu_zarr.engine import EngineOptions, read
from gpu_zarr.engine.layout import layout_of
from gpu_zarr.errors import INSTALL_HINT, BackendUnavailable, UnsupportedArrayError

__all__ = ["read_zarr_via_kvikio", "supports"]


def supports(array_or_path) -> tuple[bool, str]:
    """Whether the kvikio reader can serve this array, and why (not).

    Returns
    -------
    (bool, str)
    """
    from gpu_zarr.zarr_io import open_array

    try:
        lay = layout_of(open_array(array_or_path))
    except UnsupportedArrayError as exc:
        return False, str(exc)
    return True, f"{lay.codec} zarr v{lay.zarr_format}" + (", sharded" if lay.sharded else "")


def read_zarr_via_kvikio(array_path, selection=Ellipsis, *, threads: int | None = None,
                         options: EngineOptions | None = None):
    """Read a zarr array (or a selection of it) onto the GPU with kvikio.

    Parameters
    ----------
    array_path : str, pathlib.Path or zarr.Array
    selection : basic index, optional
    threads : int, optional
        kvikio thread-pool size (kvikio's default is 1; the engine uses at least 8).
    options : EngineOptions, optional

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
    opts = options or EngineOptions()
    opts = EngineOptions(**{**opts.__dict__, "reader": "kvikio", **({"threads": threads} if threads else {})})
    return read(array_path, selection, device="gpu", options=opts)
