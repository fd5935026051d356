"""Undo Blosc's byte shuffle and bitshuffle, block by block, for a whole batch at once.

Each block is described by its offset in a source buffer (the decoded, still shuffled
streams), its offset in the destination, its size, typesize and mode
(:data:`~gpu_zarr.engine.blosc.MODE_NONE`, ``MODE_BYTE``, ``MODE_BIT``). Blocks may come in
any order and have different sizes (the last partial block of a chunk).

- byte shuffle (c-blosc ``unshuffle``): with ``n = size // typesize``, output byte
  ``i * typesize + j`` is input byte ``j * n + i``; the ``size % typesize`` trailing bytes are
  copied.
- bitshuffle (bitshuffle's ``bshuf_untrans_bit_elem`` as c-blosc 1.x calls it): the first
  ``n * typesize`` bytes are ``8 * typesize`` rows of ``n / 8`` bytes, row ``8 * j + b`` holding
  bit ``b`` of byte ``j`` of each element, least-significant bit first; trailing bytes are
  copied. ``n`` is a multiple of 8 here: c-blosc 1.x leaves other blocks unshuffled, and the
  parser marks them ``MODE_NONE``.

:func:`unshuffle_cpu` is the numpy twin (vectorised per group of equal blocks);
:func:`unshuffle_gpu` is ONE cupy kernel launch over every block of the batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["unshuffle", "unshuffle_cpu", "unshuffle_gpu"]

MODE_NONE, MODE_BYTE, MODE_BIT = 0, 1, 2


def _unshuffle_rows(x: np.ndarray, ts: int, mode: int) -> np.ndarray:
    """Unshuffle equal blocks held as the rows of ``x`` (m, size)."""
    m, size = x.shape
    if mode == MODE_NONE or ts < 1:
        return x
    n = size // ts
    out = x.copy()
    if mode == MODE_BYTE:
        if ts > 1 and n:
            out[:, :n * ts] = x[:, :n * ts].reshape(m, ts, n).transpose(0, 2, 1).reshape(m, n * ts)
        return out
    if n % 8 or n == 0:
        return out
    rows = x[:, :n * ts].reshape(m, 8 * ts, n // 8)
    bits = np.unpackbits(rows, axis=2, bitorder="little")  # (m, 8*ts, n): bits[r, i] = bit of element i
    bits = bits.reshape(m, ts, 8, n).transpose(0, 3, 1, 2)  # (m, n, ts, 8)
    out[:, :n * ts] = np.packbits(bits, axis=3, bitorder="little").reshape(m, n * ts)
    return out


def unshuffle_cpu(src: np.ndarray, b_src: np.ndarray, dst: np.ndarray, b_dst: np.ndarray, b_size: np.ndarray,
                  b_ts: np.ndarray, b_mode: np.ndarray) -> None:
    """numpy twin: unshuffle every block from ``src`` into ``dst`` (uint8 buffers).

    Blocks are grouped by (size, typesize, mode); each group is one vectorised numpy step.
    """
    if len(b_src) == 0:
        return
    key = np.stack([np.asarray(b_size, np.int64), np.asarray(b_ts, np.int64), np.asarray(b_mode, np.int64)], 1)
    groups, inv = np.unique(key, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    for gi, (size, ts, mode) in enumerate(groups.tolist()):
        sel = np.flatnonzero(inv == gi)
        # a bounded number of blocks at a time keeps the index arrays small
        step = max(1, (64 << 20) // max(1, size * 8))
        for a in range(0, len(sel), step):
            part = sel[a:a + step]
            col = np.arange(size, dtype=np.int64)
            x = src[np.asarray(b_src, np.int64)[part][:, None] + col]
            dst[np.asarray(b_dst, np.int64)[part][:, None] + col] = _unshuffle_rows(x, int(ts), int(mode))


_SOURCE = r"""
extern "C" __global__ void blosc_unshuffle(
    const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
    const long long* __restrict__ b_src, const long long* __restrict__ b_dst,
    const int* __restrict__ b_size, const int* __restrict__ b_ts, const int* __restrict__ b_mode)
{
    const long long blk = blockIdx.x;
    const unsigned char* s = src + b_src[blk];
    unsigned char* d = dst + b_dst[blk];
    const long long size = b_size[blk];
    const int ts = b_ts[blk];
    const int mode = b_mode[blk];
    const long long tid = (long long)blockIdx.y * blockDim.x + threadIdx.x;
    const long long nthreads = (long long)gridDim.y * blockDim.x;
    long long done = 0;  /* bytes handled by the mode-specific loops; the rest is copied */
    if (mode == 1 && ts > 1) {
        const long long n = size / ts;
        done = n * ts;
        if (ts == 2 && ((((unsigned long long)d) & 1) == 0)) {
            for (long long i = tid; i < n; i += nthreads) {
                unsigned short v = (unsigned short)s[i] | ((unsigned short)s[n + i] << 8);
                ((unsigned short*)d)[i] = v;
            }
        } else if (ts == 4 && ((((unsigned long long)d) & 3) == 0)) {
            for (long long i = tid; i < n; i += nthreads) {
                unsigned int v = (unsigned int)s[i] | ((unsigned int)s[n + i] << 8)
                               | ((unsigned int)s[2 * n + i] << 16) | ((unsigned int)s[3 * n + i] << 24);
                ((unsigned int*)d)[i] = v;
            }
        } else if (ts == 8 && ((((unsigned long long)d) & 7) == 0)) {
            for (long long i = tid; i < n; i += nthreads) {
                unsigned long long v = 0;
                #pragma unroll
                for (int j = 0; j < 8; j++) v |= (unsigned long long)s[j * n + i] << (8 * j);
                ((unsigned long long*)d)[i] = v;
            }
        } else {
            for (long long i = tid; i < n; i += nthreads) {
                for (int j = 0; j < ts; j++) d[i * ts + j] = s[j * n + i];
            }
        }
    } else if (mode == 2) {
        const long long n = size / ts;
        const long long n8 = n / 8;
        done = n * ts;
        const long long work = n8 * ts;
        for (long long t = tid; t < work; t += nthreads) {
            const long long g = t % n8;   /* group of 8 elements */
            const long long j = t / n8;   /* byte within the element */
            unsigned long long x = 0;
            #pragma unroll
            for (int b = 0; b < 8; b++) x |= (unsigned long long)s[(j * 8 + b) * n8 + g] << (8 * b);
            /* 8x8 bit transpose: bit k of byte b -> bit b of byte k */
            unsigned long long q;
            q = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAULL;  x = x ^ q ^ (q << 7);
            q = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCULL; x = x ^ q ^ (q << 14);
            q = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ULL; x = x ^ q ^ (q << 28);
            unsigned char* o = d + g * 8 * ts + j;
            #pragma unroll
            for (int k = 0; k < 8; k++) o[k * ts] = (unsigned char)(x >> (8 * k));
        }
    }
    for (long long i = done + tid; i < size; i += nthreads) d[i] = s[i];
}
"""

_THREADS = 256


def _kernel(cupy: Any) -> Any:
    """The compiled kernel, cached by the engine's runtime when it exists (else per process)."""
    try:
        from gpu_zarr.engine.runtime import get_runtime
    except ImportError:  # before the runtime lands
        get_runtime = None
    key = ("blosc_unshuffle_kernel", cupy.cuda.runtime.getDevice())
    if get_runtime is not None:
        return get_runtime().resource(key, lambda: cupy.RawKernel(_SOURCE, "blosc_unshuffle"))
    cache = _kernel.__dict__.setdefault("cache", {})
    if key not in cache:
        cache[key] = cupy.RawKernel(_SOURCE, "blosc_unshuffle")
    return cache[key]


