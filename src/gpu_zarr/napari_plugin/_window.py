"""Levels as napari's multiscale slicing reads them: a tile cut out lazily, then its plane.

napari (0.5 and later) slices a multiscale level in two steps: first the visible tile, with
every axis that is not displayed taken whole (``data[:, y0:y1, x0:x1]``), as a dask array
would do lazily; then the plane (or thick slice) of that tile, materialized with
``np.asarray``. A plain :class:`~gpu_zarr.lazy.GpuLazyArray` reads on every ``[]``, so the
first step read the tile's whole stack: opening a (c, z, y, x) image over HTTP fetched every z
of the levels napari drew, and a deep stack would fetch all its planes per view. A
:class:`ViewerLevel` (a pyramid's level) or :class:`ViewerGrid` (a plate's or well's) answers
a key of step-1 slices alone with a :class:`Window`, which reads only when indexed with an
integer or materialized.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gpu_zarr.lazy import GpuLazyArray, normalize_key
from gpu_zarr.plate import TiledArray

__all__ = ["ViewerGrid", "ViewerLevel", "Window"]


def _box(key: Any, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...] | None:
    """``key`` as a box ((start, stop) per axis) when it is step-1 slices alone, else None."""
    if isinstance(key, slice) or key is Ellipsis:
        key = (key,)
    if not isinstance(key, tuple) or not all(isinstance(k, slice) or k is Ellipsis for k in key):
        return None
    try:
        sel = normalize_key(key, shape)
    except IndexError:
        return None
    if sel is None or not all(isinstance(s, slice) and s.step == 1 for s in sel):
        return None
    return tuple((s.start, max(s.start, s.stop)) for s in sel)  # type: ignore[union-attr]


class _Windowed:
    """A key of step-1 slices alone gives a lazy :class:`Window` (napari's tile); every other
    key, and ``np.asarray``, read as the array class it is mixed into."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __getitem__(self, key: Any) -> Any:
        box = _box(key, self.shape)
        read = super().__getitem__  # type: ignore[misc]
        return read(key) if box is None else Window(read, box, self.dtype)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = super().__getitem__(Ellipsis)  # type: ignore[misc]
        return out if dtype is None else out.astype(dtype, copy=False)


class ViewerLevel(_Windowed, GpuLazyArray):
    """A :class:`~gpu_zarr.lazy.GpuLazyArray` level of a pyramid, as napari slices it."""


class ViewerGrid(_Windowed, TiledArray):
    """A :class:`~gpu_zarr.plate.TiledArray` level of a plate or well grid, as napari slices it."""


class Window:
    """A box of a level, read when indexed with an integer or materialized (``np.asarray``).

    Attributes
    ----------
    shape, dtype, ndim
        As the numpy array it reads.
    """

    def __init__(self, read: Callable[[Any], np.ndarray], box: tuple[tuple[int, int], ...], dtype: Any) -> None:
        self._read = read  # the level's own read of a key (host numpy)
        self._box = box
        self._dtype = np.dtype(dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self._box)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self._box)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"Window(box={self._box}, dtype={self._dtype})"

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self._read(tuple(slice(a, b) for a, b in self._box))
        return out if dtype is None else out.astype(dtype, copy=False)

    def __getitem__(self, key: Any) -> Any:
        inner = _box(key, self.shape)
        if inner is not None:  # still a box: still lazy
            return Window(self._read, tuple((a + i0, a + i1) for (a, _), (i0, i1) in zip(self._box, inner)), self._dtype)
        sel = normalize_key(key, self.shape)
        if sel is None or any(isinstance(s, slice) and s.step < 0 for s in sel):
            return np.asarray(self)[key]  # (not what napari asks for: the box, then numpy's indexing)
        full = tuple(a + s if isinstance(s, int) else slice(a + s.start, a + max(s.start, s.stop), s.step)
                     for (a, _), s in zip(self._box, sel))
        return self._read(full)
