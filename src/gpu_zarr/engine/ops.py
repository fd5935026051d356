"""The device calls of the engine, for the GPU (cupy, nvCOMP) and for its CPU twin (numpy).

The pipeline is written once against this small interface; only these calls differ
between the GPU path and the CPU twin that CI runs.
"""

from __future__ import annotations

import threading

import numpy as np

from gpu_zarr.engine.decode import decode_batch_cpu, decode_batch_gpu, decode_zstd_cpu, decode_zstd_gpu
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

    def upload(self, host: np.ndarray, dev: np.ndarray, nbytes: int, slot: int = 0, after=None):
        dev[:nbytes] = host[:nbytes]
        return None

    def wait(self, event) -> None:
        pass

    def record(self, slot: int = 0):
        return None

    def decode_zstd(self, src, src_offsets, src_sizes, dst, dst_offsets, dst_size, names, slot: int = 0,
                    wait=None) -> None:
        decode_zstd_cpu(src, src_offsets, src_sizes, dst, dst_offsets, dst_size, names)

    def decode_batch(self, algo, src, src_offsets, src_sizes, dst, dst_offsets, dst_sizes, names, slot: int = 0,
                     wait=None) -> None:
        decode_batch_cpu(algo, src, src_offsets, src_sizes, dst, dst_offsets, dst_sizes, names)

    def place(self, src, src_offsets, table, out, disk_dtype, slot: int = 0, wait=None) -> None:
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
    """Process-wide, long-lived non-blocking streams: n copy streams, then the work stream."""
    import cupy

    while len(_STREAMS) < n + 1:
        _STREAMS.append(cupy.cuda.Stream(non_blocking=True))
    return _STREAMS[1:n + 1], _STREAMS[0]


class GpuOps:
    """cupy device buffers, pinned host staging, nvCOMP decode.

    Each slot copies on its own stream; decoding and placing happen in order on ONE work
    stream with one long-lived nvCOMP codec, so nvCOMP's scratch (about 3x the decoded
    bytes of a batch) exists once, and one decoded buffer serves every batch. CUDA events
    order a slot's copy before its decode, and the decode before the slot is refilled.
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
        self.copy_streams, self.stream = _streams(max(1, slots))

    def _copy(self, slot: int):
        return self.copy_streams[slot % len(self.copy_streams)]

    def _after(self, event) -> None:
        if event is not None:
            self.stream.wait_event(event)

    def empty(self, shape, dtype):
        with self.stream:
            out = self._cupy.empty(shape, dtype)
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
        with self.stream:
            buf = self._cupy.empty(max(nbytes, 1), np.uint8)
        self.stream.synchronize()  # copy streams and kvikio write into it
        return buf

    def upload(self, host: np.ndarray, dev, nbytes: int, slot: int = 0, after=None):
        """Copy staging to the device on the slot's stream, once ``after`` has happened."""
        s = self._copy(slot)
        if after is not None:
            s.wait_event(after)
        if nbytes:
            dev[:nbytes].set(host[:nbytes], stream=s)
        return s.record()

    def wait(self, event) -> None:
        if event is not None:
            event.synchronize()

    def record(self, slot: int = 0):
        """An event after the work queued so far on the work stream."""
        return self.stream.record()

    def decode_zstd(self, src, src_offsets, src_sizes, dst, dst_offsets, dst_size, names, slot: int = 0,
                    wait=None) -> None:
        self._after(wait)
        decode_zstd_gpu(src, src_offsets, src_sizes, dst, dst_offsets, dst_size, self.stream, names)

    def decode_batch(self, algo, src, src_offsets, src_sizes, dst, dst_offsets, dst_sizes, names, slot: int = 0,
                     wait=None) -> None:
        """ONE nvCOMP batched call on the work stream (:func:`~gpu_zarr.engine.decode.decode_batch_gpu`)."""
        self._after(wait)
        # every slot decodes on the one work stream, in order: one decoder (one scratch) serves them all
        decode_batch_gpu(algo, src, src_offsets, src_sizes, dst, dst_offsets, dst_sizes, self.stream, names, 0)

    def place(self, src, src_offsets, table, out, disk_dtype, slot: int = 0, wait=None) -> None:
        self._after(wait)
        place_gpu(src, src_offsets, table, out, disk_dtype, self.stream)

    def fill(self, out, table, value) -> None:
        with self.stream:
            for t in table:
                out[tuple(slice(int(a), int(a + n)) for a, n in zip(t[:, 3], t[:, 2]))] = value

    def sync(self) -> None:
        for s in self.copy_streams:
            s.synchronize()
        self.stream.synchronize()

    def free_bytes(self) -> int:
        free, _ = self._cupy.cuda.runtime.memGetInfo()
        return int(free) + int(self._cupy.get_default_memory_pool().free_bytes())

    def finish(self, out, post):
        if post is None:
            return out
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
