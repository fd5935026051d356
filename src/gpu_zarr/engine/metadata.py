"""From zarr-python's metadata to the engine's :class:`~gpu_zarr.engine.layout.Layout`.

:func:`layout_of` turns a read-only ``zarr.Array`` into a Layout -- geometry, files and the
codec chain as steps (:mod:`gpu_zarr.engine.codecs.chain`) -- or raises
:class:`~gpu_zarr.errors.UnsupportedArrayError` naming what the engine cannot serve (only
non-numeric dtypes, irregular chunk grids, 0-dimensional arrays, and stores it cannot read).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpu_zarr.engine.codecs import stage_named, stages
from gpu_zarr.engine.codecs.chain import HOST, Chain, parse_v2, parse_v3, steps_label
from gpu_zarr.engine.layout import ChunkKeys, Layout
from gpu_zarr.errors import UnsupportedArrayError

__all__ = ["codec_of_chain", "codec_of_v2_compressor", "describe", "layout_of", "native_dtype", "shard_index_format"]


def _unsupported(what: str, found: str) -> UnsupportedArrayError:
    return UnsupportedArrayError(
        f"the direct (kvikio) engine reads {what}; this array has {found}. "
        "Use prefer='zarr-gpu' (or 'auto', which falls back to it)."
    )


class _RemoteRoot(str):
    """The URL of a remote array, joined with ``/`` as a Path would be (messages, keys)."""

    def __truediv__(self, key: str) -> _RemoteRoot:
        return _RemoteRoot(self.rstrip("/") + "/" + key)


def _root_and_source(arr: Any) -> tuple[Path, Any]:
    """(root, remote array): a local directory and None, or a remote array's URL and its
    :class:`~gpu_zarr.engine.layout.RemoteRef`."""
    from gpu_zarr.engine.sources.remote import ref_of

    ref = ref_of(arr)
    if ref is not None:
        return _RemoteRoot(ref.url), ref  # type: ignore[return-value]
    store = arr.store
    root = getattr(store, "root", None)
    if root is None or type(store).__name__ != "LocalStore":
        raise _unsupported("arrays in a local directory store or a remote store opened by gpu_zarr "
                           "(http, s3, gs)", f"a {type(store).__name__}")
    return (Path(root) / arr.path if arr.path else Path(root)), None


def native_dtype(dtype: np.dtype) -> np.dtype:
    """``dtype`` in native byte order; UnsupportedArrayError for non-numeric dtypes."""
    if dtype.kind not in "biufc" or dtype.itemsize > 16:
        raise _unsupported("numeric and bool arrays", f"dtype {dtype}")
    return dtype.newbyteorder("=") if dtype.byteorder not in ("=", "|") else dtype


def _regular_chunks(meta: Any) -> tuple[int, ...]:
    if getattr(meta, "zarr_format", 3) == 2:  # v2 chunks are always regular (newer zarr deprecates its chunk_grid)
        return tuple(int(c) for c in meta.chunks)
    grid = getattr(meta, "chunk_grid", None)
    shape = getattr(grid, "chunk_shape", None)
    if shape is None:
        raise _unsupported("regular chunk grids", f"chunk grid {grid!r}")
    return tuple(int(c) for c in shape)


def _fill(arr: Any, dtype: np.dtype) -> Any:
    fv = arr.fill_value  # zarr v2 ``fill_value: null``: zarr-python reads missing chunks as zeros
    return np.array(0 if fv is None else fv, dtype=dtype)[()]


def _or(names: Sequence[str]) -> str:
    """``a, b or c``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def codec_of_chain(codecs: Sequence[Any], where: str) -> tuple[str, str | None, dict[str, Any]]:
    """(codec, endian, codec_params) for a v3 chain ``[bytes, *rest]`` that one core stage decodes
    alone (:func:`~gpu_zarr.engine.codecs.chain.parse_v3`: no checksums, no other step); anything
    else is unsupported here (zarr-gpu's batched decoders take only such chains)."""
    try:
        chain: Chain | None = parse_v3(codecs, lambda: None, np.dtype("u1"))
    except UnsupportedArrayError:  # no array-to-bytes codec at all
        chain = None
    if chain is None or chain.codec == HOST or chain.frames or chain.elements or chain.transpose is not None:
        what = "chains " + _or([c for s in stages() for c in s.v3_chains])
        raise _unsupported(what, f"{where} codecs {[type(c).__name__ for c in codecs]}")
    return chain.codec, chain.endian, dict(chain.params)


