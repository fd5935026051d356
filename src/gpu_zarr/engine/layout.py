"""What the engine needs to know about an array, read from zarr-python's own metadata.

:func:`layout_of` turns a read-only ``zarr.Array`` into a :class:`Layout`, or raises
:class:`~gpu_zarr.errors.UnsupportedArrayError` naming what the direct engine cannot serve
(``auto`` then falls back to the zarr-gpu path).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpu_zarr.engine.codecs import stage_named, stages
from gpu_zarr.engine.fit import nbytes_of
from gpu_zarr.errors import UnsupportedArrayError

__all__ = ["Layout", "batch_key", "chunk_layout", "codec_of_chain", "codec_of_v2_compressor", "describe", "layout_of",
           "native_dtype"]


@dataclass(frozen=True)
class Layout:
    """Geometry, codec and files of one zarr array, as the engine reads it.

    Attributes
    ----------
    shape : tuple of int
    disk_dtype : numpy.dtype
        Element type of decoded chunk bytes, with the byte order on disk.
    out_dtype : numpy.dtype
        Native-order dtype of what the engine returns (cupy has no big-endian arrays).
    fill_value : numpy scalar
        Value of never-written chunks, as zarr-python reads them.
    chunk_shape : tuple of int
        Shape of one stored object (a shard when sharded).
    inner_shape : tuple of int
        Shape of one decodable chunk (equal to ``chunk_shape`` unless sharded).
    codec : str
        Codec stage of each (inner) chunk's bytes ("raw", "zstd", ...: the name of a
        registered stage, see :func:`gpu_zarr.engine.codecs.stages`).
    sharded : bool
    index_at_end : bool
        Shard index position (``index_location``).
    index_crc : bool
        Shard index followed by a crc32c checksum.
    root : pathlib.Path
        Directory of the array on the local file system.
    chunk_key : callable
        Chunk-grid coordinates -> key relative to ``root`` (zarr's own encoder).
    zarr_format : int
    codec_params : mapping
        Parameters of the codec stage (e.g. a Blosc typesize), empty when it needs none.
    transpose : tuple of int or None
        How a decoded chunk's elements are ordered: None for C order; else the chunk is
        stored as ``chunk.transpose(transpose)`` in C order (zarr v2 ``order: "F"`` is the
        reversed axes, zarr v3's ``transpose`` codec gives its ``order``).
    source : gpu_zarr.engine.remote.RemoteSource or None
        Where the bytes come from when the array is remote (``root`` is then its URL);
        None for a local directory store.
    """

    shape: tuple[int, ...]
    disk_dtype: np.dtype
    out_dtype: np.dtype
    fill_value: Any
    chunk_shape: tuple[int, ...]
    inner_shape: tuple[int, ...]
    codec: str
    sharded: bool
    index_at_end: bool
    index_crc: bool
    root: Path
    chunk_key: Callable[[tuple[int, ...]], str]
    zarr_format: int
    codec_params: Mapping[str, Any] = field(default_factory=dict)
    transpose: tuple[int, ...] | None = None
    source: Any = field(default=None, compare=False, repr=False)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def inner_nbytes(self) -> int:
        """Decoded size of one (inner) chunk in bytes (edge chunks are stored whole)."""
        return nbytes_of(self.inner_shape, self.disk_dtype.itemsize)  # Python ints: never wraps

    @property
    def inner_per_shard(self) -> tuple[int, ...]:
        return tuple(c // i for c, i in zip(self.chunk_shape, self.inner_shape))

    def path_of(self, coords: tuple[int, ...]) -> Path:
        return self.root / self.chunk_key(tuple(int(c) for c in coords))


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
    """(root, remote source): a local directory and None, or a remote array's URL and source."""
    from gpu_zarr.engine.remote import source_of

    src = source_of(arr)
    if src is not None:
        return _RemoteRoot(src.url), src  # type: ignore[return-value]
    return _local_root(arr), None


def _local_root(arr: Any) -> Path:
    store = arr.store
    root = getattr(store, "root", None)
    if root is None or type(store).__name__ != "LocalStore":
        raise _unsupported("arrays in a local directory store or a remote store opened by gpu_zarr "
                           "(http, s3, gs)", f"a {type(store).__name__}")
    return Path(root) / arr.path if arr.path else Path(root)


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
    fv = arr.fill_value
    if fv is None:  # zarr v2 ``fill_value: null``: zarr-python reads missing chunks as zeros
        fv = 0
    return np.array(fv, dtype=dtype)[()]


def _or(names: Sequence[str]) -> str:
    """``a, b or c``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def codec_of_chain(codecs: Sequence[Any], where: str) -> tuple[str, str | None, dict[str, Any]]:
    """(codec, endian, codec_params) for a v3 chain ``[bytes, *rest]`` that a registered codec stage
    recognises (:func:`gpu_zarr.engine.codecs.stages`); anything else is unsupported."""
    from zarr.codecs import BytesCodec

    registered = stages()
    what = "chains " + _or([c for s in registered for c in s.v3_chains])
    if not codecs or not isinstance(codecs[0], BytesCodec):
        names = [type(c).__name__ for c in codecs]
        raise _unsupported(what, f"{where} codecs {names}")
    endian = codecs[0].endian
    endian = getattr(endian, "value", endian)
    rest = tuple(codecs[1:])
    for stage in registered:
        if (params := stage.recognise_v3(rest)) is not None:
            return stage.name, endian, params
    names = [type(c).__name__ for c in codecs]
    raise _unsupported(what, f"{where} codecs {names}")


def batch_key(lay: Layout) -> tuple[Any, ...] | None:
    """What chunks must share to be read, decoded and placed by one engine read although they
    belong to different arrays (:func:`gpu_zarr.engine.pipeline.read_many`): the codec stage and
    its parameters, the (inner) chunk shape, the dtypes, the element order and the fill value.
    Layouts with equal keys can be read together; None for a remote array (its fetch stage
    belongs to its own store)."""
    if lay.source is not None:
        return None
    fill = np.asarray(lay.fill_value, lay.out_dtype).tobytes()  # bytes: NaN equals NaN
    params = tuple(sorted((str(k), repr(v)) for k, v in lay.codec_params.items()))
    return (lay.codec, params, lay.inner_shape, lay.disk_dtype.str, lay.out_dtype.str, lay.transpose, fill)


def describe(lay: Layout) -> str:
    """A short description of what the engine reads, e.g. ``"zstd zarr v3, sharded"``."""
    stage = stage_named(lay.codec)
    codec = stage.label(lay.codec_params) if stage is not None else lay.codec
    return f"{codec} zarr v{lay.zarr_format}" + (", sharded" if lay.sharded else "")


def codec_of_v2_compressor(comp: Any, dtype: np.dtype) -> tuple[str, dict[str, Any]]:
    """(codec stage, its parameters) for a zarr v2 ``compressor`` (a numcodecs codec or None):
    the first registered stage that recognises it (:func:`gpu_zarr.engine.codecs.stages`).

    Raises
    ------
    UnsupportedArrayError
        A compressor the engine has no stage for.
    """
    registered = stages()
    for stage in registered:
        if (params := stage.recognise_v2(comp, dtype)) is not None:
            return stage.name, params
    found = comp.get_config() if hasattr(comp, "get_config") else repr(comp)
    raise _unsupported(_or([n for s in registered for n in s.v2_names]) + " chunks", f"compressor {found}")


def chunk_layout(shape: tuple[int, ...], dtype: np.dtype, codec: str, params: Mapping[str, Any] | None = None,
                 transpose: tuple[int, ...] | None = None) -> Layout:
    """The layout of one chunk held in memory (not in a store): what the codec stages need to
    decode chunks that zarr-python has already read (:func:`gpu_zarr.engine.decode_chunks`)."""
    disk = np.dtype(dtype)
    out = native_dtype(disk)
    return Layout(tuple(shape), disk, out, np.zeros((), out)[()], tuple(shape), tuple(shape), codec, False, True,
                  False, Path("."), lambda coords: "", 2, codec_params=dict(params or {}), transpose=transpose)


def _strip_transpose(codecs: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[int, ...] | None]:
    """A leading v3 ``transpose`` codec becomes the layout's permutation (placed by the
    place stage); the identity permutation is no permutation."""
    if codecs and type(codecs[0]).__name__ == "TransposeCodec":
        perm = tuple(int(a) for a in codecs[0].order)
        return codecs[1:], None if perm == tuple(range(len(perm))) else perm
    return codecs, None


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
        For what the engine does not read: non-local stores, filters, codecs it has no
        stage for, irregular chunk grids, non-numeric dtypes.
    """
    meta = arr.metadata
    root, source = _root_and_source(arr)
    shape = tuple(int(s) for s in arr.shape)
    chunks = _regular_chunks(meta)
    dtype = np.dtype(meta.dtype.to_native_dtype() if hasattr(meta, "dtype") else arr.dtype)
    if meta.zarr_format == 2:
        perm = tuple(range(len(shape)))[::-1] if meta.order == "F" and len(shape) > 1 else None
        if meta.filters:
            raise _unsupported("arrays without filters", f"filters {[f.codec_id for f in meta.filters]}")
        codec, params = codec_of_v2_compressor(meta.compressor, dtype)
        disk = dtype
        return Layout(shape, disk, native_dtype(disk), _fill(arr, native_dtype(disk)), chunks, chunks, codec,
                      False, True, False, root, meta.encode_chunk_key, 2, codec_params=params, transpose=perm,
                      source=source)

    dtype = np.dtype(meta.data_type.to_native_dtype())
    codecs = tuple(meta.codecs)
    sharded = len(codecs) == 1 and type(codecs[0]).__name__ == "ShardingCodec"
    if sharded:
        sc = codecs[0]
        inner = tuple(int(c) for c in sc.chunk_shape)
        inner_codecs, perm = _strip_transpose(tuple(sc.codecs))
        codec, endian, params = codec_of_chain(inner_codecs, "inner")
        idx = tuple(sc.index_codecs)
        idx_names = [type(c).__name__ for c in idx]
        if idx_names not in (["BytesCodec"], ["BytesCodec", "Crc32cCodec"]):
            raise _unsupported("shard indexes [bytes] or [bytes, crc32c]", f"index codecs {idx_names}")
        idx_endian = getattr(idx[0].endian, "value", idx[0].endian)
        if idx_endian not in ("little", None):
            raise _unsupported("little-endian shard indexes", f"{idx_endian}-endian")
        index_at_end = getattr(sc.index_location, "value", sc.index_location) == "end"
        index_crc = len(idx) == 2
    else:
        inner = chunks
        array_codecs, perm = _strip_transpose(codecs)
        codec, endian, params = codec_of_chain(array_codecs, "array")
        index_at_end, index_crc = True, False
    disk = dtype if dtype.itemsize == 1 else dtype.newbyteorder("<" if endian in ("little", None) else ">")
    if dtype.kind == "c":
        disk = np.dtype(disk)
    out = native_dtype(disk)
    return Layout(shape, disk, out, _fill(arr, out), chunks, inner, codec, sharded, index_at_end,
                  index_crc, root, meta.encode_chunk_key, 3, codec_params=params, transpose=perm,
                  source=source)
