""":func:`write_ome_zarr`: an OME-Zarr image with its pyramid, ``omero`` channels and labels.

Levels are halved along ``y`` and ``x`` (see :func:`gpu_zarr.write.ome.spatial_downsample_axes`)
by :func:`gpu_zarr.write.pyramid.downsample`: on the GPU when the data is there (or the
encoder is; the data then goes to the GPU once), lazily block by block for a dask array.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpu_zarr import settings
from gpu_zarr.errors import OutOfGPUMemory, OutOfHostMemory, OutOfMemory, UsageError
from gpu_zarr.write import ome
from gpu_zarr.write.api import ArrayJob, WriteResult, choose_encoder, measured, run_jobs
from gpu_zarr.write.codecs import codec_spec
from gpu_zarr.write.metadata import group_documents
from gpu_zarr.write.plan import make_plan
from gpu_zarr.write.pyramid import METHODS, downsample
from gpu_zarr.write.source import as_source, free_bytes, is_cupy, is_dask
from gpu_zarr.write.writer import Stages

__all__ = ["default_chunks", "default_levels", "level_geometry", "write_ome_zarr"]

_MAX_LEVELS = 12


def default_chunks(shape: Sequence[int], ds_axes: Sequence[int]) -> tuple[int, ...]:
    """512 along the halved axes (y, x), 1 along the others (t, c, z)."""
    return tuple(min(512, max(1, s)) if ax in ds_axes else 1 for ax, s in enumerate(shape))


def default_levels(shape: Sequence[int], chunks: Sequence[int], ds_axes: Sequence[int]) -> int:
    """Levels until every halved axis fits in one chunk (at most 12)."""
    n, cur = 1, list(shape)
    while n < _MAX_LEVELS and any(cur[ax] > chunks[ax] for ax in ds_axes):
        cur = [-(-s // 2) if ax in ds_axes else s for ax, s in enumerate(cur)]
        n += 1
    return n


def _lazy_level(d: Any, axes: Sequence[int], method: str) -> Any:
    """A dask array halved block by block: blocks of even length along ``axes`` (the last one
    may be odd), so each block's downsample is the whole array's."""
    even = {ax: max(2, d.chunksize[ax] + d.chunksize[ax] % 2) for ax in axes}
    d = d.rechunk(even)
    out_chunks = tuple(tuple(-(-b // 2) for b in c) if ax in axes else c for ax, c in enumerate(d.chunks))
    return d.map_blocks(downsample, axes, method, chunks=out_chunks, dtype=d.dtype)


def _pyramid(data: Any, levels: int, axes: Sequence[int], method: str, to_gpu: bool,
             stages: Stages) -> list[Any]:
    """The levels of ``data`` (level 0 first): in memory for numpy/cupy, lazy for dask."""
    if is_dask(data):
        out = [data]
        for _ in range(1, levels):
            out.append(_lazy_level(out[-1], axes, method))
        return out
    nbytes = int(np.prod(data.shape, dtype=np.int64)) * np.dtype(data.dtype).itemsize
    need = nbytes + (nbytes // 3 if levels > 1 else 0)  # the image and its levels (each a quarter of the last)
    if to_gpu and not is_cupy(data):
        free = free_bytes(True)
        # computed on the GPU when the image and its levels take at most half its free memory
        # (the writer's encode batches need the rest); else on the host, in slabs, and the
        # writer uploads each batch as it encodes it
        if free is not None and need <= free // 2:
            with stages.time("transfer"):
                import cupy

                data = cupy.asarray(data)
    out = [data]
    with stages.time("downsample"):
        try:
            for _ in range(1, levels):
                out.append(downsample(out[-1], axes, method))
        except MemoryError as exc:  # cupy's OutOfMemoryError is one; so is numpy's
            raise _no_room_for_levels(data, need, exc) from exc
        if is_cupy(data):
            import cupy

            cupy.cuda.get_current_stream().synchronize()
    return out


def _no_room_for_levels(data: Any, need: int, exc: BaseException) -> OutOfMemory:
    where = "GPU" if is_cupy(data) else "host"
    free = free_bytes(where == "GPU")
    have = f"{free / 2**30:.1f} GiB are free there now" if free is not None else "free memory unknown"
    err = OutOfGPUMemory if where == "GPU" else OutOfHostMemory
    return err(f"the pyramid of a {tuple(data.shape)} {np.dtype(data.dtype)} image is computed in {where} memory: "
               f"it needs about {need / 2**30:.1f} GiB (the image and its levels, a third more), {have} "
               f"({type(exc).__name__}). Pass the image as a dask array (levels computed block by block, "
               "memory bounded by the writer's batches), write fewer levels, or free memory.")


def level_geometry(shape: Sequence[int], chunks: Sequence[int], shards: Any) -> tuple[tuple[int, ...], Any]:
    """Chunks no larger than the level; explicit shards kept a multiple of them, within the level."""
    ch = tuple(max(1, min(c, s)) for c, s in zip(chunks, shape, strict=True))
    if shards in (None, True, False):
        return ch, shards
    sh = tuple(c * max(1, -(-min(int(s), n) // c)) for c, s, n in zip(ch, shards, shape, strict=True))
    return ch, sh


def _windows(smallest: Any, c_axis: int | None) -> list[tuple[float, float]] | None:
    """Each channel's (min, max), from the smallest level (cheap, and close to the full range)."""
    if is_dask(smallest):
        smallest = smallest.compute()
    a = smallest.get() if is_cupy(smallest) else np.asarray(smallest)
    if a.size == 0 or a.dtype.kind not in "iuf":
        return None
    if c_axis is None:
        return [(float(a.min()), float(a.max()))]
    moved = np.moveaxis(a, c_axis, 0).reshape(a.shape[c_axis], -1)
    return [(float(r.min()), float(r.max())) for r in moved]


