"""Synthetic OME-Zarr sample data: blobs plus noise, two channels, a label image.

Used by ``gpu-zarr demo``, the napari sample-data contribution and the tests. Written
with zarr-python: OME-NGFF 0.5 on zarr v3, or 0.4 on zarr v2.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import zarr

from gpu_zarr import settings

__all__ = ["DEFAULT_SHAPE", "SAMPLE_NAME", "default_cache_dir", "make_volume", "sample_path", "write_sample_omezarr"]

DEFAULT_SHAPE: tuple[int, int, int, int] = (2, 64, 512, 512)
#: Folder name of the cached sample; bump the suffix when the content changes.
SAMPLE_NAME = "sample-blobs-v1.ome.zarr"

_BASE_SCALE = (1.0, 2.0, 0.5, 0.5)  # c, z (µm), y (µm), x (µm)
_CHANNELS = (
    ("nuclei", "FF00FF"),
    ("membranes", "00FF00"),
    ("extra", "00FFFF"),
    ("more", "FFFF00"),
)
_LABEL_NAME = "blobs"


def _blobs(shape: Sequence[int], n: int, rng: np.random.Generator, labels: np.ndarray | None):
    """Sum of ``n`` anisotropic Gaussian blobs in a float32 volume of ``shape`` (z, y, x)."""
    z, y, x = shape
    vol = np.zeros(shape, np.float32)
    for k in range(n):
        c = rng.uniform(0, 1, 3) * (z, y, x)
        sig = rng.uniform(0.008, 0.025) * min(y, x) * np.array([0.3, 1.0, 1.0])
        sig = np.maximum(sig, 1.0)
        amp = rng.uniform(0.4, 1.0)
        lo = np.maximum(np.floor(c - 3 * sig), 0).astype(int)
        hi = np.minimum(np.ceil(c + 3 * sig), (z, y, x)).astype(int)
        if np.any(hi <= lo):
            continue
        gz, gy, gx = (
            np.exp(-0.5 * ((np.arange(lo[i], hi[i]) - c[i]) / sig[i]) ** 2).astype(np.float32)
            for i in range(3)
        )
        g = gz[:, None, None] * gy[None, :, None] * gx[None, None, :]
        box = (slice(lo[0], hi[0]), slice(lo[1], hi[1]), slice(lo[2], hi[2]))
        vol[box] += amp * g
        if labels is not None:
            sub = labels[box]
            sub[(g > 0.5) & (sub == 0)] = k + 1
    return vol


def make_volume(
    shape: Sequence[int] = DEFAULT_SHAPE, *, dtype: Any = np.uint16, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Generate the synthetic (c, z, y, x) image and its (z, y, x) label volume.

    Parameters
    ----------
    shape : sequence of int
        ``(c, z, y, x)``.
    dtype : numpy dtype
        Integer or float dtype of the image.
    seed : int
        Random seed: the same seed gives the same data.

    Returns
    -------
    image : numpy.ndarray
        Smooth blobs plus Gaussian noise, using most of the dtype's range (integers).
    labels : numpy.ndarray
        uint32 instance labels of the channel-0 blobs (0 is background).
    """
    if len(shape) != 4 or min(shape) < 1:
        raise ValueError(f"expected shape (c, z, y, x) with positive sizes, got {tuple(shape)}")
    c, z, y, x = (int(s) for s in shape)
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    labels = np.zeros((z, y, x), np.uint32)
    n_blobs = max(8, round(300 * (y * x) / (512 * 512) * max(1.0, z / 32)))
    top = float(np.iinfo(dt).max) * 0.25 if dt.kind in "iu" else 1.0
    image = np.empty((c, z, y, x), dt)
    for ch in range(c):
        vol = _blobs((z, y, x), n_blobs, rng, labels if ch == 0 else None)
        vol *= top / max(float(vol.max()), 1e-6)
        vol += rng.normal(0.04 * top, 0.01 * top, vol.shape).astype(np.float32)
        if dt.kind in "iu":
            info = np.iinfo(dt)
            np.clip(vol, info.min, info.max, out=vol)
            image[ch] = np.rint(vol).astype(dt)
        else:
            image[ch] = vol.astype(dt)
    return image, labels


