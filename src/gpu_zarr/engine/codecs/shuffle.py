"""Undo Blosc's byte shuffle and bitshuffle, block by block, for a whole batch at once.

A block's shuffled bytes live in ``nsplit`` streams (1, or typesize when c-blosc split the
block): stream ``i`` holds bytes ``[i * ne, (i + 1) * ne)`` with ``ne = size / nsplit`` and
starts at address ``s_addr[b_first + i]`` -- in the decoded-streams buffer, or, for a stream
stored raw, right where it lies in the fetched chunk (no copy pass). Blocks may come in any
order and have different sizes (the last partial block of a chunk).

- byte shuffle (c-blosc ``unshuffle``): with ``n = size // typesize``, output byte
  ``i * typesize + j`` is shuffled byte ``j * n + i``; the ``size % typesize`` trailing bytes
  are copied.
- bitshuffle (bitshuffle's ``bshuf_untrans_bit_elem`` as c-blosc 1.x calls it): the first
  ``n * typesize`` bytes are ``8 * typesize`` rows of ``n / 8`` bytes, row ``8 * j + b`` holding
  bit ``b`` of byte ``j`` of each element, least-significant bit first; trailing bytes are
  copied. ``n`` is a multiple of 8 here: c-blosc 1.x leaves other blocks unshuffled, and the
  parser marks them ``MODE_NONE``.

:func:`unshuffle_cpu` is the numpy twin (addresses into one host buffer, vectorised per group
of equal blocks); :func:`unshuffle_gpu` is ONE cupy kernel launch over every block of the batch
(device addresses).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["unshuffle_cpu", "unshuffle_gpu"]

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


def unshuffle_cpu(space: np.ndarray, s_addr: np.ndarray, b_first: np.ndarray, b_nsplit: np.ndarray,
                  b_size: np.ndarray, b_ts: np.ndarray, b_mode: np.ndarray, dst: np.ndarray, b_dst: np.ndarray) -> None:
    """numpy twin: unshuffle every block into ``dst`` (uint8), its streams read from ``space``.

    ``s_addr`` are offsets into ``space``. Blocks are grouped by (size, typesize, mode,
    nsplit); each group is gathered (the kernel's addressing: stream ``k // ne``, offset
    ``k % ne``) and unshuffled in one vectorised numpy step.
    """
    if len(b_first) == 0:
        return
    key = np.stack([np.asarray(a, np.int64) for a in (b_size, b_ts, b_mode, b_nsplit)], 1)
    groups, inv = np.unique(key, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    s_addr = np.asarray(s_addr, np.int64)
    first = np.asarray(b_first, np.int64)
    bdst = np.asarray(b_dst, np.int64)
    for gi, (size, ts, mode, nsplit) in enumerate(groups.tolist()):
        sel = np.flatnonzero(inv == gi)
        k = np.arange(size, dtype=np.int64)
        ne = size // nsplit
        stream, off = k // ne, k % ne
        step = max(1, (64 << 20) // max(1, size * 8))  # bounded index arrays
        for a in range(0, len(sel), step):
            part = sel[a:a + step]
            x = space[s_addr[first[part][:, None] + stream] + off]
            dst[bdst[part][:, None] + k] = _unshuffle_rows(x, int(ts), int(mode))


_SOURCE = r"""
extern "C" __global__ void blosc_unshuffle(
    unsigned char* __restrict__ dst, const long long* __restrict__ b_dst,
    const long long* __restrict__ b_first, const unsigned long long* __restrict__ s_addr,
    const long long* __restrict__ b_size, const long long* __restrict__ b_ts,
    const long long* __restrict__ b_mode, const long long* __restrict__ b_nsplit)
{
    __shared__ const unsigned char* sp[16];
    const long long blk = blockIdx.x;
    const int nsplit = (int)b_nsplit[blk];
    if (threadIdx.x < nsplit && threadIdx.x < 16)
        sp[threadIdx.x] = (const unsigned char*)s_addr[b_first[blk] + threadIdx.x];
    __syncthreads();
    unsigned char* d = dst + b_dst[blk];
    const long long size = b_size[blk];
    const int ts = (int)b_ts[blk];
    const int mode = (int)b_mode[blk];
    const bool split = nsplit > 1;        /* then nsplit == ts and size % ts == 0 */
    const unsigned char* s0 = sp[0];
    const long long ne = size / nsplit;
    const long long tid = (long long)blockIdx.y * blockDim.x + threadIdx.x;
    const long long nthreads = (long long)gridDim.y * blockDim.x;
    long long done = 0;  /* bytes handled by the mode-specific loops; the rest is copied */
    if (mode == 1 && ts > 1) {
        const long long n = size / ts;
        done = n * ts;
        /* plane j (byte j of every element) starts at shuffled byte j * n */
        #define PLANE(j) (split ? sp[(j)] : s0 + (long long)(j) * n)
        if (ts == 2 && ((((unsigned long long)d) & 1) == 0)) {
            const unsigned char *p0 = PLANE(0), *p1 = PLANE(1);
            for (long long i = tid; i < n; i += nthreads)
                ((unsigned short*)d)[i] = (unsigned short)p0[i] | ((unsigned short)p1[i] << 8);
        } else if (ts == 4 && ((((unsigned long long)d) & 3) == 0)) {
            const unsigned char *p0 = PLANE(0), *p1 = PLANE(1), *p2 = PLANE(2), *p3 = PLANE(3);
            for (long long i = tid; i < n; i += nthreads)
                ((unsigned int*)d)[i] = (unsigned int)p0[i] | ((unsigned int)p1[i] << 8)
                                      | ((unsigned int)p2[i] << 16) | ((unsigned int)p3[i] << 24);
        } else if (ts == 8 && ((((unsigned long long)d) & 7) == 0)) {
            const unsigned char* p[8];
            #pragma unroll
            for (int j = 0; j < 8; j++) p[j] = PLANE(j);
            for (long long i = tid; i < n; i += nthreads) {
                unsigned long long v = 0;
                #pragma unroll
                for (int j = 0; j < 8; j++) v |= (unsigned long long)p[j][i] << (8 * j);
                ((unsigned long long*)d)[i] = v;
            }
        } else {
            for (long long i = tid; i < n; i += nthreads)
                for (int j = 0; j < ts; j++) d[i * ts + j] = PLANE(j)[i];
        }
        #undef PLANE
    } else if (mode == 2) {
        const long long n = size / ts;
        const long long n8 = n / 8;
        done = n * ts;
        const long long work = n8 * ts;
        for (long long t = tid; t < work; t += nthreads) {
            const long long g = t % n8;   /* group of 8 elements */
            const long long j = t / n8;   /* byte within the element: rows 8j .. 8j+7 */
            const unsigned char* rows = split ? sp[j] : s0 + j * 8 * n8;
            unsigned long long x = 0;
            #pragma unroll
            for (int b = 0; b < 8; b++) x |= (unsigned long long)rows[b * n8 + g] << (8 * b);
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
    if (split) {
        for (long long i = done + tid; i < size; i += nthreads) d[i] = sp[i / ne][i % ne];
    } else {
        for (long long i = done + tid; i < size; i += nthreads) d[i] = s0[i];
    }
}
"""

_THREADS = 256


def _kernel(cupy: Any, runtime: Any) -> Any:
    """The compiled kernel, kept by the engine's runtime (compiled once per device)."""
    key = ("kernel", "blosc_unshuffle", cupy.cuda.runtime.getDevice())
    return runtime.resource(key, lambda: cupy.RawKernel(_SOURCE, "blosc_unshuffle"))


@dataclass
class _RingSlot:
    lock: Any
    buf: np.ndarray | None = None
    event: Any = None


class _TableRing:
    """Pinned host buffers for the per-batch block tables, so that their upload is asynchronous
    (a copy from pageable memory would wait for everything queued on the stream).

    A buffer is refilled only after the event recorded behind its previous copy has passed.
    """

    def __init__(self, size: int = 8) -> None:
        import threading

        self._lock = threading.Lock()
        self._next = 0
        self._slots = [_RingSlot(threading.Lock()) for _ in range(size)]

    def nbytes(self) -> int:
        """Pinned bytes held."""
        return sum(s.buf.nbytes for s in self._slots if s.buf is not None)

    def upload(self, table: np.ndarray, stream: Any) -> Any:
        """A device copy of the int64 ``table``, ordered on ``stream``."""
        import cupy

        from gpu_zarr.engine.runtime import Runtime

        with self._lock:
            slot = self._slots[self._next]
            self._next = (self._next + 1) % len(self._slots)
        nbytes = int(table.nbytes)
        with slot.lock:
            if slot.event is not None:
                slot.event.synchronize()  # the copy that last read this buffer is done
            if slot.buf is None or slot.buf.nbytes < nbytes:
                slot.buf = Runtime.pinned_alloc(max(nbytes, 1 << 16))
            host = slot.buf[:nbytes]
            host[:] = table.view(np.uint8)
            with stream:
                dev = cupy.empty(nbytes, np.uint8)
            dev.set(host, stream=stream)
            slot.event = stream.record()
        return dev.view(np.int64)


def _ring(cupy: Any, runtime: Any) -> _TableRing:
    return runtime.resource(("blosc_table_ring", cupy.cuda.runtime.getDevice()), _TableRing,
                            nbytes=lambda ring: ring.nbytes())


def unshuffle_gpu(s_addr: np.ndarray, b_first: np.ndarray, b_nsplit: np.ndarray, b_size: np.ndarray,
                  b_ts: np.ndarray, b_mode: np.ndarray, dst: Any, b_dst: np.ndarray, stream: Any, *,
                  runtime: Any) -> None:
    """Unshuffle every block into device buffer ``dst`` in ONE kernel launch on ``stream``.

    ``runtime`` keeps the kernel and the pinned table ring (default: the process's).

    ``s_addr`` are device addresses (uint64) of the streams.

    Notes
    -----
    Grid: x = block, y = tiles of 256 threads striding over the block's work. The tables go
    to the device in one asynchronous copy from pinned memory on the same stream.
    """
    import cupy

    nb = len(b_first)
    if nb == 0:
        return
    tiles = int(min(65535, max(1, -(-int(np.max(b_size)) // (_THREADS * 16)))))  # ~16 bytes per thread
    ns = len(s_addr)
    table = np.concatenate([np.asarray(b_dst, np.int64), np.asarray(b_first, np.int64),
                            np.asarray(b_size, np.int64), np.asarray(b_ts, np.int64),
                            np.asarray(b_mode, np.int64), np.asarray(b_nsplit, np.int64),
                            np.asarray(s_addr, np.uint64).view(np.int64)])
    d = _ring(cupy, runtime).upload(table, stream)
    with stream:
        _kernel(cupy, runtime)((nb, tiles), (_THREADS,),
                      (dst, d[:nb], d[nb:2 * nb], d[6 * nb:6 * nb + ns], d[2 * nb:3 * nb], d[3 * nb:4 * nb],
                       d[4 * nb:5 * nb], d[5 * nb:6 * nb]))