def describe(lay: Layout, where: str = "") -> str:
    """A short description of what the engine reads, e.g. ``"zstd zarr v3, sharded"`` or
    ``"zarr v3, sharded: crc32c checked on the host, zstd"`` for a chain of several steps;
    ``where`` says where the core codec runs (e.g. "on the GPU")."""
    if not lay.frames and lay.host is None and not lay.elements and not where:
        stage = stage_named(lay.codec)
        codec = stage.label(lay.codec_params) if stage is not None else lay.codec
        return f"{codec} zarr v{lay.zarr_format}" + (", sharded" if lay.sharded else "")
    return f"zarr v{lay.zarr_format}" + (", sharded" if lay.sharded else "") + ": " + steps_label(lay, where)


def codec_of_v2_compressor(comp: Any, dtype: np.dtype) -> tuple[str, dict[str, Any]]:
    """(codec stage, its parameters) for a zarr v2 ``compressor`` (a numcodecs codec or None):
    the core stage that recognises it (:func:`~gpu_zarr.engine.codecs.chain.parse_v2`).

    Raises
    ------
    UnsupportedArrayError
        A compressor the engine has no core stage for.
    """
    chain = parse_v2(comp, None, dtype, "C", (1,), lambda: None, dtype)
    if chain.codec == HOST:
        found = comp.get_config() if hasattr(comp, "get_config") else repr(comp)
        raise _unsupported(_or([n for s in stages() for n in s.v2_names]) + " chunks", f"compressor {found}")
    return chain.codec, dict(chain.params)


def _spec(shape: Sequence[int], dtype: Any, fill_value: Any, order: str = "C") -> Any:
    """zarr's ArraySpec of one chunk (what its codecs see when they decode it)."""
    from zarr.core.array_spec import ArrayConfig, ArraySpec
    from zarr.core.buffer import default_buffer_prototype

    try:
        config = ArrayConfig.from_dict({"order": order})  # type: ignore[typeddict-item]
    except AttributeError:  # older zarr
        config = ArrayConfig(order=order, write_empty_chunks=False)  # type: ignore[arg-type]
    return ArraySpec(shape=tuple(shape), dtype=dtype, fill_value=fill_value, config=config,
                     prototype=default_buffer_prototype())


def _disk_dtype(dtype: np.dtype, chain: Chain, zarr_format: int) -> np.dtype:
    """Element type of the decoded chunk bytes the place step reads: native order for chunks the
    codecs decoded (they return native arrays); a v2 array's own dtype; the byte order of a v3
    chain's ``bytes`` step."""
    if chain.codec == HOST or chain.elements or dtype.itemsize == 1:  # element steps write native values
        return native_dtype(dtype)
    if zarr_format == 2:
        return dtype
    return dtype.newbyteorder("<" if chain.endian in ("little", None) else ">")


def shard_index_format(sc: Any) -> tuple[bool, bool, bool]:
    """(index at the end, index followed by crc32c, index big-endian) of a ``sharding_indexed``
    codec's index, in the formats the engine parses
    (:func:`~gpu_zarr.engine.sources.locate.index_entries`: ``[bytes]`` or ``[bytes, crc32c]``,
    either byte order).

    Raises
    ------
    UnsupportedArrayError
        Any other index chain.
    """
    idx = tuple(sc.index_codecs)
    idx_names = [type(c).__name__ for c in idx]
    if idx_names not in (["BytesCodec"], ["BytesCodec", "Crc32cCodec"]):
        raise _unsupported("shard indexes [bytes] or [bytes, crc32c]", f"index codecs {idx_names}")
    idx_endian = getattr(idx[0].endian, "value", idx[0].endian)
    return (getattr(sc.index_location, "value", sc.index_location) == "end", len(idx) == 2,
            idx_endian == "big")


