"""Batch encoders: many chunks in, their encoded bytes out.

Both halves take a batch of chunks as one contiguous array of shape ``(n, *chunk)`` (numpy
for the CPU encoder, cupy for the GPU one) and return an :class:`EncodedBatch`: one host
buffer per chunk (views into one buffer on the GPU path) and their sizes. The writer's
planning, gathering, shard assembly and file output are the same for both.

- :class:`CpuEncoder` — numcodecs, the codec zarr-python itself calls, chunks spread over
  worker threads (numcodecs releases the GIL while it compresses).
- :class:`GpuEncoder` (zstd) — one nvCOMP batched call per batch (RAW bitstream: standard zstd
  frames), the frames packed on the device by one kernel and copied to the host in ONE
  transfer into a reused pinned buffer.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpu_zarr.errors import CorruptChunkError, WriteError
from gpu_zarr.write.codecs import CodecSpec

__all__ = ["GPU_CODECS", "CpuEncoder", "EncodedBatch", "GpuEncoder"]

#: codecs nvCOMP encodes into frames every zarr reader decodes
GPU_CODECS = ("zstd",)


@dataclass
class EncodedBatch:
    """Encoded chunks of one batch: ``parts[i]`` (a bytes-like object of ``sizes[i]`` bytes)."""

    parts: list[Any]
    sizes: np.ndarray
    release: Callable[[], None] = field(default=lambda: None)


class CpuEncoder:
    """numcodecs on worker threads: the CPU twin (and the encoder of every non-zstd codec).

    Parameters
    ----------
    spec : CodecSpec
    threads : int
        Worker threads compressing chunks at once, at most one per core: compression is
        CPU-bound, and more threads than cores only switch between chunks (the read threads'
        default is larger: reads wait on I/O). The writer's lanes share them.
    """

    name = "cpu"
    xp_name = "numpy"

    def __init__(self, spec: CodecSpec, threads: int) -> None:
        self.spec = spec
        self.codec = spec.cpu_codec()
        workers = max(1, min(threads, os.cpu_count() or 1))
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="gpu-zarr-encode")

    def encode(self, chunks: np.ndarray) -> EncodedBatch:
        n = int(chunks.shape[0])
        if self.codec is None:
            parts: list[Any] = [chunks[i] for i in range(n)]
        else:
            parts = list(self.pool.map(lambda i: self.codec.encode(chunks[i]), range(n)))
        sizes = np.array([memoryview(p).nbytes for p in parts], np.int64)
        return EncodedBatch(parts, sizes)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class _PinnedPool:
    """Reused pinned host buffers (fresh pinned memory costs ~1-2 ms per 8 MiB)."""

    def __init__(self) -> None:
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        with self._lock:
            for k, buf in enumerate(self._free):
                if buf.nbytes >= nbytes:
                    return self._free.pop(k)
        import cupy

        mem = cupy.cuda.alloc_pinned_memory(max(nbytes, 1 << 20))
        return np.frombuffer(mem, np.uint8, max(nbytes, 1 << 20))

    def give(self, buf: np.ndarray) -> None:
        with self._lock:
            self._free.append(buf)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


def _check_encoded(buf: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, nbytes: int) -> None:
    """Every frame nvCOMP returned walked as the reader walks a chunk's (header, block headers,
    end, a content size of ``nbytes`` where stated) before any is written: a frame that is not
    whole fails the write instead of storing a chunk no reader can decode.

    Raises
    ------
    WriteError
        Naming the first bad frame of the batch; nothing of the batch is written.
    """
    from gpu_zarr.engine.codecs.zstd_frames import check_frames
    from gpu_zarr.engine.plan import LazyNames

    n = len(sizes)
    try:
        check_frames(buf, offsets, sizes, nbytes, LazyNames(n, lambda k: f"frame {k} of {n} in the batch"))
    except CorruptChunkError as exc:
        raise WriteError(f"nvCOMP's zstd encode returned a frame that is not a whole zstd frame of {nbytes} bytes "
                         f"({exc}); nothing of this batch was written, and the write did not complete. Write with "
                         "encoder='cpu' instead.") from exc


class GpuEncoder:
    """nvCOMP batched zstd encode on the current cupy stream of the calling thread.

    Each writer lane runs in its own thread on its own stream; nvCOMP codecs are kept per
    (stream, thread) by the runtime (:func:`gpu_zarr.engine.decode.nvcomp_codec`).

    Notes
    -----
    nvCOMP's zstd encoder has its own level; the metadata keeps the requested level (zstd
    decoders do not need it). Compressed sizes are within a few per cent of libzstd's at
    level 3 (the issue's H200 measurement: ratio 1.234 against 1.229).
    """

    name = "gpu"
    xp_name = "cupy"

    def __init__(self, spec: CodecSpec, runtime: Any) -> None:
        if spec.name not in GPU_CODECS:
            raise ValueError(f"the GPU encoder writes {GPU_CODECS}, not {spec.name!r}")
        self.spec = spec
        self._runtime = runtime  # keeps the nvCOMP codecs (per stream and thread)
        self._pinned = _PinnedPool()

    def encode(self, chunks: Any) -> EncodedBatch:
        import cupy
        from nvidia import nvcomp

        from gpu_zarr.engine.decode import nvcomp_codec

        n = int(chunks.shape[0])
        stream = cupy.cuda.get_current_stream()
        flat = cupy.ascontiguousarray(chunks).reshape(n, -1).view(np.uint8)
        codec = nvcomp_codec(stream, "zstd", runtime=self._runtime)
        batch = nvcomp.as_arrays([flat[i] for i in range(n)], cuda_stream=int(stream.ptr))
        frames = [cupy.asarray(e).view(np.uint8).reshape(-1) for e in codec.encode(batch)]
        sizes = np.array([f.nbytes for f in frames], np.int64)
        packed = cupy.concatenate(frames) if n > 1 else frames[0]
        total = int(sizes.sum())
        host = self._pinned.take(total)
        packed.get(out=host[:total], stream=stream)  # one transfer, into reused pinned memory
        stream.synchronize()
        ends = np.cumsum(sizes)
        try:
            _check_encoded(host, ends - sizes, sizes, int(flat.shape[1]))
        except WriteError:
            self._pinned.give(host)
            raise
        parts = [host[int(e - s):int(e)] for s, e in zip(sizes, ends, strict=True)]
        return EncodedBatch(parts, sizes, release=lambda: self._pinned.give(host))

    def close(self) -> None:
        self._pinned.clear()