def _scales(scale: Sequence[float] | None, ndim: int, levels: int, ds_axes: Sequence[int],
            method: str) -> tuple[list[list[float]], list[list[float] | None]]:
    s0 = [1.0] * ndim if scale is None else [float(v) for v in scale]
    if len(s0) != ndim:
        raise UsageError(f"scale={scale!r}: expected {ndim} numbers, one per axis")
    scales, trans = [], []
    for k in range(levels):
        f = 2 ** k
        scales.append([v * f if ax in ds_axes else v for ax, v in enumerate(s0)])
        # a mean/mode output pixel covers 2**k input pixels: its centre moves by (2**k - 1) / 2 of them
        trans.append([v * (f - 1) / 2 if ax in ds_axes else 0.0 for ax, v in enumerate(s0)]
                     if method != "nearest" and k else None)
    return scales, trans


def write_ome_zarr(data: Any, path: str | os.PathLike[str], *, axes: str | Sequence[Any],
                   scale: Sequence[float] | None = None, units: Mapping[str, str] | Sequence[str | None] | None = None,
                   levels: int | None = None, downsample: str = "mean", chunks: Sequence[int] | int | None = None,
                   shards: Sequence[int] | int | bool | None = None, codec: str | None = "zstd",
                   level: int | None = None, channel_names: Sequence[str] | None = None,
                   labels: Mapping[str, Any] | None = None, label_downsample: str = "mode",
                   ome_version: str = "0.5", name: str | None = None, overwrite: bool = False,
                   encoder: str = "auto", storage_options: Mapping[str, Any] | None = None) -> WriteResult:
    """Write an image (numpy, cupy or dask of either) as OME-Zarr with its pyramid.

    Parameters
    ----------
    data : array
        The full-resolution image.
    path : str or path
        A local folder or a remote store's URL (must not hold a zarr unless ``overwrite=True``).
    axes : str or sequence
        ``"tczyx"``-like names (types follow: t time, c channel, z/y/x space), or OME axis dicts.
    scale : sequence of float, optional
        Level 0's pixel size per axis (default 1); level ``k`` is ``2**k`` coarser along y, x.
    units : mapping or sequence, optional
        OME units per axis name (``{"x": "micrometer", "t": "second"}``).
    levels : int, optional
        Pyramid levels including level 0 (default: until y and x fit in one chunk).
    downsample : {"mean", "mode", "nearest"}
        How images are halved (see :mod:`gpu_zarr.write.pyramid` for the exact definitions).
    chunks, shards, codec, level
        As in :func:`gpu_zarr.write_zarr`; chunks default to 512 along y and x, 1 along the
        other axes. ``ome_version="0.4"`` writes zarr v2 (no shards).
    channel_names : sequence of str, optional
        ``omero`` channel labels (one per entry of the ``c`` axis; default "0", "1", ...).
    labels : mapping of str to array, optional
        Label images (integer arrays) by name, with the image's axes (or all but ``c``);
        written under ``labels/<name>`` with their own pyramids.
    label_downsample : {"mode", "nearest"}
    ome_version : {"0.5", "0.4"}
    name : str, optional
        The multiscales' name (default: the folder's name without ``.zarr``).
    overwrite, encoder, storage_options
        As in :func:`gpu_zarr.write_zarr`.

    Returns
    -------
    WriteResult
        ``arrays`` lists every level written ("0", "1", ..., "labels/cells/0", ...).

    Notes
    -----
    The pyramid's level ``k > 0`` carries a translation of ``(2**k - 1) / 2`` level-0 pixels
    along y and x for ``mean``/``mode`` (an output pixel's centre is the centre of the block it
    averages); ``nearest`` keeps pixel ``2i``, so it has none. The result's memory figures
    count the pyramid: a numpy or cupy image's levels are computed in memory (a third of the
    image's bytes more, on the GPU when it encodes there, after one copy of the image);
    a dask image's block by block, within the writer's batches.
    """
    return measured(data, encoder, lambda: _write_ome_zarr(
        data, path, axes=axes, scale=scale, units=units, levels=levels, downsample=downsample, chunks=chunks,
        shards=shards, codec=codec, level=level, channel_names=channel_names, labels=labels,
        label_downsample=label_downsample, ome_version=ome_version, name=name, overwrite=overwrite,
        encoder=encoder, storage_options=storage_options))


