"""OME-NGFF metadata of what the writer writes: axes, multiscales with their coordinate
transformations, ``omero`` channels, labels (versions 0.4 and 0.5).

0.5 keeps everything under the group's ``"ome"`` attribute with one ``"version"``;
0.4 puts ``multiscales`` (each with its ``"version"``), ``omero``, ``labels`` and
``image-label`` at the top of ``.zattrs``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_zarr.errors import UsageError

__all__ = ["VERSIONS", "Axis", "image_attrs", "label_image_attrs", "labels_group_attrs", "parse_axes",
           "spatial_downsample_axes"]

VERSIONS = ("0.4", "0.5")
_TYPES = {"t": "time", "c": "channel", "z": "space", "y": "space", "x": "space"}
# the units OME-NGFF allows (UDUNITS-2 names), from the 0.4/0.5 specifications
SPACE_UNITS = frozenset(
    "angstrom attometer centimeter decimeter exameter femtometer foot gigameter hectometer inch kilometer "
    "megameter meter micrometer mile millimeter nanometer parsec petameter picometer terameter yard "
    "yoctometer yottameter zeptometer zettameter".split())
TIME_UNITS = frozenset(
    "attosecond centisecond day decisecond exasecond femtosecond gigasecond hectosecond hour kilosecond "
    "megasecond microsecond millisecond minute nanosecond petasecond picosecond second terasecond "
    "yoctosecond yottasecond zeptosecond zettasecond".split())


@dataclass(frozen=True)
class Axis:
    """One OME axis: name, type ("space", "time", "channel" or None) and unit (or None)."""

    name: str
    type: str | None
    unit: str | None

    def to_dict(self) -> dict[str, str]:
        d = {"name": self.name}
        if self.type:
            d["type"] = self.type
        if self.unit:
            d["unit"] = self.unit
        return d


def parse_axes(axes: str | Sequence[str | Mapping[str, Any]], ndim: int,
               units: Mapping[str, str] | Sequence[str | None] | None = None) -> list[Axis]:
    """Axes from ``"tczyx"``-like strings, name lists or OME axis dicts, with their units.

    Raises
    ------
    UsageError
        Not one axis per dimension, repeated names, or a unit OME-NGFF does not allow.
    """
    items = list(axes)
    if len(items) != ndim:
        raise UsageError(f"axes={axes!r} names {len(items)} axes; the data has {ndim} dimensions")
    out: list[Axis] = []
    for k, item in enumerate(items):
        if isinstance(item, Mapping):
            name, typ, unit = str(item["name"]), item.get("type"), item.get("unit")
        else:
            name, typ, unit = str(item), None, None
        typ = typ or _TYPES.get(name.lower())
        if units is not None:
            unit = units.get(name) if isinstance(units, Mapping) else list(units)[k]
        if unit is not None:
            allowed = SPACE_UNITS if typ == "space" else TIME_UNITS if typ == "time" else None
            if allowed is None or unit not in allowed:
                raise UsageError(f"unit {unit!r} for axis {name!r} ({typ or 'no type'}): expected "
                                 + ("a space unit such as 'micrometer'" if typ == "space" else
                                    "a time unit such as 'second'" if typ == "time" else
                                    "no unit on a channel axis"))
        out.append(Axis(name, typ, unit))
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        raise UsageError(f"axes={axes!r}: every axis needs its own name")
    return out


def spatial_downsample_axes(axes: Sequence[Axis]) -> tuple[int, ...]:
    """The axes a pyramid halves: ``y`` and ``x`` when present, else the last two space axes
    (z and time are kept: microscopy stacks are usually coarser along z already)."""
    named = tuple(k for k, a in enumerate(axes) if a.name.lower() in ("y", "x"))
    if named:
        return named
    return tuple(k for k, a in enumerate(axes) if a.type == "space")[-2:]


def _multiscale(axes: Sequence[Axis], scales: Sequence[Sequence[float]],
                translations: Sequence[Sequence[float] | None], name: str, version: str,
                method: str) -> dict[str, Any]:
    datasets = []
    for k, (s, t) in enumerate(zip(scales, translations, strict=True)):
        ct: list[dict[str, Any]] = [{"type": "scale", "scale": [float(v) for v in s]}]
        if t is not None and any(t):
            ct.append({"type": "translation", "translation": [float(v) for v in t]})
        datasets.append({"path": str(k), "coordinateTransformations": ct})
    ms: dict[str, Any] = {"name": name, "axes": [a.to_dict() for a in axes], "datasets": datasets,
                          "type": method, "metadata": {"method": f"gpu_zarr.write.pyramid.downsample({method!r})"}}
    if version == "0.4":
        ms = {"version": "0.4", **ms}
    return ms


def _wrap(version: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"ome": {"version": "0.5", **body}} if version == "0.5" else body


def omero(channel_names: Sequence[str], dtype: np.dtype, windows: Sequence[tuple[float, float]] | None,
          version: str) -> dict[str, Any]:
    """The ``omero`` block: one channel per name, white, active, window from the data's range."""
    dtype = np.dtype(dtype)
    lo, hi = (float(np.iinfo(dtype).min), float(np.iinfo(dtype).max)) if dtype.kind in "iu" else (0.0, 1.0)
    chans = []
    for k, name in enumerate(channel_names):
        start, end = windows[k] if windows is not None else (lo, hi)
        chans.append({"label": str(name), "color": "FFFFFF", "active": True, "coefficient": 1.0,
                      "family": "linear", "inverted": False,
                      "window": {"min": lo, "max": hi, "start": float(start), "end": float(end)}})
    block: dict[str, Any] = {"channels": chans, "rdefs": {"model": "greyscale" if len(chans) == 1 else "color"}}
    if version == "0.4":
        block["version"] = "0.4"
    return block


def image_attrs(version: str, axes: Sequence[Axis], scales: Sequence[Sequence[float]],
                translations: Sequence[Sequence[float] | None], *, name: str, method: str,
                omero_block: dict[str, Any] | None = None) -> dict[str, Any]:
    """The attributes of an image group (``zarr.json`` attributes in 0.5, ``.zattrs`` in 0.4)."""
    body: dict[str, Any] = {"multiscales": [_multiscale(axes, scales, translations, name, version, method)]}
    if omero_block is not None:
        body["omero"] = omero_block
    return _wrap(version, body)


def labels_group_attrs(version: str, names: Sequence[str]) -> dict[str, Any]:
    """The attributes of the ``labels`` group: the names of its label images."""
    return _wrap(version, {"labels": [str(n) for n in names]})


def label_image_attrs(version: str, axes: Sequence[Axis], scales: Sequence[Sequence[float]],
                      translations: Sequence[Sequence[float] | None], *, name: str,
                      method: str) -> dict[str, Any]:
    """A label image's attributes: its multiscales and ``image-label`` pointing at the image."""
    body: dict[str, Any] = {"multiscales": [_multiscale(axes, scales, translations, name, version, method)]}
    label: dict[str, Any] = {"source": {"image": "../../"}}
    if version == "0.4":
        label = {"version": "0.4", **label}
    body["image-label"] = label
    return _wrap(version, body)
