"""OME-NGFF (OME-Zarr) multiscale images: metadata model and level access.

Supports OME-NGFF 0.4 (zarr v2, metadata in ``.zattrs``) and 0.5 (zarr v3, metadata
under ``attributes["ome"]`` in ``zarr.json``); older 0.1-0.3 layouts (axes as plain
strings or absent, no transforms) are read on a best-effort basis. Stores are always
opened read-only: nothing here writes.

Examples
--------
>>> from gpu_zarr.zarr_io import gpu_zarr_context
>>> from gpu_zarr.omezarr import read_omezarr
>>> with gpu_zarr_context():                          # doctest: +SKIP
...     vol, resolution = read_omezarr(path, level=0)
...     tile = vol[0, 10]                              # already a cupy array
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zarr

from .engine.fit import nbytes_of
from .errors import GpuZarrError, InvalidOmeMetadata, NotOmeZarrError
from .location import path_and_options
from .ome_children import children as child_nodes
from .reprs import codec_names
from .store import METADATA_FILES, check_safe, is_zarr_node, open_array, open_node

__all__ = [
    "Axis",
    "Channel",
    "InvalidOmeMetadata",
    "Level",
    "NotOmeZarrError",
    "OmeImage",
    "check_inside",
    "child_nodes",
    "find_zarr_node",
    "is_ome_zarr",
    "is_zarr_node",
    "label_images",
    "ome_attrs",
    "open_labels",
    "open_node",
    "open_ome",
    "read_omezarr",
]

_DEFAULT_AXES = "tczyx"


@dataclass(frozen=True)
class Axis:
    """One axis of an OME image.

    Attributes
    ----------
    name : str
        Axis name, e.g. ``"z"``.
    type : str or None
        ``"space"``, ``"time"``, ``"channel"`` or a custom type; None when unknown.
    unit : str or None
        Unit name from the OME spec (e.g. ``"micrometer"``); None when not given.
    """

    name: str
    type: str | None = None
    unit: str | None = None


@dataclass(frozen=True)
class Level:
    """One resolution level of a multiscale image.

    Attributes
    ----------
    path : str
        Array path relative to the image group (e.g. ``"0"``).
    shape : tuple of int
        Array shape.
    dtype : str
        Array dtype as a numpy string (e.g. ``"uint16"``).
    chunks : tuple of int
        Chunk shape (the inner chunk shape for sharded arrays).
    scale : tuple of float
        Physical size of one pixel per axis: the level's ``scale`` transform composed
        with the multiscale-wide transforms.
    translation : tuple of float
        Physical position of the first pixel's centre per axis, composed likewise.
    codecs : tuple of str
        Filters and compressors, e.g. ``("zstd(level=3)",)``; ``("raw",)`` when uncompressed.
    shards : tuple of int or None
        Shard shape of a sharded (zarr v3) array, else None.
    """

    path: str
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]
    scale: tuple[float, ...]
    translation: tuple[float, ...]
    codecs: tuple[str, ...] = ()
    shards: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        """Uncompressed size of the level in bytes."""
        import numpy as np

        return nbytes_of(self.shape, np.dtype(self.dtype).itemsize)  # Python ints: never wraps


@dataclass(frozen=True)
class Channel:
    """Rendering settings of one channel, from ``omero`` metadata.

    Attributes
    ----------
    name : str
        Channel label (``omero.channels[i].label``), or ``"channel <i>"``.
    color : str
        ``"#RRGGBB"`` colour.
    start, end : float or None
        Display window (contrast limits); None when the window is missing.
    min, max : float or None
        Range of the data the window may span (contrast limit range).
    active : bool
        Whether the channel is shown by default.
    """

    name: str
    color: str = "#FFFFFF"
    start: float | None = None
    end: float | None = None
    min: float | None = None
    max: float | None = None
    active: bool = True


@dataclass
class OmeImage:
    """An OME-NGFF multiscale image (or label image).

    Attributes
    ----------
    path : str
        Location of the image group as given (local path or URL).
    version : str
        OME-NGFF version string (``"0.4"``, ``"0.5"``...); ``""`` when unknown.
    name : str
        Multiscale name, or the folder name.
    axes : list of Axis
    levels : list of Level
        Highest resolution first.
    channels : list of Channel
        From ``omero``; empty when the image has no omero block.
    labels : dict of str to OmeImage
        Label images found under ``labels/``, keyed by name.
    label_colors : dict of int to tuple of float
        For a label image: ``image-label.colors`` as label value -> RGBA in 0..1.
    is_label : bool
        True when this image carries ``image-label`` metadata.
    storage_options : dict
        The remote store's options the image was opened with; its levels and labels open with
        them too (not shown in the repr: they may hold credentials).
    """

    path: str
    version: str
    name: str
    axes: list[Axis]
    levels: list[Level]
    channels: list[Channel] = field(default_factory=list)
    labels: dict[str, OmeImage] = field(default_factory=dict)
    label_colors: dict[int, tuple[float, float, float, float]] = field(default_factory=dict)
    is_label: bool = False
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ndim(self) -> int:
        """Number of axes."""
        return len(self.axes)

    # notebook display (gpu_zarr.reprs): metadata only, no I/O
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from gpu_zarr import reprs

        return reprs.bundle(reprs.ome_image_text(self), reprs.ome_image_html(self))

    def _repr_html_(self) -> str:
        from gpu_zarr import reprs

        return reprs.ome_image_html(self)

    @property
    def channel_axis(self) -> int | None:
        """Index of the axis of type ``channel`` (or named ``c``), None if absent."""
        for i, ax in enumerate(self.axes):
            if ax.type == "channel":
                return i
        for i, ax in enumerate(self.axes):
            if ax.type is None and ax.name.lower() == "c":
                return i
        return None

    def open_level(self, level: int = 0) -> zarr.Array:
        """Open one level read-only.

        Parameters
        ----------
        level : int
            Index into :attr:`levels` (negative counts from the smallest).

        Returns
        -------
        zarr.Array
            Opened with ``mode="r"``; slicing it inside ``gpu_zarr_context()`` yields cupy.
        """
        return open_array(self.level_path(level), self.storage_options)

    def level_path(self, level: int = 0) -> str:
        """Location (folder or URL) of one level's array.

        Parameters
        ----------
        level : int
            Index into :attr:`levels` (negative counts from the smallest).
        """
        return _join(self.path, self.levels[_check_level(level, len(self.levels), self.path)].path)


def _join(base: str, sub: str) -> str:
    if "://" in base:
        return base.rstrip("/") + "/" + sub
    return os.path.join(base, sub)


def check_inside(where: str, what: str, sub: str, example: str = "0") -> None:
    """Raise InvalidOmeMetadata unless ``sub`` (a path from OME metadata) is a relative path
    that stays inside the group ``where``: no absolute path, no ``..``, no URL.

    ``what`` names the metadata field in the message (e.g. ``"datasets[0] path"``).
    """
    parts = sub.replace("\\", "/").split("/")
    if not sub or sub.startswith("/") or os.path.isabs(sub) or ".." in parts or "://" in sub:
        raise InvalidOmeMetadata(f"{where}: {what} {sub!r} points outside the group; "
                                 f"expected a relative path inside it (e.g. {example!r}).")


def _check_inside(p: str, i: int, sub: str) -> None:
    """A level's path must stay inside the image group, and its array must be safe to open."""
    check_inside(p, f"datasets[{i}] path", sub)
    if "://" not in p:
        check_safe(os.path.join(p, sub))


