"""Stage 4, place: scatter decoded chunks into the preallocated output.

One kernel launch places a whole batch (every piece, every row) using the placement
table from :mod:`gpu_zarr.engine.plan`; it also swaps bytes for big-endian data, since
cupy has no big-endian arrays. :func:`place_cpu` is its numpy twin, reading the same table.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = ["place_cpu", "place_geometry", "place_gpu", "unit_layout"]

_KERNEL = r"""
__device__ __forceinline__ unsigned char bswap_(unsigned char v) { return v; }
__device__ __forceinline__ unsigned short bswap_(unsigned short v) { return (unsigned short)((v >> 8) | (v << 8)); }
__device__ __forceinline__ unsigned int bswap_(unsigned int v) { return __byte_perm(v, 0, 0x0123); }
__device__ __forceinline__ unsigned long long bswap_(unsigned long long v) {
    unsigned int lo = (unsigned int)v, hi = (unsigned int)(v >> 32);
    return ((unsigned long long)__byte_perm(lo, 0, 0x0123) << 32) | __byte_perm(hi, 0, 0x0123);
}

template <typename T>
__device__ void place_body(const unsigned char* __restrict__ src, T* __restrict__ dst,
                           const long long* __restrict__ tab, const long long* __restrict__ src_off,
                           const long long* __restrict__ ostride, int ndim, int swap, int piece0)
{
    const int piece = piece0 + blockIdx.y;
    const long long* t = tab + (long long)piece * ndim * 4;
    const int L = ndim - 1;
    const long long last_len = t[L * 4 + 2];
    long long rows = 1;
    for (int d = 0; d < L; ++d) rows *= t[d * 4 + 2];
    const T* s = (const T*)(src + src_off[piece]);
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        long long rem = r, soff = t[L * 4 + 1], doff = t[L * 4 + 3] * ostride[L];
        long long sstride = t[L * 4 + 0];
        for (int d = L - 1; d >= 0; --d) {
            const long long len = t[d * 4 + 2];
            const long long c = rem % len;
            rem /= len;
            soff += (t[d * 4 + 1] + c) * sstride;
            sstride *= t[d * 4 + 0];
            doff += (t[d * 4 + 3] + c) * ostride[d];
        }
        const long long os = ostride[L];
        for (long long i = threadIdx.x; i < last_len; i += blockDim.x) {
            T v = s[soff + i];
            if (swap) v = bswap_(v);
            dst[doff + i * os] = v;
        }
    }
}

#define PLACE(NAME, T) \
extern "C" __global__ void NAME(const unsigned char* src, T* dst, const long long* tab, \
    const long long* src_off, const long long* ostride, int ndim, int swap, int piece0) \
{ place_body<T>(src, dst, tab, src_off, ostride, ndim, swap, piece0); }

PLACE(place_1, unsigned char)
PLACE(place_2, unsigned short)
PLACE(place_4, unsigned int)
PLACE(place_8, unsigned long long)
"""


@functools.lru_cache(maxsize=1)
def _module():
    import cupy

    return cupy.RawModule(code=_KERNEL, options=("-std=c++14",))


def unit_layout(dtype: np.dtype) -> tuple[int, int]:
    """(unit bytes, units per element): complex numbers are two units, swapped separately."""
    if dtype.kind == "c":
        return dtype.itemsize // 2, 2
    return dtype.itemsize, 1


def _with_units(table: np.ndarray, out_shape: tuple[int, ...], per: int):
    """Append a unit dimension for multi-unit elements; return table and output strides."""
    if per > 1:
        extra = np.zeros(table.shape[:1] + (1, 4), np.int64)
        extra[:, 0, 0] = per
        extra[:, 0, 2] = per
        table = np.concatenate([table, extra], axis=1)
        out_shape = tuple(out_shape) + (per,)
    strides = np.ones(len(out_shape), np.int64)
    for d in range(len(out_shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * out_shape[d + 1]
    return np.ascontiguousarray(table), strides


def _permuted(tab: np.ndarray, strides: np.ndarray, perm: tuple[int, ...] | None) -> tuple[np.ndarray, np.ndarray]:
    """Table and output strides in the order the chunk's elements are stored.

    A chunk stored as ``chunk.transpose(perm)`` in C order is walked along its stored axes:
    stored axis j is array axis ``perm[j]`` (a trailing unit axis of complex numbers stays last).
    """
    if perm is None:
        return tab, strides
    idx = list(perm) + list(range(len(perm), tab.shape[1]))
    return np.ascontiguousarray(tab[:, idx, :]), np.ascontiguousarray(strides[idx])


def place_geometry(table: np.ndarray, out_shape: tuple[int, ...], disk_dtype: np.dtype,
                   perm: tuple[int, ...] | None) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(table, output strides, unit bytes, swap) as the place kernels walk them: in units (a
    complex number is two), along the chunk's stored axes, strides in units of the output."""
    unit, per = unit_layout(disk_dtype)
    swap = int(unit > 1 and (disk_dtype.byteorder == ">" or (disk_dtype.byteorder == "=" and not np.little_endian)))
    tab, strides = _with_units(np.asarray(table, np.int64), out_shape, per)
    tab, strides = _permuted(tab, strides, perm)
    return np.ascontiguousarray(tab, np.int64), np.ascontiguousarray(strides, np.int64), unit, swap