def _write_ome_zarr(data: Any, path: str | os.PathLike[str], *, axes: str | Sequence[Any],
                    scale: Sequence[float] | None, units: Mapping[str, str] | Sequence[str | None] | None,
                    levels: int | None, downsample: str, chunks: Sequence[int] | int | None,
                    shards: Sequence[int] | int | bool | None, codec: str | None, level: int | None,
                    channel_names: Sequence[str] | None, labels: Mapping[str, Any] | None, label_downsample: str,
                    ome_version: str, name: str | None, overwrite: bool, encoder: str,
                    storage_options: Mapping[str, Any] | None) -> WriteResult:
    """:func:`write_ome_zarr`'s work, inside its memory measurement."""
    t0 = time.perf_counter()
    _check_choices(ome_version, downsample, label_downsample)
    src = as_source(data)
    if src.kind == "reader":
        raise UsageError("write_ome_zarr takes a numpy, cupy or dask array")
    ax = ome.parse_axes(axes, len(src.shape), units)
    ds_axes = ome.spatial_downsample_axes(ax)
    zarr_format = 3 if ome_version == "0.5" else 2
    dtype = _little(src.dtype)
    spec = codec_spec(codec, level, dtype.itemsize)
    chunk_t = default_chunks(src.shape, ds_axes) if chunks is None else chunks
    plan0 = make_plan(src.shape, dtype, chunk_t, shards, zarr_format, shard_bytes=int(settings.get("shard_bytes")))
    n_levels = default_levels(src.shape, plan0.chunks, ds_axes) if levels is None else int(levels)
    if not 1 <= n_levels <= _MAX_LEVELS:
        raise UsageError(f"levels={levels!r}: expected 1..{_MAX_LEVELS}")
    queue = _Pyramids(ax, chunk_t, shards, zarr_format, n_levels, _encodes_on_gpu(spec, encoder))
    c_axis = next((k for k, a in enumerate(ax) if a.type == "channel"), None)
    image_levels = queue.add("", src.array, ax, downsample, dtype)
    scales, trans = _scales(scale, len(src.shape), n_levels, ds_axes, downsample)
    omero_block = _omero(channel_names, src.shape, c_axis, dtype, image_levels[-1], ome_version)
    title = name if name is not None else os.fspath(path).rstrip("/").rsplit("/", 1)[-1].removesuffix(".zarr")
    groups = {"": group_documents(zarr_format, ome.image_attrs(ome_version, ax, scales, trans, name=title,
                                                                method=downsample, omero_block=omero_block))}
    if labels:
        groups.update(_add_labels(queue, labels, src.shape, c_axis, scales[0], label_downsample, ome_version))
    return run_jobs(path, queue.jobs, groups, spec, encoder=encoder, overwrite=overwrite, stages=queue.stages,
                    t0=t0, storage_options=storage_options)


def _check_choices(ome_version: str, downsample: str, label_downsample: str) -> None:
    """Raise :class:`UsageError` for an unknown OME version or downsampling method."""
    if ome_version not in ome.VERSIONS:
        raise UsageError(f"ome_version={ome_version!r}: expected one of {', '.join(ome.VERSIONS)}")
    for what, m, allowed in (("downsample", downsample, METHODS), ("label_downsample", label_downsample,
                                                                  ("mode", "nearest"))):
        if m not in allowed:
            raise UsageError(f"{what}={m!r}: expected one of {', '.join(allowed)}")


def _encodes_on_gpu(spec: Any, encoder: str) -> bool:
    """Whether the encoder works on the GPU (the pyramid is computed where it works): probed once,
    before any downsampling."""
    enc, _ = choose_encoder(spec, encoder, 1)
    enc.close()
    return bool(enc.xp_name == "cupy")


