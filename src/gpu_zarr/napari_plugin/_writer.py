"""napari writer: image and labels layers saved as one OME-Zarr 0.5 image (File > Save Layers).

The image layers (one, or several of one shape and dtype: stacked as the ``c`` axis, named
after the layers) become the image; the labels layers (of the image's shape without ``c``)
go under ``labels/<layer name>``; both get their pyramids from
:func:`gpu_zarr.write_ome_zarr` (mean for the image, mode for labels), encoded on the GPU
where there is one. A multiscale layer is saved from its full-resolution level.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpu_zarr.errors import UsageError

__all__ = ["write_layers"]

_AXES = {1: "x", 2: "yx", 3: "zyx", 4: "tzyx", 5: "tzyx"}


def _full(data: Any, meta: dict) -> np.ndarray:
    level0 = data[0] if meta.get("multiscale") else data
    return np.asarray(level0)


def _axes(ndim: int, channel: bool) -> str:
    spatial = _AXES.get(ndim)
    if spatial is None or len(spatial) != ndim:
        raise UsageError(f"the OME-Zarr writer saves layers of 1 to 4 dimensions (t, z, y, x); this one has {ndim}")
    if not channel:
        return spatial
    return spatial.replace("z", "cz") if "t" in spatial else "c" + spatial


def write_layers(path: str, layer_data: Sequence[tuple[Any, dict, str]]) -> list[str]:
    """Write napari layers (``(data, meta, layer_type)``) at ``path`` as OME-Zarr; returns ``[path]``.

    Raises
    ------
    UsageError
        No image layer, image layers of different shapes, or labels not matching the image.
    DestinationExists
        ``path`` exists: napari never overwrites a store here (remove it, or save elsewhere).
    """
    from gpu_zarr.write.omezarr import write_ome_zarr

    images = [(_full(d, m), m) for d, m, t in layer_data if t == "image"]
    labels = [(_full(d, m), m) for d, m, t in layer_data if t == "labels"]
    if not images:
        raise UsageError("the OME-Zarr writer needs an image layer (labels are saved with their image)")
    first, meta = images[0]
    if meta.get("rgb"):  # (..., y, x, 3|4) -> channels first
        first = np.moveaxis(first, -1, 0)
        stack, names = first, ["R", "G", "B", "A"][: first.shape[0]]
        spatial_ndim = first.ndim - 1
    elif len(images) > 1:
        shapes = {(a.shape, a.dtype) for a, _ in images}
        if len(shapes) > 1:
            raise UsageError(f"image layers of different shapes or dtypes {sorted(map(str, shapes))}: save them one "
                             "at a time (several image layers are stacked as the channels of one image)")
        stack = np.stack([a for a, _ in images])
        names = [str(m.get("name", k)) for k, (_, m) in enumerate(images)]
        spatial_ndim = first.ndim
    else:
        stack, names, spatial_ndim = first, None, first.ndim
    channel = names is not None
    axes = _axes(spatial_ndim, channel)
    scale = list(meta.get("scale") or [1.0] * spatial_ndim)[-spatial_ndim:]
    if channel:
        scale.insert(axes.index("c"), 1.0)
        stack = np.moveaxis(stack, 0, axes.index("c"))
    label_map = {}
    for arr, m in labels:
        want = tuple(s for k, s in enumerate(stack.shape) if not (channel and k == axes.index("c")))
        if arr.shape != want:
            raise UsageError(f"labels layer {m.get('name')!r} has shape {arr.shape}; the image's is {want}")
        label_map[str(m.get("name", f"labels{len(label_map)}"))] = arr
    write_ome_zarr(stack, path, axes=axes, scale=scale, channel_names=names, labels=label_map or None,
                   name=str(meta.get("name") or os.path.basename(path.rstrip("/")).removesuffix(".zarr")))
    return [path]