def place_gpu(src: Any, src_offsets: np.ndarray, table: np.ndarray, out: Any, disk_dtype: np.dtype,
              stream: Any = None, perm: tuple[int, ...] | None = None) -> None:
    """Scatter the decoded pieces of ``src`` (device uint8; piece k at byte ``src_offsets[k]``,
    aligned to the unit; None: ``src_offsets`` are device addresses, pieces in separate buffers
    such as the cache's) into ``out`` (a C-contiguous cupy box, native byte order) with the
    placement ``table`` (see :class:`gpu_zarr.engine.plan.Pieces`). Pieces of a big-endian
    ``disk_dtype`` are swapped while placing; ``perm``: the chunks are stored transposed
    (``Layout.transpose``).
    """
    import cupy

    n = len(src_offsets)
    if n == 0:
        return
    unit, per = unit_layout(disk_dtype)
    swap = int(disk_dtype.byteorder == ">" or (disk_dtype.byteorder == "=" and np.little_endian is False))
    swap = swap if unit > 1 else 0
    tab, strides = _with_units(table, out.shape, per)
    tab, strides = _permuted(tab, strides, perm)
    ndim = tab.shape[1]
    kern = _module().get_function(f"place_{unit}")
    rows = np.prod(tab[:, :-1, 2], axis=1) if ndim > 1 else np.ones(n, np.int64)
    grid_x = int(min(max(int(rows.max()), 1), 4096))
    block = 256 if int(tab[:, -1, 2].max()) >= 256 else 64
    view = out.view(np.dtype(f"u{unit}")) if out.size else out
    # the tables are allocated and copied on the launch stream: stream-ordered with the kernel,
    # and their memory goes back to that stream's pool only after it
    with (stream if stream is not None else cupy.cuda.get_current_stream()):
        tab_d = cupy.asarray(tab)
        off_d = cupy.asarray(np.asarray(src_offsets, np.int64))
        str_d = cupy.asarray(strides)
        for p0 in range(0, n, 65535):
            cnt = min(65535, n - p0)
            kern((grid_x, cnt), (block,), (np.uint64(0) if src is None else src, view, tab_d, off_d, str_d, np.int32(ndim),
                                           np.int32(swap), np.int32(p0)))


def place_cpu(src: np.ndarray, src_offsets: np.ndarray, table: np.ndarray, out: np.ndarray,
              disk_dtype: np.dtype, perm: tuple[int, ...] | None = None) -> None:
    """numpy twin of :func:`place_gpu` (same table, one slice assignment per piece)."""
    inner = None
    for k in range(len(src_offsets)):
        t = table[k]
        if inner is None:
            inner = tuple(int(v) for v in t[:, 0])
            nbytes = int(np.prod(inner)) * disk_dtype.itemsize
        off = int(src_offsets[k])
        if perm is None:
            chunk = src[off:off + nbytes].view(disk_dtype).reshape(inner)
        else:
            stored = tuple(inner[a] for a in perm)
            chunk = src[off:off + nbytes].view(disk_dtype).reshape(stored).transpose(np.argsort(perm))
        sin = tuple(slice(int(a), int(a + n)) for a, n in zip(t[:, 1], t[:, 2]))
        sout = tuple(slice(int(a), int(a + n)) for a, n in zip(t[:, 3], t[:, 2]))
        out[sout] = chunk[sin]