def layout_of(arr: Any) -> Layout:
    """Describe a zarr array for the direct engine.

    Parameters
    ----------
    arr : zarr.Array
        Opened read-only.

    Returns
    -------
    Layout

    Raises
    ------
    UnsupportedArrayError
        For what the engine does not read: stores other than local directories and the remote
        stores gpu_zarr opens, irregular chunk grids, non-numeric dtypes, 0-dimensional arrays.
    """
    meta = arr.metadata
    shape = tuple(int(s) for s in arr.shape)
    if not shape:  # one value: the plan, the place step and the native library index chunks by axis
        raise _unsupported("arrays with at least one dimension", "none (a 0-dimensional array: one value)")
    root, source = _root_and_source(arr)
    chunks = _regular_chunks(meta)
    if meta.zarr_format == 2:
        dtype = np.dtype(meta.dtype.to_native_dtype() if hasattr(meta.dtype, "to_native_dtype") else arr.dtype)
        out = native_dtype(dtype)
        chain = parse_v2(meta.compressor, meta.filters, dtype, meta.order, chunks,
                         lambda: _spec(chunks, meta.dtype, meta.fill_value, meta.order), out)
        return _layout(arr, shape, chunks, chunks, dtype, chain, False, (True, False, False), root, source, 2)
    dtype = np.dtype(meta.data_type.to_native_dtype())
    out = native_dtype(dtype)
    codecs = tuple(meta.codecs)
    if len(codecs) == 1 and type(codecs[0]).__name__ == "ShardingCodec":
        sc = codecs[0]
        inner = tuple(int(c) for c in sc.chunk_shape)
        index = shard_index_format(sc)
        chain = parse_v3(tuple(sc.codecs), lambda: _spec(inner, meta.data_type, meta.fill_value), out)
        return _layout(arr, shape, chunks, inner, dtype, chain, True, index, root, source, 3)
    chain = parse_v3(codecs, lambda: _spec(chunks, meta.data_type, meta.fill_value), out)
    return _layout(arr, shape, chunks, chunks, dtype, chain, False, (True, False, False), root, source, 3)


def _layout(arr: Any, shape: tuple[int, ...], chunks: tuple[int, ...], inner: tuple[int, ...], dtype: np.dtype,
            chain: Chain, sharded: bool, index: tuple[bool, bool, bool], root: Any, source: Any,
            zarr_format: int) -> Layout:
    disk = _disk_dtype(dtype, chain, zarr_format)
    out = native_dtype(disk)
    return Layout(shape, disk, out, _fill(arr, out), chunks, inner, chain.codec, sharded, index[0], index[1],
                  root, _chunk_keys(arr.metadata), zarr_format, codec_params=dict(chain.params),
                  transpose=chain.transpose, source=source, frames=chain.frames, host=chain.host,
                  index_big_endian=index[2], elements=chain.elements)


def _chunk_keys(meta: Any) -> ChunkKeys:
    """The array's chunk key encoding as plain data, checked against zarr's own encoder."""
    def text(v: Any) -> str:
        return str(getattr(v, "value", v))

    if meta.zarr_format == 2:
        keys = ChunkKeys("", text(getattr(meta, "dimension_separator", None) or "."))
    else:
        enc = meta.chunk_key_encoding
        name, sep = text(getattr(enc, "name", "")), text(getattr(enc, "separator", "/"))
        if name not in ("default", "v2"):
            raise _unsupported("chunk key encodings default or v2", f"chunk key encoding {name!r}")
        keys = ChunkKeys("c" if name == "default" else "", sep)
    probe = tuple(range(1, len(meta.shape) + 1))
    if keys(probe) != meta.encode_chunk_key(probe):
        raise _unsupported(f"chunk keys like {keys(probe)!r}", f"zarr names chunk {probe} {meta.encode_chunk_key(probe)!r}")
    return keys
