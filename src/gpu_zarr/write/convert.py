"""``gpu-zarr convert SRC DST``: any zarr array or OME-Zarr image the reader opens, local or
remote, rewritten as sharded OME-Zarr 0.5 (or plain zarr v3) by the writer, into a local
folder or a remote store.

The source is read once, whole, by the reader (decoded on the GPU where there is one) when it
takes at most a quarter of the memory it goes to, else block by block through
:func:`gpu_zarr.to_dask`, so memory stays bounded; an OME-Zarr image keeps its axes, units, level-0
scale, channel names and labels, and its pyramid is computed again from level 0 (mean for
the image, mode for labels: :mod:`gpu_zarr.write.pyramid`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpu_zarr.errors import INSTALL_HINT, NotAZarrError, UsageError
from gpu_zarr.write.api import WriteResult, measured, write_zarr
from gpu_zarr.write.omezarr import write_ome_zarr
from gpu_zarr.write.source import free_bytes

__all__ = ["convert"]


def _dask(path: str, level: int | None, storage_options: Mapping[str, Any] | None) -> Any:
    try:
        import dask.array  # noqa: F401
    except ImportError:
        raise UsageError(f"convert reads its source through dask, which is not installed. Fix: "
                         f"{INSTALL_HINT.replace('cuda13', 'dask')}") from None
    from gpu_zarr.dask_array import to_dask

    return to_dask(path, level=level, storage_options=storage_options)


def _source(path: str, level: int | None, storage_options: Mapping[str, Any] | None) -> Any:
    """The source array (level 0 of an OME image): read whole, once, by the reader (onto the
    GPU when there is one) when it takes at most a quarter of the memory it goes to -- its
    pyramid is then computed in memory from that one read -- else block by block through dask
    (memory bounded: each level's blocks are read again from the source)."""
    from gpu_zarr.capabilities import probe
    from gpu_zarr.zarr_io import open_image_or_array, read_zarr

    arr = open_image_or_array(path, storage_options=storage_options)
    nbytes = int(np.prod(arr.shape, dtype=np.int64)) * np.dtype(arr.dtype).itemsize
    on_gpu = probe().backend_status("kvikio")[0]
    room = free_bytes(on_gpu)
    if room is None or nbytes > room // 4:
        return _dask(path, level, storage_options)
    return read_zarr(path, prefer="auto" if on_gpu else "cpu", progress=None, storage_options=storage_options).data


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, codec: str | None = "zstd",
            level: int | None = None, chunks: Sequence[int] | int | None = None,
            shards: Sequence[int] | int | bool | None = None, levels: int | None = None,
            ome_version: str = "0.5", overwrite: bool = False, encoder: str = "auto",
            storage_options: Mapping[str, Any] | None = None,
            dst_storage_options: Mapping[str, Any] | None = None) -> WriteResult:
    """Rewrite ``src`` (zarr array or OME-Zarr image, local or remote) at ``dst``.

    Parameters
    ----------
    src : str or path
        What :func:`gpu_zarr.read_zarr` / :func:`gpu_zarr.read_omezarr` open (a URL too).
    dst : str or path
        A local folder or a remote store's URL (must not hold a zarr unless ``overwrite=True``).
    codec, level, chunks, shards, overwrite, encoder
        As in :func:`gpu_zarr.write_ome_zarr`; ``chunks`` default to the source's chunks
        (its inner chunks when sharded).
    levels : int, optional
        Pyramid levels of an OME-Zarr (default: as many as the source has).
    ome_version : {"0.5", "0.4"}
        0.5 writes zarr v3 (sharded), 0.4 zarr v2; a plain array becomes v3 or v2 likewise.
    storage_options : mapping, optional
        Options of a remote ``src`` (and of a remote ``dst`` unless ``dst_storage_options`` is given).
    dst_storage_options : mapping, optional
        Options of a remote ``dst`` (default: ``storage_options`` when ``dst`` is a URL).

    Returns
    -------
    WriteResult
        Its memory figures count the source's read too (whole, or block by block).
    """
    return measured(None, encoder, lambda: _convert(
        src, dst, codec=codec, level=level, chunks=chunks, shards=shards, levels=levels, ome_version=ome_version,
        overwrite=overwrite, encoder=encoder, storage_options=storage_options,
        dst_storage_options=dst_storage_options))


