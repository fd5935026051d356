"""Stage 1, plan: which (inner) chunks a selection needs and where each one lands.

Pure Python and numpy: no I/O, no GPU. The placement table built here is what the GPU
scatter kernel and its CPU twin both consume.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_zarr.engine.layout import Layout

__all__ = ["Batch", "LazyNames", "Part", "Pieces", "Region", "make_batches", "merge_pieces", "normalize_key",
           "normalize_selection", "plan_pieces"]


_WHOLE = slice(None)


@dataclass(frozen=True)
class Region:
    """A numpy basic-indexing selection, as a step-1 box plus what to apply to it.

    Attributes
    ----------
    start, stop : tuple of int
        Bounding box read from the array.
    post : tuple
        Index applied to the box result (steps, integer dimensions dropped).
    out_shape : tuple of int
        Shape of the final result (equal to ``array[selection].shape``).
    """

    start: tuple[int, ...]
    stop: tuple[int, ...]
    post: tuple
    out_shape: tuple[int, ...]

    @property
    def box_shape(self) -> tuple[int, ...]:
        return tuple([b - a for a, b in zip(self.start, self.stop)])

    @property
    def is_box(self) -> bool:
        """True when the result is the box itself (no steps, no dropped dimensions)."""
        return all([p == _WHOLE for p in self.post])


def normalize_key(shape: tuple[int, ...], key: Any) -> tuple[int | slice, ...]:
    """Normalise a basic-indexing key the way numpy does: one entry per axis, an in-range
    non-negative int or a ``slice(start, stop, step)`` as ``slice.indices`` gives it.

    Raises
    ------
    IndexError
        Out-of-range integers, too many indices, more than one Ellipsis.
    TypeError
        Not basic indexing (arrays, lists, booleans, ``None``).
    """
    sel = key if isinstance(key, tuple) else (key,)
    ell = [k for k, s in enumerate(sel) if s is Ellipsis]
    if len(ell) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if ell:
        i = ell[0]
        fill = len(shape) - (len(sel) - 1)
        sel = sel[:i] + (slice(None),) * max(fill, 0) + sel[i + 1:]
    if len(sel) > len(shape):
        raise IndexError(f"too many indices: array is {len(shape)}-dimensional, {len(sel)} were indexed")
    sel = sel + (slice(None),) * (len(shape) - len(sel))
    out: list[int | slice] = []
    for dim, (s, n) in enumerate(zip(sel, shape)):
        if isinstance(s, slice):
            out.append(slice(*s.indices(n)))
            continue
        if isinstance(s, (bool, np.bool_)) or s is None:
            raise TypeError(f"only integers, slices and Ellipsis are supported (basic indexing); got {s!r} "
                            f"for axis {dim}")
        try:
            i = operator.index(s)
        except TypeError:
            raise TypeError(f"only integers, slices and Ellipsis are supported (basic indexing); got "
                            f"{type(s).__name__} for axis {dim}") from None
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of bounds for axis {dim} with size {n}")
        out.append(i % n)
    return tuple(out)


def normalize_selection(shape: tuple[int, ...], selection: Any = Ellipsis) -> Region:
    """The :class:`Region` of a basic-indexing selection (see :func:`normalize_key`); a
    Region of this shape is returned as it is (a backend's caller normalised it already)."""
    if isinstance(selection, Region):
        if len(selection.stop) != len(shape) or any(b > n for b, n in zip(selection.stop, shape)):
            raise IndexError(f"the region {selection.start}..{selection.stop} lies outside the array's shape {shape}")
        return selection
    sel = (selection,) if type(selection) is int else selection
    if type(sel) is tuple and len(sel) <= len(shape):
        # a viewer's plane (integers, then whole axes) in one step: it ran cold before every
        # plane's requests left (no generator expressions here: each step of one was a call)
        at = []
        for s, n in zip(sel, shape):
            if type(s) is not int or not -n <= s < n:
                break
            at.append(s % n)
        else:
            rest = tuple(shape[len(at):])
            return Region(tuple(at) + (0,) * len(rest), tuple([i + 1 for i in at]) + rest,
                          (0,) * len(at) + (_WHOLE,) * len(rest), rest)
    start: list[int] = []
    stop: list[int] = []
    post: list[Any] = []
    out_shape: list[int] = []
    for s in normalize_key(shape, selection):
        if isinstance(s, int):
            start.append(s)
            stop.append(s + 1)
            post.append(0)
            continue
        r = range(s.start, s.stop, s.step)
        if len(r) == 0:
            start.append(0)
            stop.append(0)
            post.append(slice(None))
            out_shape.append(0)
            continue
        lo, hi = min(r[0], r[-1]), max(r[0], r[-1]) + 1
        start.append(lo)
        stop.append(hi)
        out_shape.append(len(r))
        if r.step == 1:
            post.append(slice(None))
        elif r.step > 0:
            post.append(slice(0, None, r.step))
        else:
            post.append(slice(hi - 1 - lo, None, r.step))
    return Region(tuple(start), tuple(stop), tuple(post), tuple(out_shape))


class Pieces:
    """The (inner) chunks a box needs.

    Attributes
    ----------
    coords : ndarray, shape (n, ndim), int64
        Inner-chunk grid coordinates.
    table : ndarray, shape (n, ndim, 4), int64
        Per piece and dimension: chunk extent, selection start within the chunk,
        selection length, start in the output box. The place stage reads this table.
    cells : list of tuple of int
        ``coords`` as Python ints (what chunk keys are made from).

    A small plan (:meth:`small`) keeps Python lists and makes its table and arrays when first
    asked for: a remote plane's requests leave before any numpy call; its table is made while they travel.
    """

    __slots__ = ("_box", "_cells", "_coords", "_ndim", "_table")

    def __init__(self, coords: np.ndarray, table: np.ndarray) -> None:
        self._coords: np.ndarray | None = coords
        self._table: np.ndarray | None = table
        self._cells: list[tuple[int, ...]] | None = None
        self._box: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None
        self._ndim = int(coords.shape[1]) if coords.ndim == 2 else 0

    @classmethod
    def small(cls, cells: list[tuple[int, ...]], shape: tuple[int, ...], start: tuple[int, ...],
              stop: tuple[int, ...]) -> Pieces:
        """Pieces from ``cells`` (coordinates) of chunks of ``shape`` meeting the box ``[start, stop)``."""
        p = cls.__new__(cls)
        p._coords = p._table = None
        p._cells, p._box, p._ndim = cells, (shape, start, stop), len(shape)
        return p

    @property
    def coords(self) -> np.ndarray:
        if self._coords is None:
            assert self._cells is not None
            self._coords = np.array(self._cells, np.int64).reshape(len(self._cells), self._ndim)
        return self._coords

    @property
    def table(self) -> np.ndarray:
        if self._table is None:
            assert self._box is not None and self._cells is not None
            shape, start, stop = self._box
            # (one flat list: nested lists and min/max per value took twice as long)
            flat: list[int] = []
            for co in self._cells:
                for c, a, b, i in zip(shape, start, stop, co):
                    o = i * c
                    p = o if o > a else a
                    e = o + c if o + c < b else b
                    flat += (c, p - o, e - p, p - a)
            self._table = np.array(flat, np.int64).reshape(len(self._cells), self._ndim, 4)
        return self._table

    @property
    def cells(self) -> list[tuple[int, ...]]:
        if self._cells is None:
            self._cells = [tuple(c) for c in self.coords.tolist()]
        return self._cells

    def __len__(self) -> int:
        return len(self._cells) if self._cells is not None else len(self.coords)


SMALL_PLAN = 64  # pieces up to which plan_pieces works in plain Python


def plan_pieces(layout: Layout, start: tuple[int, ...], stop: tuple[int, ...]) -> Pieces:
    """Every (inner) chunk that intersects the box ``[start, stop)``, with its placement."""
    ndim = layout.ndim
    if any([b <= a for a, b in zip(start, stop)]):
        return Pieces(np.zeros((0, ndim), np.int64), np.zeros((0, ndim, 4), np.int64))
    shape = tuple([int(c) for c in layout.inner_shape])
    spans = [range(a // c, (b - 1) // c + 1) for a, b, c in zip(start, stop, shape)]
    count = math.prod([len(r) for r in spans])
    if count <= SMALL_PLAN:
        # a viewer's plane or tile: plain Python (numpy calls on tiny arrays cost more), the table made when asked for
        return Pieces.small(list(itertools.product(*spans)), shape, tuple(start), tuple(stop))
    inner = np.asarray(shape, dtype=np.int64)
    ranges = [np.arange(r.start, r.stop, dtype=np.int64) for r in spans]
    grids = np.meshgrid(*ranges, indexing="ij")
    coords = np.stack([g.ravel() for g in grids], axis=1) if ndim else np.zeros((1, 0), np.int64)
    origin = coords * inner
    lo = np.maximum(origin, np.asarray(start, np.int64))
    hi = np.minimum(origin + inner, np.asarray(stop, np.int64))
    table = np.empty((len(coords), ndim, 4), np.int64)
    table[:, :, 0] = inner
    table[:, :, 1] = lo - origin
    table[:, :, 2] = hi - lo
    table[:, :, 3] = lo - np.asarray(start, np.int64)
    return Pieces(coords, table)


@dataclass(frozen=True)
class Part:
    """A box of one array and where it lands in an output shared with other arrays' boxes
    (:func:`gpu_zarr.engine.pipeline.read_many`).

    Attributes
    ----------
    layout : Layout
        The array.
    start, stop : tuple of int
        The box ``[start, stop)`` read from it (step 1, every axis kept).
    at : tuple of int
        Where the box's first element lands in the output.
    """

    layout: Layout
    start: tuple[int, ...]
    stop: tuple[int, ...]
    at: tuple[int, ...]

    @property
    def box_shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.start, self.stop))


def merge_pieces(pieces: Sequence[Pieces], at: Sequence[Sequence[int]]) -> Pieces:
    """The pieces of several boxes as one set, in order: each box's placements moved by its
    ``at`` (where the box lands in the shared output). Coordinates stay each array's own."""
    if not pieces:
        return Pieces(np.zeros((0, 0), np.int64), np.zeros((0, 0, 4), np.int64))
    tables = []
    for p, a in zip(pieces, at, strict=True):
        t = p.table.copy()
        t[:, :, 3] += np.asarray(a, np.int64)
        tables.append(t)
    return Pieces(np.concatenate([p.coords for p in pieces]), np.concatenate(tables))


class LazyNames(Sequence[str]):
    """Chunk names made only when an error message needs one (``name(k)`` for the k-th):
    building thousands of names per read cost as much as locating the chunks."""

    def __init__(self, n: int, name: Callable[[int], str]) -> None:
        self._n, self._name = n, name

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self._n))]
        return self._name(int(k))


