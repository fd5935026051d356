"""Plan one array's write: its grid of write units (shards, or chunks when unsharded) and
the batches they are encoded in.

Pure Python and numpy index arithmetic: no I/O, no GPU. A *unit* is what becomes one file:
a shard (v3 sharded) or a chunk (v3 unsharded, v2). Each unit is a box of the array, cut into
inner chunks of the chunk shape; a unit at the array's end keeps its full shape (zarr pads
edge chunks with the fill value) and its inner chunks wholly outside the array are left out
(their index entry says "missing", as zarr-python writes them).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from gpu_zarr.errors import UsageError

__all__ = ["Unit", "WritePlan", "auto_shards", "make_plan"]


@dataclass(frozen=True)
class Unit:
    """One file of the array: its grid index, its box, and which inner chunks lie in the array."""

    index: tuple[int, ...]
    start: tuple[int, ...]
    stop: tuple[int, ...]  # clipped to the array's shape
    present: np.ndarray  # bool, one per inner chunk in C order

    @property
    def region(self) -> tuple[slice, ...]:
        return tuple(slice(a, b) for a, b in zip(self.start, self.stop, strict=True))


@dataclass(frozen=True)
class WritePlan:
    """How one array is cut into files and inner chunks.

    Attributes
    ----------
    shape, chunks : tuple of int
    shards : tuple of int or None
        Shard shape (a multiple of ``chunks``), None for an unsharded array.
    dtype : numpy.dtype
    zarr_format : int
        2 or 3.
    separator : str
        Chunk key separator ("/" or ".").
    """

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    shards: tuple[int, ...] | None
    dtype: np.dtype
    zarr_format: int
    separator: str = "/"

    @property
    def unit_shape(self) -> tuple[int, ...]:
        return self.shards if self.shards is not None else self.chunks

    @property
    def chunks_per_unit(self) -> tuple[int, ...]:
        return tuple(u // c for u, c in zip(self.unit_shape, self.chunks, strict=True))

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(-(-s // u) for s, u in zip(self.shape, self.unit_shape, strict=True))

    @property
    def chunk_nbytes(self) -> int:
        return math.prod(self.chunks) * self.dtype.itemsize

    @property
    def unit_nbytes(self) -> int:
        return math.prod(self.unit_shape) * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def key(self, index: Sequence[int]) -> str:
        """The store key of a unit, relative to the array ("c/0/1" in v3, "0.1" or "0/1" in v2)."""
        if self.zarr_format == 3:
            return self.separator.join(["c", *map(str, index)]) if index else "c"
        return self.separator.join(map(str, index)) if index else "0"

    def units(self) -> Iterator[Unit]:
        """Every unit of the array, in C order of the grid."""
        cpu = self.chunks_per_unit
        for idx in itertools.product(*(range(g) for g in self.grid)):
            start = tuple(i * u for i, u in zip(idx, self.unit_shape, strict=True))
            stop = tuple(min(s, a + u) for s, a, u in zip(self.shape, start, self.unit_shape, strict=True))
            # inner chunks with any element inside the array, per axis, then their outer product
            axes = [np.arange(n) * c < (b - a) for n, c, a, b in zip(cpu, self.chunks, start, stop, strict=True)]
            present = np.ones((), bool)
            for ax in axes:
                present = np.multiply.outer(present, ax)
            yield Unit(idx, start, stop, present.reshape(-1))

    def batches(self, batch_bytes: int) -> Iterator[list[Unit]]:
        """Units grouped so that a batch holds at most ``batch_bytes`` decoded bytes (at least one unit)."""
        per = max(1, batch_bytes // max(1, self.unit_nbytes))
        batch: list[Unit] = []
        for unit in self.units():
            batch.append(unit)
            if len(batch) >= per:
                yield batch
                batch = []
        if batch:
            yield batch


def _tuple(name: str, value: Sequence[int] | int, ndim: int) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)):
        value = (int(value),) * ndim
    out = tuple(int(v) for v in value)
    if len(out) != ndim or any(v < 1 for v in out):
        raise UsageError(f"{name}={tuple(value)!r}: expected {ndim} positive integers, one per axis")
    return out


def auto_shards(shape: Sequence[int], chunks: Sequence[int], itemsize: int, shard_bytes: int) -> tuple[int, ...]:
    """A shard shape of about ``shard_bytes`` decoded bytes: chunks grown along the last axes
    first (a whole plane's chunks in a shard before the next plane), never past the array's
    extent rounded up to a chunk multiple."""
    shard = list(chunks)
    for ax in reversed(range(len(shape))):
        room = -(-int(shape[ax]) // chunks[ax])  # chunks along this axis
        have = math.prod(shard) * itemsize
        grow = max(1, min(room, shard_bytes // max(1, have)))
        shard[ax] = chunks[ax] * grow
    return tuple(shard)


def make_plan(shape: Sequence[int], dtype: np.dtype, chunks: Sequence[int] | int,
              shards: Sequence[int] | int | bool | None, zarr_format: int, *,
              shard_bytes: int, separator: str | None = None) -> WritePlan:
    """Check a write's geometry and return its :class:`WritePlan`.

    ``shards``: a shape (a multiple of ``chunks`` on every axis), ``None``/``True`` for an
    automatic shard of about ``shard_bytes`` (v3), or ``False`` for no sharding. v2 arrays
    are never sharded.

    Raises
    ------
    UsageError
        Chunks or shards of the wrong length, not positive, or shards not a multiple of chunks;
        shards asked for a v2 array; an unknown zarr format.
    """
    shape = tuple(int(s) for s in shape)
    ndim = len(shape)
    if zarr_format not in (2, 3):
        raise UsageError(f"zarr_format={zarr_format!r}: expected 2 or 3")
    chunk_t = _tuple("chunks", chunks, ndim)
    shard_t: tuple[int, ...] | None
    if zarr_format == 2:
        if shards not in (None, False):
            raise UsageError(f"shards={shards!r} asked for a zarr v2 array: v2 has no sharding; write v3 "
                             "(zarr_format=3 / OME-Zarr 0.5) or leave shards out")
        shard_t = None
    elif shards is False:
        shard_t = None
    elif shards is None or shards is True:
        shard_t = auto_shards(shape, chunk_t, np.dtype(dtype).itemsize, shard_bytes)
    else:
        shard_t = _tuple("shards", shards, ndim)
        bad = [ax for ax in range(ndim) if shard_t[ax] % chunk_t[ax]]
        if bad:
            raise UsageError(f"shards={shard_t} is not a multiple of chunks={chunk_t} along axes {bad}: "
                             "each shard holds whole inner chunks")
    sep = separator if separator is not None else ("/" if zarr_format == 3 else ".")
    return WritePlan(shape, chunk_t, shard_t, np.dtype(dtype), zarr_format, sep)