def _downsample(a: np.ndarray, f: int, *, mean: bool) -> np.ndarray:
    """Downsample the last two axes by ``f`` (mean for images, stride for labels)."""
    if not mean:
        return a[..., ::f, ::f].copy()
    y, x = a.shape[-2] // f * f, a.shape[-1] // f * f
    if y == 0 or x == 0:
        return a[..., ::f, ::f].copy()
    b = a[..., :y, :x].astype(np.float64)
    b = b.reshape(*a.shape[:-2], y // f, f, x // f, f).mean(axis=(-3, -1))
    return np.rint(b).astype(a.dtype) if a.dtype.kind in "iu" else b.astype(a.dtype)


def _compressors(compressor: str | None, zarr_format: int):
    if compressor in (None, "none", "raw"):
        return None
    if compressor == "zstd":
        if zarr_format == 3:
            from zarr.codecs import ZstdCodec

            return ZstdCodec(level=3)
        import numcodecs

        return numcodecs.Zstd(level=3)
    if compressor == "blosc":
        if zarr_format == 3:
            from zarr.codecs import BloscCodec

            return BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")
        import numcodecs

        return numcodecs.Blosc(cname="zstd", clevel=3, shuffle=numcodecs.Blosc.BITSHUFFLE)
    raise ValueError(f"compressor must be 'zstd', 'blosc' or None, got {compressor!r}")


def _multiscales(levels: int, version: str, name: str, ndim: int) -> dict:
    all_axes = [
        {"name": "c", "type": "channel"},
        {"name": "z", "type": "space", "unit": "micrometer"},
        {"name": "y", "type": "space", "unit": "micrometer"},
        {"name": "x", "type": "space", "unit": "micrometer"},
    ][4 - ndim :]
    base = _BASE_SCALE[4 - ndim :]
    datasets = []
    for i in range(levels):
        f = 2**i
        scale = [*base[:-2], base[-2] * f, base[-1] * f]
        # mean-downsampling by f moves the first pixel centre by (f - 1)/2 input pixels
        trans = [0.0] * (ndim - 2) + [(f - 1) / 2 * base[-2], (f - 1) / 2 * base[-1]]
        transforms: list[dict] = [{"type": "scale", "scale": scale}]
        if i:
            transforms.append({"type": "translation", "translation": trans})
        datasets.append({"path": str(i), "coordinateTransformations": transforms})
    ms: dict[str, Any] = {"name": name, "axes": all_axes, "datasets": datasets, "type": "mean"}
    if version == "0.4":
        ms["version"] = "0.4"
    return ms


def _omero(image: np.ndarray, version: str) -> dict:
    chans = []
    for ch in range(image.shape[0]):
        label, color = _CHANNELS[ch % len(_CHANNELS)]
        data = image[ch, image.shape[1] // 2]
        lo, hi = (float(v) for v in np.percentile(data, [1.0, 99.9]))
        if image.dtype.kind in "iu":
            lo, hi = float(np.floor(lo)), float(np.ceil(hi))
        info = np.iinfo(image.dtype) if image.dtype.kind in "iu" else None
        chans.append(
            {
                "label": label if ch < len(_CHANNELS) else f"{label}-{ch}",
                "color": color,
                "active": True,
                "coefficient": 1.0,
                "family": "linear",
                "inverted": False,
                "window": {
                    "start": lo,
                    "end": hi,
                    "min": float(info.min) if info else float(image.min()),
                    "max": float(info.max) if info else float(image.max()),
                },
            }
        )
    omero: dict[str, Any] = {"channels": chans, "rdefs": {"model": "color", "defaultZ": image.shape[1] // 2}}
    if version == "0.4":
        omero["version"] = "0.4"
    return omero


def _set_ome_attrs(group: zarr.Group, version: str, block: dict) -> None:
    if version == "0.5":
        group.attrs.update({"ome": {"version": "0.5", **block}})
    else:
        group.attrs.update(block)


def _write_pyramid(group: Any, data: np.ndarray, levels: int, *, mean: bool, zarr_format: int,
                   chunks: Sequence[int], compressor: str | None, dim_names: Sequence[str]) -> None:
    level = data
    for i in range(levels):
        ch = tuple(min(c, s) for c, s in zip(chunks[-data.ndim :], level.shape, strict=True))
        kwargs: dict[str, Any] = {
            "shape": level.shape,
            "dtype": level.dtype,
            "chunks": ch,
            "compressors": _compressors(compressor, zarr_format),
            "fill_value": 0,
        }
        if zarr_format == 3:
            kwargs["dimension_names"] = list(dim_names)
        else:
            kwargs["chunk_key_encoding"] = {"name": "v2", "separator": "/"}
        arr = group.create_array(str(i), **kwargs)
        arr[...] = level
        level = _downsample(level, 2, mean=mean)


def _image_label(lab: np.ndarray, version: str, seed: int) -> dict[str, Any]:
    """The ``image-label`` metadata of the label image: a random opaque colour per label."""
    rng = np.random.default_rng(seed + 1)
    n = int(lab.max())
    colors = [
        {"label-value": int(v), "rgba": [int(c) for c in rng.integers(64, 256, 3)] + [255]}
        for v in range(1, n + 1)
    ]
    image_label: dict[str, Any] = {"colors": colors, "source": {"image": "../../"}}
    if version == "0.4":
        image_label["version"] = "0.4"
    return image_label


def _write_labels(root: zarr.Group, lab: np.ndarray, version: str, levels: int, seed: int, *,
                  zarr_format: int, chunks: tuple[int, ...], compressor: str | None) -> None:
    """``labels/blobs``: the instance labels as a multiscale label image (nearest downsampling)."""
    lgroup = root.create_group("labels")
    _set_ome_attrs(lgroup, version, {"labels": [_LABEL_NAME]})
    cells = lgroup.create_group(_LABEL_NAME)
    _set_ome_attrs(cells, version, {
        "multiscales": [_multiscales(levels, version, _LABEL_NAME, 3)],
        "image-label": _image_label(lab, version, seed),
    })
    _write_pyramid(cells, lab, levels, mean=False, zarr_format=zarr_format, chunks=chunks,
                   compressor=compressor, dim_names="zyx")


def write_sample_omezarr(
    path: str | os.PathLike[str],
    *,
    version: Literal["0.5", "0.4"] = "0.5",
    shape: Sequence[int] = DEFAULT_SHAPE,
    levels: int = 3,
    labels: bool = True,
    compressor: str | None = "zstd",
    chunks: Sequence[int] | None = None,
    dtype: Any = np.uint16,
    seed: int = 0,
    overwrite: bool = False,
) -> Path:
    """Write a synthetic multiscale OME-Zarr image.

    Parameters
    ----------
    path : str or os.PathLike
        Folder to create (conventionally ending in ``.ome.zarr``).
    version : {"0.5", "0.4"}
        OME-NGFF version: 0.5 is written as zarr v3, 0.4 as zarr v2 (``/`` chunk keys).
    shape : sequence of int
        Full-resolution ``(c, z, y, x)`` shape. The default, 2×64×512×512 uint16, is
        64 MiB uncompressed.
    levels : int
        Number of resolution levels; each halves y and x (mean for the image,
        nearest for labels).
    labels : bool
        Also write ``labels/blobs``: instance labels of the channel-0 blobs.
    compressor : {"zstd", "blosc", None}
        Chunk compression (zstd is the one the GPU decodes).
    chunks : sequence of int, optional
        Chunk shape for ``(c, z, y, x)``; default ``(1, 16, 256, 256)`` clipped to the
        shape. Label arrays use its last three entries.
    dtype : numpy dtype
        Image dtype.
    seed : int
        Random seed.
    overwrite : bool
        Replace an existing folder at ``path``; otherwise an existing path is an error.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    if version not in ("0.5", "0.4"):
        raise ValueError(f"version must be '0.5' (zarr v3) or '0.4' (zarr v2), got {version!r}")
    if levels < 1:
        raise ValueError(f"levels must be ≥ 1, got {levels}")
    path = Path(path)
    if path.exists():
        if not overwrite:
            raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it")
        shutil.rmtree(path)
    zarr_format = 3 if version == "0.5" else 2
    chunks = tuple(chunks) if chunks is not None else (1, 16, 256, 256)
    if len(chunks) != 4:
        raise ValueError(f"chunks must have 4 entries (c, z, y, x), got {chunks}")
    image, lab = make_volume(shape, dtype=dtype, seed=seed)
    name = path.name.removesuffix(".zarr").removesuffix(".ome")

    root = zarr.open_group(str(path), mode="w-", zarr_format=zarr_format)  # type: ignore[arg-type]
    _set_ome_attrs(root, version, {
        "multiscales": [_multiscales(levels, version, name, 4)],
        "omero": _omero(image, version),
    })
    _write_pyramid(root, image, levels, mean=True, zarr_format=zarr_format, chunks=chunks,
                   compressor=compressor, dim_names="czyx")
    if labels:
        _write_labels(root, lab, version, levels, seed, zarr_format=zarr_format, chunks=chunks,
                      compressor=compressor)
    return path


def default_cache_dir() -> Path:
    """The ``cache_dir`` setting (``$GPU_ZARR_CACHE``), else ``$XDG_CACHE_HOME/napari-gpu-zarr``,
    else ``~/.cache/napari-gpu-zarr``."""
    folder = settings.get("cache_dir")
    if folder:
        return Path(folder).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "napari-gpu-zarr"


def sample_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Path of the cached sample OME-Zarr (0.5, zstd), written on first use.

    The store is written to a temporary folder next to its final place and renamed
    when complete, so an interrupted first run never leaves a half-written sample.

    Parameters
    ----------
    cache_dir : str or os.PathLike, optional
        Folder to keep the sample in; default :func:`default_cache_dir`.

    Returns
    -------
    pathlib.Path
        ``<cache_dir>/sample-blobs-v1.ome.zarr``.
    """
    folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = folder / SAMPLE_NAME
    if (target / "zarr.json").is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".sample-", dir=folder))
    try:
        write_sample_omezarr(tmp / SAMPLE_NAME)
        try:
            os.replace(tmp / SAMPLE_NAME, target)
        except OSError:
            if not (target / "zarr.json").is_file():  # lost a race only if someone else won
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
