"""Downsampling by 2 along chosen axes, the same code on numpy (CPU) and cupy (GPU).

Exact definitions (``n`` the input's length along a downsampled axis, output length
``ceil(n / 2)``; ``k = 2**len(axes)`` inputs per output):

- ``mean`` (images): output element ``i`` is the mean of the input elements
  ``2i .. min(2i + 2, n) - 1`` along each downsampled axis, i.e. of the elements that exist
  (for an odd ``n`` the last output is the mean of the last row alone). Computed by padding
  each odd axis with a copy of its last element (which leaves every block's mean equal to the
  mean of its existing elements) and averaging ``k`` values. Integers: the exact sum (int32
  or int64), then ``floor(mean + 1/2)`` (ties round up), in the input dtype (int64/uint64
  inputs go through float64). Floats: the mean in float64 (the ``k`` values summed in C
  order of their offsets), cast back; complex: likewise in complex128. bool: as ``mode``.
- ``mode`` (labels): the most frequent of the existing elements of the block; a tie goes to
  the value that comes first in the block's C order.
- ``nearest`` (labels): the block's first element, ``input[2i]`` (stride-2 sampling).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpu_zarr.errors import UsageError

__all__ = ["METHODS", "downsample", "level_shapes"]

METHODS = ("mean", "mode", "nearest")


def _xp(a: Any) -> Any:
    if hasattr(a, "__cuda_array_interface__"):
        import cupy

        return cupy
    return np


def level_shapes(shape: Sequence[int], axes: Sequence[int], levels: int) -> list[tuple[int, ...]]:
    """The shape of each of ``levels`` levels (level 0 first)."""
    out = [tuple(int(s) for s in shape)]
    for _ in range(1, levels):
        prev = out[-1]
        out.append(tuple(-(-s // 2) if ax in axes else s for ax, s in enumerate(prev)))
    return out


def _blocks(a: Any, axes: Sequence[int], xp: Any) -> tuple[Any, tuple[int, ...]]:
    """``a`` padded (edge copy) to even lengths along ``axes`` and reshaped so that each
    output element's block lies along the last axis (length ``2**len(axes)``)."""
    pad = [(0, a.shape[ax] % 2 if ax in axes else 0) for ax in range(a.ndim)]
    if any(p[1] for p in pad):
        a = xp.pad(a, pad, mode="edge")
    split: list[int] = []
    outer: list[int] = []
    inner: list[int] = []
    for ax, s in enumerate(a.shape):
        if ax in axes:
            outer.append(len(split))
            inner.append(len(split) + 1)
            split += [s // 2, 2]
        else:
            outer.append(len(split))
            split.append(s)
    b = a.reshape(split).transpose(outer + inner)
    out_shape = tuple(b.shape[: len(outer)])
    return b.reshape(*out_shape, -1), out_shape


def _mode(b: Any, xp: Any) -> Any:
    counts = (b[..., :, None] == b[..., None, :]).sum(-1)
    first = xp.argmax(counts, axis=-1)  # first position of a most frequent value
    return xp.take_along_axis(b, first[..., None], axis=-1)[..., 0]


def downsample(a: Any, axes: Sequence[int], method: str = "mean") -> Any:
    """``a`` halved along ``axes`` by ``method`` (see the module docstring for the definitions).

    Works on numpy and cupy arrays alike; the result is of the same kind and dtype.
    """
    if method not in METHODS:
        raise UsageError(f"downsample={method!r}: expected one of {', '.join(METHODS)}")
    xp = _xp(a)
    axes = tuple(int(ax) for ax in axes)
    if not axes:
        return a
    if method == "nearest":
        return a[tuple(slice(None, None, 2) if ax in axes else slice(None) for ax in range(a.ndim))].copy()
    if a.ndim and a.shape[0] > 2 and a.nbytes > _SLAB_BYTES:
        return _by_slabs(a, axes, method, xp)
    return _reduce(a, axes, method, xp)


#: input bytes halved at once: a level's temporaries (the blocks' copy, int64 sums: about 3x
#: the input) are a slab's, not the whole level's, so memory stays bounded whatever the image
_SLAB_BYTES = 64 << 20


def _by_slabs(a: Any, axes: tuple[int, ...], method: str, xp: Any) -> Any:
    """:func:`downsample` slab by slab along axis 0 (whole pairs when axis 0 is halved: only the
    last slab can be odd, and its edge copy is the array's)."""
    step = max(1, _SLAB_BYTES // max(1, a.nbytes // a.shape[0]))
    halved = 0 in axes
    step += step % 2 if halved else 0
    out_shape = tuple(-(-s // 2) if ax in axes else s for ax, s in enumerate(a.shape))
    out = xp.empty(out_shape, a.dtype)
    for i in range(0, a.shape[0], step):
        o = i // 2 if halved else i
        part = _reduce(a[i:i + step], axes, method, xp)
        out[o:o + part.shape[0]] = part
    return out


def _reduce(a: Any, axes: tuple[int, ...], method: str, xp: Any) -> Any:
    """``mean`` or ``mode`` of ``a`` halved along ``axes`` (the definitions above), all at once."""
    dtype = np.dtype(a.dtype)
    if method == "mode" or dtype == np.bool_:
        b, _ = _blocks(a, axes, xp)
        return xp.ascontiguousarray(_mode(b, xp))
    return _mean(a, axes, dtype, xp)


def _mean(a: Any, axes: tuple[int, ...], dtype: np.dtype, xp: Any) -> Any:
    """The ``mean`` of the module docstring as the sum of the ``k`` strided views of ``a`` (one
    pass each, no copy of ``a`` into blocks): integers of up to 4 bytes summed exactly in int32
    (2-byte and smaller: the sum of at most 8 fits) or int64, then ``(sum + k // 2) >> log2(k)``
    (floor division by ``k``, ties up); complex in complex128 (float64 would drop the imaginary
    part); others in float64."""
    pad = [(0, a.shape[ax] % 2 if ax in axes else 0) for ax in range(a.ndim)]
    if any(p[1] for p in pad):
        a = xp.pad(a, pad, mode="edge")
    exact = dtype.kind in "iu" and dtype.itemsize <= 4
    acc = (np.int32 if dtype.itemsize <= 2 and len(axes) <= 3 else np.int64) if exact else (
        np.complex128 if dtype.kind == "c" else np.float64)
    views = [a[tuple(slice(offsets[axes.index(ax)], None, 2) if ax in axes else slice(None) for ax in range(a.ndim))]
             for offsets in itertools.product((0, 1), repeat=len(axes))]
    total: Any = views[0].astype(acc)
    for view in views[1:]:
        xp.add(total, view, out=total)
    k = 1 << len(axes)
    if exact:
        return ((total + k // 2) >> len(axes)).astype(dtype)
    mean = total / k
    if dtype.kind in "iu":
        return xp.floor(mean + 0.5).astype(dtype)
    return mean.astype(dtype)