def _convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, codec: str | None, level: int | None,
             chunks: Sequence[int] | int | None, shards: Sequence[int] | int | bool | None, levels: int | None,
             ome_version: str, overwrite: bool, encoder: str, storage_options: Mapping[str, Any] | None,
             dst_storage_options: Mapping[str, Any] | None) -> WriteResult:
    t0 = time.perf_counter()
    from gpu_zarr.omezarr import is_ome_zarr, open_ome

    text = os.fspath(src)
    from gpu_zarr.location import is_url

    dst_opts = dst_storage_options if dst_storage_options is not None else (
        storage_options if is_url(os.fspath(dst)) else None)
    if is_ome_zarr(text, storage_options=storage_options):
        image = open_ome(text, storage_options=storage_options)
        data = _source(text, 0, storage_options)
        lv0 = image.levels[0]
        axes = [{"name": a.name, "type": a.type, "unit": a.unit} for a in image.axes]
        labels = {}
        for name, lab in image.labels.items():
            labels[name] = _source(lab.path, 0, storage_options)
        res = write_ome_zarr(data, dst, axes=axes, scale=list(lv0.scale), levels=levels or len(image.levels),
                             chunks=chunks if chunks is not None else lv0.chunks, shards=shards, codec=codec,
                             level=level, channel_names=[c.name for c in image.channels] or None,
                             labels=labels or None, ome_version=ome_version, name=image.name or None,
                             overwrite=overwrite, encoder=encoder, storage_options=dst_opts,
                             units=None, downsample="mean", label_downsample="mode")
    else:
        import zarr

        try:
            arr = zarr.open_array(text, mode="r", storage_options=dict(storage_options or {}) or None)
        except Exception as exc:  # noqa: BLE001 - zarr's errors differ by store and version
            raise NotAZarrError(f"{text} is neither an OME-Zarr image nor a zarr array ({exc})") from None
        data = _source(text, None, storage_options)
        res = write_zarr(data, dst, chunks=chunks if chunks is not None else arr.chunks, shards=shards, codec=codec,
                         level=level, zarr_format=3 if ome_version == "0.5" else 2, fill_value=arr.fill_value,
                         overwrite=overwrite, encoder=encoder, storage_options=dst_opts)
    res.seconds = time.perf_counter() - t0
    res.gib_per_s = res.nbytes / res.seconds / 2**30 if res.seconds > 0 else 0.0
    return res


def _shape_arg(text: str) -> tuple[int, ...] | bool:
    """``--chunks/--shards 1,512,512``; ``--shards none`` for an unsharded array."""
    import argparse

    if text.lower() in ("none", "false", "no"):
        return False
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 1,512,512, got {text!r}") from None


def add_cli(sub: Any, add_store_options: Any = None, store_options_of: Any = None) -> None:
    """Add ``gpu-zarr convert`` to the command's subparsers (its arguments live here, with the
    writer); ``add_store_options`` adds the command's remote-store options (for SRC, and for a
    remote DST) and
    ``store_options_of`` turns the parsed arguments into ``storage_options``."""
    from gpu_zarr.write.codecs import CODECS

    p = sub.add_parser("convert", help="rewrite a zarr or OME-Zarr (local or remote) as sharded OME-Zarr 0.5 "
                       "(or --ome-version 0.4), encoded on the GPU where there is one")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--codec", default="zstd", choices=list(CODECS))
    p.add_argument("--level", type=int, default=None, help="compression level (default: zstd 3, Blosc/gzip 5)")
    p.add_argument("--chunks", type=_shape_arg, default=None, help="chunk shape, e.g. 1,512,512 (default: the "
                   "source's)")
    p.add_argument("--shards", type=_shape_arg, default=None, help="shard shape, or none (default: about "
                   "GPU_ZARR_SHARD_MIB of data)")
    p.add_argument("--levels", type=int, default=None, help="pyramid levels (default: the source's)")
    p.add_argument("--ome-version", default="0.5", choices=["0.5", "0.4"])
    p.add_argument("--encoder", default="auto", choices=["auto", "gpu", "cpu"])
    p.add_argument("--overwrite", action="store_true", help="replace an existing zarr at DST")
    if add_store_options is not None:
        add_store_options(p)
    p.set_defaults(func=cmd_convert, store_options_of=store_options_of)


def cmd_convert(args: Any) -> int:
    """Run ``gpu-zarr convert`` and print one line of what was written."""
    of = getattr(args, "store_options_of", None)
    opts = of(args) if of is not None else None
    res = convert(args.src, args.dst, codec=None if args.codec == "none" else args.codec, level=args.level,
                  chunks=args.chunks or None, shards=args.shards, levels=args.levels, ome_version=args.ome_version,
                  overwrite=args.overwrite, encoder=args.encoder, storage_options=opts)
    print(f"wrote {res.path}: {len(res.arrays)} arrays, {res.nbytes / 2**30:.3f} GiB in {res.seconds:.2f} s "
          f"({res.gib_per_s:.2f} GiB/s), stored {res.stored_bytes / 2**30:.3f} GiB (ratio {res.ratio:.2f}); "
          f"encoder {res.encoder}: {res.reason}")
    return 0
