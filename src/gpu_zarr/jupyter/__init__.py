"""The Jupyter half of napari-gpu-zarr: a loader widget for notebooks.

:class:`LoaderWidget` mirrors the napari dock (backend choice with the reasons, level
choice, Load with progress and Cancel, the result, the history table and the best-GiB/s
chart) over the same :class:`gpu_zarr.controller.LoaderController`. It needs ipywidgets:
``pip install "napari-gpu-zarr[jupyter]"``. Rich reprs of results, machine reports and
OME images, and notebook progress bars, need nothing beyond the base install.

Examples
--------
>>> from gpu_zarr.jupyter import LoaderWidget      # doctest: +SKIP
>>> LoaderWidget("image.ome.zarr")                 # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

__all__ = ["LoaderWidget"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'gpu_zarr.jupyter' has no attribute {name!r}")
    try:
        import ipywidgets  # noqa: F401
    except ImportError as exc:
        from gpu_zarr.errors import install_hint

        raise ImportError(
            f"gpu_zarr.jupyter.{name} needs ipywidgets, which is not installed: {install_hint('jupyter')}"
        ) from exc
    from gpu_zarr.jupyter import widget

    value = getattr(widget, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)