@dataclass
class Batch:
    """Pieces read, decoded and placed together.

    Attributes
    ----------
    pieces : ndarray of int
        Indices into the located pieces, in file order.
    file_id, file_offset : ndarray of int64
        Where each piece's encoded bytes are.
    src_offsets : ndarray of int64
        Each piece's offset in the staging buffer (aligned, so decoders and the place
        kernel never see a misaligned piece).
    src_sizes : ndarray of int64
        Each piece's encoded size.
    runs : ndarray, shape (r, 2), int64
        Coalesced reads: [first, last) positions in this batch of pieces whose bytes are
        adjacent in one file, fetched by one vectored read.
    staging_bytes : int
        Staging bytes this batch uses.
    home : host uint8 array or None
        Where the batch's bytes already are, at ``src_offsets`` (remote answers that landed
        in pinned memory): uploaded from there, nothing is read into staging. None: read
        into staging.
    """

    pieces: np.ndarray
    file_id: np.ndarray
    file_offset: np.ndarray
    src_offsets: np.ndarray
    src_sizes: np.ndarray
    runs: np.ndarray
    staging_bytes: int
    home: Any = None

    def one(self, k: int) -> Batch:
        """Piece ``k`` of the batch alone, at the same place in the same staging buffer."""
        return Batch(self.pieces[k:k + 1], self.file_id[k:k + 1], self.file_offset[k:k + 1],
                     self.src_offsets[k:k + 1], self.src_sizes[k:k + 1], np.array([[0, 1]], np.int64),
                     self.staging_bytes, self.home)


