"""What the engine needs to know about an array: a pure description (:class:`Layout`).

:func:`gpu_zarr.engine.metadata.layout_of` makes one from zarr-python's own metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_zarr.engine.fit import nbytes_of

if TYPE_CHECKING:
    from gpu_zarr.location import Location

__all__ = ["ChunkKeys", "Layout", "RemoteRef", "batch_key", "chunk_layout"]


@dataclass(frozen=True)
class RemoteRef:
    """Which remote array a :class:`Layout` describes, as plain data: the engine gets the live
    source (its requests, its shard indexes) from the runtime
    (:func:`gpu_zarr.engine.sources.remote.remote_source`).

    Attributes
    ----------
    url : str
        The array's URL (messages, cache keys).
    path : str
        Its key inside the store ("" at the store's root).
    base : str
        The store's URL.
    location : gpu_zarr.location.Location or None
        The store as gpu_zarr opened it (URL, scheme, storage options); None for a
        ``zarr.storage.ObjectStore`` made elsewhere, read through ``store``.
    requests : int
        Requests in flight at once.
    timeout_s : float or None
        Deadline of one request (None: the ``remote_timeout`` setting).
    store : obstore store or None
        The obstore store of a ``zarr.storage.ObjectStore`` not opened by gpu_zarr (the
        caller's object, read as given); None otherwise.
    """

    url: str
    path: str
    base: str
    location: Location | None
    requests: int
    timeout_s: float | None = None
    store: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ChunkKeys:
    """How chunk-grid coordinates name a stored object, as plain data (zarr's chunk key
    encodings): v3's ``default`` is ``prefix="c"`` (``c/0/1/2``), v2 and v3's ``v2`` encoding
    have no prefix (``0.1.2``, a 0-d array's chunk is ``0``)."""

    prefix: str
    separator: str

    def __call__(self, coords: tuple[int, ...]) -> str:
        parts = ([self.prefix] if self.prefix else []) + [str(int(c)) for c in coords]
        return self.separator.join(parts) if parts else "0"


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
        Core codec stage of each (inner) chunk's bytes ("raw", "zstd", ...: the name of a
        registered stage, see :func:`gpu_zarr.engine.codecs.stages`), or "host" when the
        chunks are decoded by their codecs' own decode (``host``).
    sharded : bool
    index_at_end : bool
        Shard index position (``index_location``).
    index_crc : bool
        Shard index followed by a crc32c checksum.
    index_big_endian : bool
        Shard index entries stored big-endian (the index chain's ``bytes`` codec).
    root : pathlib.Path
        Directory of the array on the local file system.
    chunk_key : ChunkKeys
        Chunk-grid coordinates -> key relative to ``root``.
    zarr_format : int
    codec_params : mapping
        Parameters of the codec stage (e.g. a Blosc typesize), empty when it needs none.
    transpose : tuple of int or None
        How a decoded chunk's elements are ordered: None for C order; else the chunk is
        stored as ``chunk.transpose(transpose)`` in C order (zarr v2 ``order: "F"`` is the
        reversed axes, zarr v3's ``transpose`` codec gives its ``order``).
    source : RemoteRef or None
        Which remote array the bytes come from (``root`` is then its URL), as plain data;
        None for a local directory store.
    frames : tuple of gpu_zarr.engine.codecs.frames.Frame
        Checksums around each (inner) chunk's bytes, outermost first, verified and stripped
        before the core codec.
    host : gpu_zarr.engine.codecs.host.HostChain or None
        The codecs that decode each chunk on the host when ``codec`` is "host".
    elements : tuple of gpu_zarr.engine.codecs.elements.ElementStep
        Element steps after the core codec, in decode order (filters); the core then decodes
        each chunk to ``stored_nbytes`` of the first step's stored dtype.
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
    chunk_key: ChunkKeys
    zarr_format: int
    codec_params: Mapping[str, Any] = field(default_factory=dict)
    transpose: tuple[int, ...] | None = None
    source: RemoteRef | None = field(default=None, compare=False, repr=False)
    frames: tuple[Any, ...] = ()
    host: Any = field(default=None, compare=False, repr=False)
    index_big_endian: bool = False
    elements: tuple[Any, ...] = ()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def inner_nbytes(self) -> int:
        """Decoded size of one (inner) chunk in bytes (edge chunks are stored whole)."""
        return nbytes_of(self.inner_shape, self.disk_dtype.itemsize)  # Python ints: never wraps

    @property
    def stored_nbytes(self) -> int:
        """Bytes the core codec decodes one (inner) chunk to: the first element step's stored
        elements, or the decoded chunk itself when the chain has no element steps."""
        if not self.elements:
            return self.inner_nbytes
        return nbytes_of(self.inner_shape, self.elements[0].stored.itemsize)

    @property
    def frame_bytes(self) -> int:
        """Bytes the checksum frames add to each stored (inner) chunk."""
        return sum(int(f.trailer) for f in self.frames)

    @property
    def inner_per_shard(self) -> tuple[int, ...]:
        return tuple(c // i for c, i in zip(self.chunk_shape, self.inner_shape))


def batch_key(lay: Layout) -> tuple[Any, ...] | None:
    """What chunks must share to be read, decoded and placed by one engine read although they
    belong to different arrays (:func:`gpu_zarr.engine.pipeline.read_many`): the codec stage and
    its parameters, the (inner) chunk shape, the dtypes, the element order and the fill value.
    Layouts with equal keys can be read together; None for a remote array (its fetch stage
    belongs to its own store) and a host chain (its codecs are objects of its own metadata)."""
    if lay.source is not None or lay.host is not None:
        return None
    fill = np.asarray(lay.fill_value, lay.out_dtype).tobytes()  # bytes: NaN equals NaN
    params = tuple(sorted((str(k), repr(v)) for k, v in lay.codec_params.items()))
    frames = tuple(f.name for f in lay.frames)
    return (lay.codec, params, frames, lay.elements, lay.inner_shape, lay.disk_dtype.str, lay.out_dtype.str,
            lay.transpose, fill)


def chunk_layout(shape: tuple[int, ...], dtype: np.dtype, codec: str, params: Mapping[str, Any] | None = None,
                 transpose: tuple[int, ...] | None = None) -> Layout:
    """The layout of one chunk held in memory (not in a store): what the codec stages need to
    decode chunks that zarr-python has already read (:func:`gpu_zarr.engine.decode_chunks`)."""
    disk = np.dtype(dtype)
    out = disk.newbyteorder("=") if disk.byteorder not in ("=", "|") else disk
    return Layout(tuple(shape), disk, out, np.zeros((), out)[()], tuple(shape), tuple(shape), codec, False, True,
                  False, Path("."), ChunkKeys("", "."), 2, codec_params=dict(params or {}), transpose=transpose)
