"""napari reader: OME-Zarr 0.4/0.5 images and labels, plain zarr v2/v3 arrays and groups.

Layer data are :class:`gpu_zarr.lazy.GpuLazyArray` (lists of them for pyramids), so
every slice napari asks for is read and decoded on the GPU when there is one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import zarr

from gpu_zarr.errors import INSTALL_HINT, NotAZarrError
from gpu_zarr.lazy import GpuLazyArray
from gpu_zarr.location import is_url
from gpu_zarr.napari_plugin._window import ViewerGrid, ViewerLevel
from gpu_zarr.omezarr import (
    Channel,
    OmeImage,
    find_zarr_node,
    is_ome_zarr,
    label_images,
    ome_attrs,
    open_labels,
    open_node,
    open_ome,
)
from gpu_zarr.plate import Plate, TiledArray, Well, is_plate_attrs, is_well_attrs, open_plate, open_well
from gpu_zarr.store import arrays_of

__all__ = ["napari_get_reader", "read_for_napari", "read_zarr_layers"]

LayerData = tuple[Any, dict[str, Any], str]

# napari's own names for the colours OME files most often use.
_NAMED = {
    "#FF0000": "red", "#00FF00": "green", "#0000FF": "blue", "#FF00FF": "magenta",
    "#00FFFF": "cyan", "#FFFF00": "yellow", "#FFFFFF": "gray",
}
_cpu_notice_shown = False


def napari_get_reader(path: str | list[str]) -> Callable[[Any], list[LayerData]] | None:
    """npe2 reader hook: a reader function for zarr paths, None for anything else.

    Never raises: any problem while sniffing means "not ours".
    """
    try:
        target = _resolve(path)
    except Exception:  # noqa: BLE001 - sniffing must never raise
        return None
    return None if target is None else partial(read_for_napari, target)


def _resolve(path: Any) -> str | None:
    if isinstance(path, (list, tuple)):
        if len(path) != 1:
            return None
        path = path[0]
    p = os.fspath(path)
    if "://" in p:  # remote store (http, s3, gs): accept only what opens as a zarr node
        open_node(p)
        return p
    node = find_zarr_node(p)
    return None if node is None else str(node)


def read_for_napari(path: str, _paths: Any = None) -> list[LayerData]:
    layers = read_zarr_layers(path)
    _notify_if_cpu(layers)
    return layers


def read_zarr_layers(path: str | os.PathLike[str]) -> list[LayerData]:
    """Layer data tuples for a zarr path, as napari's ``viewer.open`` would add them.

    Parameters
    ----------
    path : str or os.PathLike
        An OME-Zarr image (channels become separate layers, ``labels/`` hidden Labels
        layers), a label image or ``labels/`` group, a plain zarr array, or a plain
        group (each array in it becomes a layer).

    Returns
    -------
    list of (data, kwargs, layer_type)

    Raises
    ------
    NotAZarrError
        Not a zarr node, or a group holding nothing displayable.
    """
    p = os.fspath(path)
    node = open_node(p)  # (once: what it holds decides the rest; each open costs ~0.4 ms)
    ome = ome_attrs(node.attrs)[0] if isinstance(node, zarr.Group) else {}
    if is_plate_attrs(ome):
        return _plate_layers(open_plate(p))
    if is_well_attrs(ome):
        return _well_layers(open_well(p))
    if "multiscales" in ome or ("bioformats2raw.layout" in ome and is_ome_zarr(p)):
        img = open_ome(p, with_labels=False)  # (the labels after the image's first planes are asked for)
        if img.is_label:
            return _label_layers(img, visible=True)
        return _image_layers(img)
    name = _name_of(p)
    if isinstance(node, zarr.Array):
        return [_plain_layer(node, name)]
    labels = _labels_group_layers(node, p)
    if labels:
        return labels
    out = []
    for key, arr in arrays_of(node, p):
        if arr.ndim >= 2:
            out.append(_plain_layer(arr, f"{name}/{key}"))
    if not out:
        kinds = sorted(node.attrs) or "no attributes"
        raise NotAZarrError(
            f"{p} is a zarr group without OME-NGFF multiscales ({kinds}) and without arrays of "
            "2 or more dimensions to show; open one of its arrays or images instead"
        )
    return out


def _name_of(p: str) -> str:
    name = Path(p.rstrip("/")).name
    for suffix in (".zarr", ".ome"):
        name = name.removesuffix(suffix)
    return name or p


def _plain_layer(arr: zarr.Array, name: str) -> LayerData:
    if arr.ndim < 2:
        raise NotAZarrError(
            f"{name}: napari shows arrays of 2 or more dimensions; this array has shape {arr.shape}"
        )
    kwargs: dict[str, Any] = {"name": name, "metadata": {"gpu_zarr": {"path": str(arr.store_path)}}}
    dims = getattr(arr.metadata, "dimension_names", None)
    if dims and all(d for d in dims):
        kwargs["axis_labels"] = tuple(str(d) for d in dims)
    return GpuLazyArray(arr), kwargs, "image"


def _pick(values, axes: list[int]) -> tuple:
    return tuple(values[i] for i in axes)


def _napari_unit(unit: str | None) -> str:
    """The OME unit if pint (napari's unit library) knows it, else napari's default."""
    if not unit:
        return "pixel"
    try:
        import pint

        pint.get_application_registry().Unit(unit)
        return unit
    except Exception:  # noqa: BLE001 - unknown unit names must not break opening
        return "pixel"


def _colormap(ch: Channel):
    named = _NAMED.get(ch.color.upper())
    if named:
        return named
    from napari.utils.colormaps import Colormap

    r, g, b = (int(ch.color[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return Colormap([[0, 0, 0, 1], [r, g, b, 1]], name=ch.color.upper(), display_name=ch.color.upper())


def _spatial(img: OmeImage, drop: int | None) -> dict[str, Any]:
    keep = [i for i in range(img.ndim) if i != drop]
    lvl0 = img.levels[0]
    return {
        "scale": _pick(lvl0.scale, keep),
        "translate": _pick(lvl0.translation, keep),
        "axis_labels": tuple(img.axes[i].name for i in keep),
        "units": tuple(_napari_unit(img.axes[i].unit) for i in keep),
    }


def _open_levels(img: OmeImage, *, ahead: bool = False) -> list[GpuLazyArray]:
    """The image's levels, opened once (each open is a zarr open and a backend choice: ~1 ms
    apiece; every channel's layer shares them); a pyramid's as napari's multiscale slicing
    reads them (:class:`~gpu_zarr.napari_plugin._window.ViewerLevel`). With ``ahead`` the
    coarsest level is opened first and the planes a new viewer shows first are asked for
    before the other levels are opened (:func:`_planes_ahead`)."""
    kind = ViewerLevel if len(img.levels) > 1 else GpuLazyArray
    coarsest = kind(img.open_level(len(img.levels) - 1))
    if ahead:
        _planes_ahead(coarsest, img.levels[0].shape, img.levels[-1].chunks, img.channel_axis)
    return [kind(img.open_level(i)) for i in range(len(img.levels) - 1)] + [coarsest]


def _planes_ahead(coarsest: GpuLazyArray, full: tuple[int, ...], chunks: tuple[int, ...],
                  channel_axis: int | None) -> None:
    """napari slices each new layer at step 0 and a new viewer's layers then at the middle of
    every axis (napari's ``Dims._go_to_center_step``), at the coarsest level (napari's first data
    level) before the camera settles: the plane at step 0 and the middle plane of every channel
    are asked for now, together, so that a remote store pays one round trip for them (beside the
    labels' metadata) rather than one each while napari adds the layers. Where both lie in the
    same chunks, one region holding both is asked for (its chunks fetched once)."""
    first: list[int | slice] = []
    middle: list[int | slice] = []
    both: list[int | slice] = []
    same = True  # step 0 and the middle step in the same chunks
    for ax, (n, n0, ch) in enumerate(zip(coarsest.shape, full, chunks)):
        if ax >= coarsest.ndim - 2 or ax == channel_axis:
            first.append(slice(None))
            middle.append(slice(None))
            both.append(slice(None))
        else:  # napari's middle step (of the full-resolution level) at the coarsest level
            mid = min(n - 1, (n0 - 1) // 2 * n // max(1, n0))
            first.append(0)
            middle.append(mid)
            both.append(slice(0, mid + 1))
            same = same and mid < ch
    if same:
        coarsest.prefetch(tuple(both))
    else:
        coarsest.prefetch(tuple(middle), tuple(first))


def _levels(levels: list[GpuLazyArray], channel_axis: int | None, index: int | None) -> Any:
    arrays = levels
    if channel_axis is not None:
        arrays = [a.index_axis(channel_axis, index) for a in arrays]
    return arrays if len(arrays) > 1 else arrays[0]


def _channel_kwargs(img: OmeImage, i: int, n: int, common: dict[str, Any], multiscale: bool,
                    meta: dict[str, Any], name: str | None) -> dict[str, Any]:
    """napari layer kwargs of channel ``i`` of ``n`` (name, colours and contrast from the OME
    metadata); ``name`` prefixes the channel's name (a plate or well grid), None for an image."""
    ch = img.channels[i] if i < len(img.channels) else None
    kwargs: dict[str, Any] = dict(common)
    kwargs["multiscale"] = multiscale
    kwargs["blending"] = "translucent_no_depth" if i == 0 else "additive"
    kwargs["metadata"] = {"gpu_zarr": {**meta, "channel": i}}
    base = img.name if name is None else name
    if ch is not None:
        kwargs["name"] = (ch.name if n > 1 else ch.name or img.name) if name is None else f"{name}: {ch.name}"
        kwargs["colormap"] = _colormap(ch)
        kwargs["visible"] = ch.active
        if ch.start is not None and ch.end is not None and ch.end > ch.start:
            kwargs["contrast_limits"] = (ch.start, ch.end)
    else:
        kwargs["name"] = f"{base} c{i}" if n > 1 else base
        if n > 1:
            kwargs["colormap"] = ("magenta", "green", "cyan", "yellow", "red", "blue")[i % 6]
    return kwargs


def _image_layers(img: OmeImage) -> list[LayerData]:
    c = img.channel_axis
    n = img.levels[0].shape[c] if c is not None else 1
    common = _spatial(img, c)
    meta = {"path": img.path, "version": img.version}
    layers: list[LayerData] = []
    levels = _open_levels(img, ahead=is_url(img.path))
    for i in range(n):
        kwargs = _channel_kwargs(img, i, n, common, len(img.levels) > 1, meta, None)
        layers.append((_levels(levels, c, i if c is not None else None), kwargs, "image"))
    img.labels = img.labels or open_labels(img)
    for lab in img.labels.values():
        layers.extend(_label_layers(lab, visible=False))
    return layers


def _grid_layers(img: OmeImage, views: list[TiledArray], name: str, meta: dict[str, Any]) -> list[LayerData]:
    """One multiscale image layer per channel of a plate or well grid (channels from the first field)."""
    c = img.channel_axis
    n = img.levels[0].shape[c] if c is not None else 1
    common = _spatial(img, c)
    layers: list[LayerData] = []
    for i in range(n):
        kwargs = _channel_kwargs(img, i, n, common, len(views) > 1, meta, name)
        data = [v.index_axis(c, i) for v in views] if c is not None else list(views)
        layers.append((data if len(data) > 1 else data[0], kwargs, "image"))
    return layers


def _plate_layers(plate: Plate) -> list[LayerData]:
    """A plate: one image layer per channel (wells' first fields in the plate grid) and the
    well names as a text overlay (a Points layer with one point at each well's corner)."""
    assert plate.image is not None
    img = plate.image
    views = plate.views(kind=ViewerGrid)
    names = [w.name for w in plate.wells]
    meta = {"path": plate.path, "version": plate.version,
            "plate": {"rows": plate.rows, "columns": plate.columns, "wells": names,
                      "well_paths": [w.path for w in plate.wells], "acquisitions": plate.acquisitions}}
    layers = _grid_layers(img, views, plate.name, meta)
    kw = layers[0][1]
    th, tw = views[0].tile_shape[-2:]
    sy, sx = kw["scale"][-2:]
    ty, tx = kw["translate"][-2:]
    nd = len(kw["scale"])
    coords = [[0.0] * (nd - 2) + [ty + w.row * th * sy, tx + w.column * tw * sx] for w in plate.wells]
    points = {"name": f"{plate.name}: wells", "features": {"well": names}, "size": 0.0,
              "text": {"string": "{well}", "color": "white", "anchor": "upper_left", "size": 10},
              "face_color": "transparent", "border_width": 0.0, "ndim": nd,
              "metadata": {"gpu_zarr": meta}}
    import numpy as np

    layers.append((np.asarray(coords, dtype=float), points, "points"))
    return layers


def _well_layers(well: Well) -> list[LayerData]:
    """A well: one image layer per channel, its fields in an almost-square grid."""
    meta = {"path": well.path, "version": well.version, "well": {"fields": well.fields, "grid": list(well.grid)}}
    return _grid_layers(well.image, well.views(kind=ViewerGrid), _name_of(well.path), meta)


def _label_layers(img: OmeImage, *, visible: bool) -> list[LayerData]:
    c = img.channel_axis
    kwargs: dict[str, Any] = dict(_spatial(img, c))
    kwargs["name"] = img.name
    kwargs["visible"] = visible
    kwargs["multiscale"] = len(img.levels) > 1
    kwargs["metadata"] = {"gpu_zarr": {"path": img.path, "version": img.version}}
    if img.label_colors:
        from napari.utils.colormaps import DirectLabelColormap

        colors: dict[int | None, Any] = {None: (0, 0, 0, 0), 0: (0, 0, 0, 0)}
        colors.update(img.label_colors)
        kwargs["colormap"] = DirectLabelColormap(color_dict=colors)
    return [(_levels(_open_levels(img), c, 0 if c is not None else None), kwargs, "labels")]


def _labels_group_layers(node: zarr.Group, path: str) -> list[LayerData]:
    """A ``labels/`` group opened directly: each listed label image, shown."""
    if not isinstance(ome_attrs(node.attrs)[0].get("labels"), list):
        return []
    out: list[LayerData] = []
    for img in label_images(node, path).values():
        out.extend(_label_layers(img, visible=True))
    return out


def _notify_if_cpu(layers: list[LayerData]) -> None:
    """Once per session: say that reads go through the CPU when there is no GPU."""
    global _cpu_notice_shown
    if _cpu_notice_shown or not layers:
        return
    data = layers[0][0]
    first = data[0] if isinstance(data, list) else data
    if not isinstance(first, GpuLazyArray):
        return
    choice = first.backend_choice()
    if choice.backend != "cpu":
        return
    _cpu_notice_shown = True
    from napari.utils.notifications import show_info

    show_info(
        f"GPU Zarr: reading on the CPU ({choice.reason}). Layers work as usual"
        + ("." if "pip install" in choice.reason else f"; for GPU decode install the CUDA extra: {INSTALL_HINT}.")
    )