def _check_level(level: int, n: int, path: str) -> int:
    if not isinstance(level, int) or isinstance(level, bool):
        raise TypeError(f"level must be an int, got {type(level).__name__} {level!r}")
    if not -n <= level < n:
        raise IndexError(
            f"level {level} does not exist in {path}: the image has {n} level(s) "
            f"(valid: 0..{n - 1}, or -{n}..-1)"
        )
    return level % n


def find_zarr_node(path: str | os.PathLike[str]) -> Path | None:
    """Return the zarr node a local path designates, or None.

    ``path`` itself when it is a zarr folder; its folder when it is a zarr metadata
    file; otherwise the nearest enclosing zarr folder, but only inside a ``*.zarr``
    folder (so a chunk folder dragged from inside ``image.zarr`` opens its array).
    Never raises.
    """
    try:
        p = Path(path).expanduser()
        if p.is_file() and p.name in METADATA_FILES:
            p = p.parent
        if is_zarr_node(p):
            return p
        if not any(part.endswith(".zarr") for part in p.parts):
            return None
        for parent in p.parents:
            if is_zarr_node(parent):
                return parent
            if parent.name.endswith(".zarr"):
                return None
        return None
    except (OSError, ValueError, TypeError):
        return None


def ome_attrs(attrs: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The OME block of a node's attributes and its version (0.5: under "ome")."""
    attrs = dict(attrs)
    if isinstance(attrs.get("ome"), Mapping):
        ome = dict(attrs["ome"])
        return ome, str(ome.get("version", ""))
    version = ""
    ms = attrs.get("multiscales")
    if isinstance(ms, list) and ms and isinstance(ms[0], Mapping):
        version = str(ms[0].get("version", ""))
    for key in ("plate", "well", "image-label"):
        if not version and isinstance(attrs.get(key), Mapping):
            version = str(attrs[key].get("version", ""))
    return attrs, version


def is_ome_zarr(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> bool:
    """True when ``path`` is a zarr group with OME-NGFF ``multiscales`` (or a
    bioformats2raw layout whose series 0 has them). Never raises.

    ``storage_options``: options of a remote store (see :mod:`gpu_zarr.location`)."""
    try:
        p, opts = path_and_options(path, storage_options)
        node = open_node(p, opts)
        if not isinstance(node, zarr.Group):
            return False
        ome, _ = ome_attrs(node.attrs)
        if "multiscales" in ome:
            return True
        if "bioformats2raw.layout" in ome:
            return is_ome_zarr(_join(p, "0"), opts)
        return False
    except Exception:  # noqa: BLE001 - sniffing never raises
        return False


def _parse_axes(raw: Any, ndim: int, where: str) -> list[Axis]:
    if raw is None:
        if ndim > len(_DEFAULT_AXES):
            raise InvalidOmeMetadata(f"{where}: no 'axes' and {ndim} dimensions (expected ≤5)")
        return [Axis(n) for n in _DEFAULT_AXES[-ndim:]]
    axes = []
    for a in raw:
        if isinstance(a, str):  # 0.3
            axes.append(Axis(a))
        elif isinstance(a, Mapping) and "name" in a:
            axes.append(Axis(str(a["name"]), a.get("type"), a.get("unit")))
        else:
            raise InvalidOmeMetadata(f"{where}: expected each axis as a dict with 'name', found {a!r}")
    if len(axes) != ndim:
        raise InvalidOmeMetadata(
            f"{where}: {len(axes)} axes {[a.name for a in axes]} but the arrays have {ndim} dimensions"
        )
    return axes


def _parse_transforms(raw: Any, ndim: int, where: str) -> tuple[list[float], list[float]]:
    """Compose a coordinateTransformations list into (scale, translation)."""
    scale = [1.0] * ndim
    trans = [0.0] * ndim
    for t in raw or []:
        if not isinstance(t, Mapping):
            raise InvalidOmeMetadata(f"{where}: expected a transform dict, found {t!r}")
        kind = t.get("type")
        if kind == "identity":
            continue
        if kind not in ("scale", "translation"):
            raise InvalidOmeMetadata(
                f"{where}: unsupported coordinate transformation type {kind!r} "
                "(OME-NGFF 0.4/0.5 allow 'scale', 'translation' and 'identity')"
            )
        if kind not in t:
            raise InvalidOmeMetadata(
                f"{where}: {kind} transform without inline values ({sorted(t)}); "
                "transforms stored in a separate 'path' are not supported"
            )
        values = [float(v) for v in t[kind]]
        if len(values) != ndim:
            raise InvalidOmeMetadata(
                f"{where}: {kind} has {len(values)} values but the image has {ndim} axes"
            )
        if kind == "scale":  # applies to everything composed so far
            scale = [s * v for s, v in zip(scale, values, strict=True)]
            trans = [tr * v for tr, v in zip(trans, values, strict=True)]
        else:
            trans = [tr + v for tr, v in zip(trans, values, strict=True)]
    return scale, trans


def _hex_color(raw: Any) -> str:
    if isinstance(raw, str):
        s = raw.strip().lstrip("#")
        if len(s) == 6 and all(c in "0123456789abcdefABCDEF" for c in s):
            return "#" + s.upper()
    return "#FFFFFF"


def _opt_float(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key)
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _parse_channels(omero: Any) -> list[Channel]:
    if not isinstance(omero, Mapping):
        return []
    chans = []
    for i, c in enumerate(omero.get("channels") or []):
        if not isinstance(c, Mapping):
            continue
        raw_window = c.get("window")
        window: Mapping[str, Any] = raw_window if isinstance(raw_window, Mapping) else {}
        label = c.get("label")
        chans.append(
            Channel(
                name=str(label) if label not in (None, "") else f"channel {i}",
                color=_hex_color(c.get("color")),
                start=_opt_float(window, "start"),
                end=_opt_float(window, "end"),
                min=_opt_float(window, "min"),
                max=_opt_float(window, "max"),
                active=bool(c.get("active", True)),
            )
        )
    return chans


def _parse_label_colors(image_label: Any) -> dict[int, tuple[float, float, float, float]]:
    colors: dict[int, tuple[float, float, float, float]] = {}
    if not isinstance(image_label, Mapping):
        return colors
    for entry in image_label.get("colors") or []:
        try:
            value = int(entry["label-value"])
            rgba = [float(x) / 255.0 for x in entry["rgba"]]
            if len(rgba) == 3:
                rgba.append(1.0)
            colors[value] = (rgba[0], rgba[1], rgba[2], rgba[3])
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return colors


def _as_tuple(x: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in x)


def _multiscales(ome: Mapping[str, Any], p: str) -> tuple[Mapping[str, Any], list[Any]]:
    """The first ``multiscales`` entry of an image's OME attributes and its ``datasets``,
    checked for shape (not yet against the arrays)."""
    if "multiscales" not in ome:
        found = sorted(ome) or "no attributes"
        extra = " (an HCS plate/well: open it with gpu_zarr.plate.open_plate / open_well)" if {"plate", "well"} & set(ome) else ""
        raise NotOmeZarrError(
            f"expected OME-NGFF 'multiscales' metadata in {p} (zarr v3: attributes['ome'], "
            f"zarr v2: .zattrs), found {found}{extra}"
        )
    ms_list = ome["multiscales"]
    if not isinstance(ms_list, list) or not ms_list or not isinstance(ms_list[0], Mapping):
        raise InvalidOmeMetadata(f"{p}: 'multiscales' must be a non-empty list of dicts, found {ms_list!r}")
    ms = ms_list[0]
    datasets = ms.get("datasets")
    if not isinstance(datasets, list) or not datasets:
        raise InvalidOmeMetadata(f"{p}: multiscales[0] has no 'datasets' (expected a list of levels)")
    return ms, datasets


def _dataset_array(node: zarr.Group, p: str, i: int, ds: Any) -> tuple[str, zarr.Array]:
    """The path and the array of ``datasets[i]``, which must name an array inside the image."""
    if not isinstance(ds, Mapping) or "path" not in ds:
        raise InvalidOmeMetadata(f"{p}: datasets[{i}] must be a dict with 'path', found {ds!r}")
    sub = str(ds["path"])
    _check_inside(p, i, sub)
    try:
        arr = node[sub]
    except KeyError as exc:
        raise InvalidOmeMetadata(
            f"{p}: datasets[{i}] names the array {sub!r}, but there is no such array"
        ) from exc
    except GpuZarrError:
        raise
    except Exception as exc:  # noqa: BLE001 - zarr's own error (dtype, codec, metadata), with context
        raise InvalidOmeMetadata(
            f"{p}: datasets[{i}] names the array {sub!r}, which zarr cannot open: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(arr, zarr.Array):
        raise InvalidOmeMetadata(f"{p}: datasets[{i}] path {sub!r} is a group, expected an array")
    return sub, arr


def _level(p: str, i: int, sub: str, arr: zarr.Array, ds: Mapping[str, Any], ms: Mapping[str, Any]) -> Level:
    """One level: its array's layout, and its scale and translation (the dataset's own
    transformations composed with the multiscale's)."""
    ndim = arr.ndim
    where = f"{p} datasets[{i}] ({sub})"
    s, t = _parse_transforms(ds.get("coordinateTransformations"), ndim, where)
    gs, gt = _parse_transforms(ms.get("coordinateTransformations"), ndim, f"{p} multiscales")
    return Level(
        path=sub,
        shape=_as_tuple(arr.shape),
        dtype=str(arr.dtype),
        chunks=_as_tuple(arr.chunks),
        scale=tuple(a * b for a, b in zip(gs, s, strict=True)),
        translation=tuple(a * b + c for a, b, c in zip(gs, t, gt, strict=True)),
        codecs=codec_names(arr),
        shards=_as_tuple(sh) if (sh := getattr(arr, "shards", None)) else None,
    )


def open_ome(path: str | os.PathLike[str], *, with_labels: bool = True,
             storage_options: Mapping[str, Any] | None = None) -> OmeImage:
    """Read the OME-NGFF metadata of an image group.

    Parameters
    ----------
    path : str or os.PathLike
        The image group (the folder holding ``zarr.json`` / ``.zattrs`` with
        ``multiscales``), or a bioformats2raw root (its series ``0`` is opened).
    with_labels : bool
        Also read label images under ``labels/``.
    storage_options : mapping, optional
        Options of a remote store (credentials, endpoint, ``anon``, requests in flight...; see
        :mod:`gpu_zarr.location`). The image's levels and labels open with the same options.

    Returns
    -------
    OmeImage

    Raises
    ------
    NotAZarrError
        Nothing, or no zarr group, at ``path``.
    NotOmeZarrError
        A zarr node without ``multiscales`` metadata.
    InvalidOmeMetadata
        Metadata present but malformed, or inconsistent with the arrays.
    """
    p, opts = path_and_options(path, storage_options)
    node = open_node(p, opts)
    if not isinstance(node, zarr.Group):
        raise NotOmeZarrError(
            f"expected an OME-Zarr image group at {p}, found a zarr array "
            f"(shape {node.shape}, dtype {node.dtype}); open its parent folder instead"
        )
    ome, version = ome_attrs(node.attrs)
    if "multiscales" not in ome and "bioformats2raw.layout" in ome:
        return open_ome(_join(p, "0"), with_labels=with_labels, storage_options=opts)
    ms, datasets = _multiscales(ome, p)
    version = version or str(ms.get("version", ""))
    levels: list[Level] = []
    ndim: int | None = None
    axes: list[Axis] = []
    for i, ds in enumerate(datasets):
        sub, arr = _dataset_array(node, p, i, ds)
        if ndim is None:
            ndim = arr.ndim
            axes = _parse_axes(ms.get("axes"), ndim, p)
        elif arr.ndim != ndim:
            raise InvalidOmeMetadata(
                f"{p}: level {sub!r} has {arr.ndim} dimensions, level 0 has {ndim}"
            )
        levels.append(_level(p, i, sub, arr, ds, ms))

    image = OmeImage(
        path=p,
        version=version,
        name=str(ms.get("name") or Path(p.rstrip("/")).name.removesuffix(".zarr")),
        axes=axes,
        levels=levels,
        channels=_parse_channels(ome.get("omero")),
        label_colors=_parse_label_colors(ome.get("image-label")),
        is_label="image-label" in ome,
        storage_options=opts,
    )
    if with_labels:
        image.labels = _read_labels(node, p, opts)
    return image


def open_labels(image: OmeImage) -> dict[str, OmeImage]:
    """The label images under ``image``'s ``labels/`` group, by name (what ``open_ome`` puts in
    ``labels``), for an image opened with ``with_labels=False``. A viewer opens the image's
    levels and asks for its first planes first: a remote store's label metadata then comes
    beside those planes, not before them."""
    node = open_node(image.path, image.storage_options)
    return _read_labels(node, image.path, image.storage_options) if isinstance(node, zarr.Group) else {}


def _read_labels(node: zarr.Group, path: str, opts: Mapping[str, Any]) -> dict[str, OmeImage]:
    """Label images listed in ``labels/``; malformed ones are skipped, not fatal."""
    try:
        lab = node["labels"]
    except KeyError:
        return {}
    if not isinstance(lab, zarr.Group):
        return {}
    return label_images(lab, _join(path, "labels"), storage_options=opts)


def label_images(labels_group: zarr.Group, path: str, *,
                 storage_options: Mapping[str, Any] | None = None) -> dict[str, OmeImage]:
    """The label images of an OME ``labels/`` group, by name.

    The names are the group's ``labels`` list (every sub-group when the list is absent);
    malformed label images are skipped, not fatal. A name that leads outside the group (an
    absolute path, ``..``, a URL) is never followed: it is skipped with a warning naming it
    (:func:`check_inside`), and the image still opens.

    Parameters
    ----------
    labels_group : zarr.Group
        The ``labels/`` group, opened read-only.
    path : str
        Its path (or URL).
    storage_options : mapping, optional
        Options of a remote store (see :mod:`gpu_zarr.location`).
    """
    ome, _ = ome_attrs(labels_group.attrs)
    names = ome.get("labels")
    if not isinstance(names, list):
        names = [k for k, _ in labels_group.groups()]
    out: dict[str, OmeImage] = {}
    for name in names:
        try:
            check_inside(path, "labels entry", str(name), "cells")
        except InvalidOmeMetadata as exc:
            warnings.warn(f"label image skipped: {exc}", stacklevel=2)
            continue
        try:
            out[str(name)] = open_ome(_join(path, str(name)), with_labels=False, storage_options=storage_options)
        except GpuZarrError:
            continue
    return out


def read_omezarr(path: str | os.PathLike[str], level: int = 0, *,
                 storage_options: Mapping[str, Any] | None = None) -> tuple[zarr.Array, list[float]]:
    """Open one resolution level of an OME-Zarr image, read-only.

    Parameters
    ----------
    path : str or os.PathLike
        OME-Zarr image group (OME-NGFF 0.4 on zarr v2 or 0.5 on zarr v3).
    level : int
        Resolution level, 0 being the full resolution.
    storage_options : mapping, optional
        Options of a remote store (see :mod:`gpu_zarr.location`), e.g. ``{"anon": True}`` for a
        public S3 bucket, or credentials, ``endpoint_url`` and ``region``.

    Returns
    -------
    array : zarr.Array
        The level, opened with ``mode="r"``. Inside ``gpu_zarr_context()`` its slices are
        cupy arrays; outside, numpy.
    resolution : list of float
        Physical size of one pixel along each axis (the level's ``scale`` transform,
        composed with any multiscale-wide scale), in the axes' units.

    Raises
    ------
    NotAZarrError, NotOmeZarrError, InvalidOmeMetadata
        See :func:`open_ome`.
    IndexError
        ``level`` out of range.

    Examples
    --------
    >>> vol, res = read_omezarr("image.ome.zarr", level=1)   # doctest: +SKIP
    >>> res                                                    # doctest: +SKIP
    [1.0, 2.0, 1.0, 1.0]
    """
    image = open_ome(path, with_labels=False, storage_options=storage_options)
    idx = _check_level(level, len(image.levels), image.path)
    return image.open_level(idx), list(image.levels[idx].scale)
