"""The device calls of the engine, for the GPU (cupy, nvCOMP) and for its CPU twin (numpy).

The pipeline is written once against this small interface; only these calls differ
between the GPU path and the CPU twin that CI runs.
"""

from __future__ import annotations

import threading

import numpy as np

from gpu_zarr.engine.decode import decode_zstd_cpu, decode_zstd_gpu
from gpu_zarr.engine.place import place_cpu, place_gpu
from gpu_zarr.errors import INSTALL_HINT, GPUUnavailable

__all__ = ["CpuOps", "GpuOps", "ops_for"]


class CpuOps:
    """numpy buffers, numcodecs decode, numpy placement."""

    name = "cpu"
    xp = np
    overlap = False

    def empty(self, shape, dtype):
        return np.empty(shape, dtype)

    def host_buffer(self, nbytes: int, slot: int = 0) -> np.ndarray:
        return np.empty(nbytes, np.uint8)

    def device_buffer(self, nbytes: int, slot: int = 0) -> np.ndarray:
        return np.empty(nbytes, np.uint8)

    def upload(self, host: np.ndarray, dev: np.ndarray, nbytes: int, slot: int = 0):
        dev[:nbytes] = host[:nbytes]
        return None

    def wait(self, event) -> None:
        pass

    def record(self, slot: int = 0):
        return None

    def decode_zstd(self, src, src_offsets, src_sizes, dst, dst_offsets, dst_size, names, slot: int = 0) -> None:
        decode_zstd_cpu(src, src_offsets, src_sizes, dst, dst_offsets, dst_size, names)

    def place(self, src, src_offsets, table, out, disk_dtype, slot: int = 0) -> None:
        place_cpu(src, src_offsets, table, out, disk_dtype)

    def fill(self, out, table, value) -> None:
        for t in table:
            out[tuple(slice(int(a), int(a + n)) for a, n in zip(t[:, 3], t[:, 2]))] = value

    def sync(self) -> None:
        pass

    def free_bytes(self) -> int | None:
        return None

    def finish(self, out, post):
        return np.ascontiguousarray(out[post]) if post is not None else out


_STREAMS: list = []
_PINNED: dict = {}


def _streams(n: int) -> list:
    """Process-wide, long-lived non-blocking streams (each gets one long-lived nvCOMP codec)."""
    import cupy

    while len(_STREAMS) < n:
        _STREAMS.append(cupy.cuda.Stream(non_blocking=True))
    return _STREAMS[:n]


class GpuOps:
    """cupy device buffers, pinned host staging, nvCOMP decode; one CUDA stream per slot.

    Slot k's copy, decode and placement are ordered on stream k, so the work of different
    batches overlaps on the GPU while later batches are still being read.
    """

    name = "gpu"
    overlap = True

    def __init__(self, slots: int = 3):
        try:
            import cupy
        except ImportError as exc:
            raise GPUUnavailable(f"the GPU path needs cupy, which is not installed: {INSTALL_HINT}") from exc
        try:
            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise GPUUnavailable("cupy found no CUDA device; use backend 'cpu' on this machine")
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            raise GPUUnavailable(f"cupy cannot reach a CUDA device ({exc}); check the NVIDIA driver "
                                 "(nvidia-smi) or use backend 'cpu'") from exc
        self.xp = cupy
        self._cupy = cupy
        self.streams = _streams(max(1, slots))
        self.stream = self.streams[0]
        self._pinned = []

    def _s(self, slot: int):
        return self.streams[slot % len(self.streams)]

    def empty(self, shape, dtype):
        with self.stream:
            out = self._cupy.empty(shape, dtype)
        self.stream.synchronize()  # other streams write into it
        return out

    def host_buffer(self, nbytes: int, slot: int = 0) -> np.ndarray:
        """Pinned staging for ``slot``, kept between reads (pinning memory is slow: ~0.5 s/GiB)."""
        key = (threading.get_ident(), slot)  # concurrent reads never share staging
        cur = _PINNED.get(key)
        if cur is None or cur.nbytes < nbytes:
            _PINNED.pop(key, None)
            mem = self._cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
            cur = _PINNED[key] = np.frombuffer(mem, np.uint8, max(nbytes, 1))
        return cur[:nbytes]

    def device_buffer(self, nbytes: int, slot: int = 0):
        with self._s(slot):
            return self._cupy.empty(max(nbytes, 1), np.uint8)

    def upload(self, host: np.ndarray, dev, nbytes: int, slot: int = 0):
        s = self._s(slot)
        if nbytes:
            dev[:nbytes].set(host[:nbytes], stream=s)
        return s.record()

    def wait(self, event) -> None:
        if event is not None:
            event.synchronize()

    def record(self, slot: int = 0):
        """An event after the work queued so far on the slot's stream."""
        return self._s(slot).record()

    def decode_zstd(self, src, src_offsets, src_sizes, dst, dst_offsets, dst_size, names, slot: int = 0) -> None:
        decode_zstd_gpu(src, src_offsets, src_sizes, dst, dst_offsets, dst_size, self._s(slot), names)

    def place(self, src, src_offsets, table, out, disk_dtype, slot: int = 0) -> None:
        place_gpu(src, src_offsets, table, out, disk_dtype, self._s(slot))

    def fill(self, out, table, value) -> None:
        with self.stream:
            for t in table:
                out[tuple(slice(int(a), int(a + n)) for a, n in zip(t[:, 3], t[:, 2]))] = value

    def sync(self) -> None:
        for s in self.streams:
            s.synchronize()

    def free_bytes(self) -> int:
        free, _ = self._cupy.cuda.runtime.memGetInfo()
        return int(free) + int(self._cupy.get_default_memory_pool().free_bytes())

    def finish(self, out, post):
        if post is None:
            return out
        self.sync()
        with self.stream:
            res = self._cupy.ascontiguousarray(out[post])
        self.stream.synchronize()
        return res


def ops_for(device: str, slots: int = 3):
    """``"gpu"`` or ``"cpu"``."""
    if device == "gpu":
        return GpuOps(slots)
    if device == "cpu":
        return CpuOps()
    raise ValueError(f"device must be 'gpu' or 'cpu', not {device!r}")