def unshuffle_gpu(src: Any, b_src: np.ndarray, dst: Any, b_dst: np.ndarray, b_size: np.ndarray, b_ts: np.ndarray,
                  b_mode: np.ndarray, stream: Any) -> None:
    """Unshuffle every block from device buffer ``src`` into ``dst`` in ONE kernel launch on ``stream``.

    Notes
    -----
    Grid: x = block, y = tiles of 256 threads striding over the block's work; the block
    tables go to the device with one small copy each on the same stream.
    """
    import cupy

    nb = len(b_src)
    if nb == 0:
        return
    sizes = np.asarray(b_size, np.int64)
    tiles = int(min(65535, max(1, -(-int(sizes.max()) // (_THREADS * 16)))))  # ~16 bytes per thread
    table = np.concatenate([np.asarray(b_src, np.int64), np.asarray(b_dst, np.int64)])
    small = np.concatenate([np.asarray(b_size, np.int32), np.asarray(b_ts, np.int32),
                            np.asarray(b_mode, np.int32)])
    with stream:
        d_table = cupy.asarray(table)
        d_small = cupy.asarray(small)
        _kernel(cupy)((nb, tiles), (_THREADS,),
                      (src, dst, d_table[:nb], d_table[nb:], d_small[:nb], d_small[nb:2 * nb], d_small[2 * nb:]))


def unshuffle(ops: Any, src: Any, b_src: np.ndarray, dst: Any, b_dst: np.ndarray, b_size: np.ndarray,
              b_ts: np.ndarray, b_mode: np.ndarray) -> None:
    """Dispatch on ``ops.name``: the GPU kernel on ``ops.stream`` or the numpy twin."""
    if ops.name == "gpu":
        unshuffle_gpu(src, b_src, dst, b_dst, b_size, b_ts, b_mode, ops.stream)
    else:
        unshuffle_cpu(src, b_src, dst, b_dst, b_size, b_ts, b_mode)