def _add_labels(queue: _Pyramids, labels: Mapping[str, Any], shape: tuple[int, ...], c_axis: int | None,
                scale0: list[float], method: str, ome_version: str) -> dict[str, dict[str, bytes]]:
    """Queue every level of each label image; returns the label groups' documents (by prefix)."""
    ax, fmt = queue.image_axes, queue.zarr_format
    groups = {"labels": group_documents(fmt, ome.labels_group_attrs(ome_version, list(labels)))}
    for lname, larr in labels.items():
        lsrc = as_source(larr)
        lax = _label_axes(lname, lsrc, shape, ax, c_axis)
        queue.add(f"labels/{lname}/", lsrc.array, lax, method, _little(lsrc.dtype))
        keep = [k for k, a in enumerate(ax) if a in lax]
        ls, lt = _scales([scale0[k] for k in keep], len(lax), queue.n_levels, ome.spatial_downsample_axes(lax),
                         method)
        groups[f"labels/{lname}"] = group_documents(fmt, ome.label_image_attrs(ome_version, lax, ls, lt,
                                                                                name=lname, method=method))
    return groups


def _little(dtype: np.dtype) -> np.dtype:
    """``dtype`` in little-endian byte order (what the writer stores)."""
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype


class _Pyramids:
    """The arrays of one OME-Zarr write: every level of the image and of each label image."""

    def __init__(self, image_axes: list[ome.Axis], chunks: Any, shards: Any, zarr_format: int, n_levels: int,
                 to_gpu: bool) -> None:
        self.image_axes, self.chunks, self.shards = image_axes, chunks, shards
        self.zarr_format, self.n_levels, self.to_gpu = zarr_format, n_levels, to_gpu
        self.stages = Stages()
        self.jobs: list[ArrayJob] = []

    def add(self, prefix: str, arr: Any, axes_: list[ome.Axis], method: str, dt: np.dtype) -> list[Any]:
        """Queue every level of one image (or label image) under ``prefix``; returns the levels."""
        lv = _pyramid(arr, self.n_levels, ome.spatial_downsample_axes(axes_), method, self.to_gpu, self.stages)
        for k, level_data in enumerate(lv):
            shape = tuple(int(s) for s in level_data.shape)
            ch, sh = level_geometry(shape, _project(self.chunks, self.image_axes, axes_),
                                     _project_shards(self.shards, self.image_axes, axes_))
            plan = make_plan(shape, dt, ch, sh, self.zarr_format, shard_bytes=int(settings.get("shard_bytes")),
                             separator="/")
            self.jobs.append(ArrayJob(as_source(level_data), plan, f"{prefix}{k}",
                                      dimension_names=[a.name for a in axes_] if self.zarr_format == 3 else None))
        return lv


def _omero(channel_names: Sequence[str] | None, shape: Sequence[int], c_axis: int | None, dtype: np.dtype,
           smallest: Any, ome_version: str) -> Any:
    """The ``omero`` block (channel names and windows), or None without channels or names."""
    names = list(channel_names) if channel_names is not None else (
        [str(i) for i in range(shape[c_axis])] if c_axis is not None else None)
    if names is None:
        return None
    if c_axis is not None and len(names) != shape[c_axis]:
        raise UsageError(f"channel_names has {len(names)} names; the c axis has {shape[c_axis]} channels")
    return ome.omero(names, dtype, _windows(smallest, c_axis), ome_version)


def _label_axes(lname: str, lsrc: Any, shape: tuple[int, ...], ax: list[ome.Axis],
                c_axis: int | None) -> list[ome.Axis]:
    """A label image's axes: the image's, or the image's without ``c``; its dtype an integer one."""
    if lsrc.dtype.kind not in "biu":
        raise UsageError(f"label image {lname!r} has dtype {lsrc.dtype}: expected an integer dtype")
    if lsrc.shape == shape:
        return ax
    if c_axis is not None and lsrc.shape == tuple(s for k, s in enumerate(shape) if k != c_axis):
        return [a for k, a in enumerate(ax) if k != c_axis]
    raise UsageError(f"label image {lname!r} has shape {lsrc.shape}: expected the image's "
                     f"{shape}" + (" (or without its c axis)" if c_axis is not None else ""))


def _project(chunks: Any, image_axes: list[ome.Axis], axes_: list[ome.Axis]) -> Any:
    """The image's per-axis chunks for the axes a label image keeps."""
    if isinstance(chunks, (int, np.integer)):
        return (int(chunks),) * len(axes_)
    return tuple(int(chunks[image_axes.index(a)]) for a in axes_)


def _project_shards(shards: Any, image_axes: list[ome.Axis], axes_: list[ome.Axis]) -> Any:
    if shards in (None, True, False):
        return shards
    return _project(shards, image_axes, axes_)