def make_batches(file_id: np.ndarray, offset: np.ndarray, nbytes: np.ndarray, decoded_nbytes: int,
                 batch_bytes: int, *, align: int = 16) -> list[Batch]:
    """Group present pieces into batches; pieces adjacent in one file form a run.

    A run lies contiguously in the staging buffer exactly as in the file, so it is fetched
    by ONE read call; each run starts aligned. (Pieces inside a run need no alignment of
    their own: nvCOMP reads frames at any byte offset, and raw pieces in a run are whole
    multiples of the element size apart.)

    ``file_id``, ``offset``, ``nbytes``: where each piece's encoded bytes lie (``nbytes < 0``: a
    missing piece, which no batch contains). A batch holds at most ``batch_bytes`` (its staging
    size) of encoded and of decoded bytes (``decoded_nbytes`` a piece), and at least one piece;
    each run starts ``align``-ed in staging. The batches come in file order, which is also the
    order reads are issued.
    """
    present = np.flatnonzero(nbytes >= 0)
    order = present[np.lexsort((offset[present], file_id[present]))]
    per_batch = max(1, batch_bytes // max(decoded_nbytes, 1))
    fids, offs, sizes = file_id[order].tolist(), offset[order].tolist(), nbytes[order].tolist()
    batches: list[Batch] = []
    first = 0
    src: list[int] = []
    starts: list[int] = []
    used, prev = 0, None

    def flush(last: int) -> None:
        idx = order[first:last]
        b = np.asarray(starts + [last - first], np.int64)
        batches.append(Batch(idx, file_id[idx].astype(np.int64), offset[idx].astype(np.int64),
                             np.asarray(src, np.int64), nbytes[idx].astype(np.int64),
                             np.stack([b[:-1], b[1:]], axis=1), used))

    for k, (f, o, n) in enumerate(zip(fids, offs, sizes)):
        cont = prev is not None and prev[0] == f and prev[1] + prev[2] == o
        pos = used if cont else -(-used // align) * align
        if k > first and (pos + n > batch_bytes or k - first >= per_batch):
            flush(k)
            first, src, starts, used, cont, pos = k, [], [], 0, False, 0
        if not cont:
            starts.append(k - first)
        src.append(pos)
        used = pos + n
        prev = (f, o, n)
    if first < len(order):
        flush(len(order))
    return batches
