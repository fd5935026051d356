"""Batch encoders: many chunks in, their encoded bytes out.

Both halves take a batch of chunks as one contiguous array of shape ``(n, *chunk)`` (numpy
for the CPU encoder, cupy for the GPU one) and return an encoded batch: the frames' sizes, and
:meth:`frames` handing the writer a run of them as host bytes. The writer's planning,
gathering, shard assembly and file output are the same for both.

- :class:`CpuEncoder` — numcodecs, the codec zarr-python itself calls, chunks spread over
  worker threads (numcodecs releases the GIL while it compresses): :class:`HostFrames`.
- :class:`GpuEncoder` (zstd) — one nvCOMP batched call per batch (RAW bitstream: standard zstd
  frames), the frames packed on the device: :class:`StagedFrames` copies them to the host a
  group of files at a time, into one staging buffer leased from the runtime's pinned pool
  (reused across batches and writes: pinning costs about 0.5 s per GiB, and a batch's frames
  whole on the host cost that much memory again), and walks each group's frames before the
  writer sees them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from gpu_zarr import settings
from gpu_zarr.errors import CorruptChunkError, WriteError
from gpu_zarr.write.codecs import CodecSpec

__all__ = ["GPU_CODECS", "CpuEncoder", "EncodedBatch", "GpuEncoder", "HostFrames", "StagedFrames"]

#: codecs nvCOMP encodes into frames every zarr reader decodes
GPU_CODECS = ("zstd",)


class EncodedBatch(Protocol):
    """Encoded chunks of one batch, ``sizes[i]`` bytes each, in the batch's order.

    ``group_bytes``: how many frame bytes one :meth:`frames` call should ask for at most (the
    writer groups whole files under it; None: any number).
    """

    @property
    def sizes(self) -> np.ndarray: ...

    @property
    def group_bytes(self) -> int | None: ...

    def frames(self, first: int, last: int) -> list[Any]:
        """Frames ``first .. last - 1`` as host bytes-like objects, valid until the next call
        or :meth:`release`."""
        ...

    def release(self) -> None: ...


class HostFrames:
    """Frames already on the host, one object each (the CPU encoder's)."""

    group_bytes = None

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts
        self.sizes = np.array([memoryview(p).nbytes for p in parts], np.int64)

    def frames(self, first: int, last: int) -> list[Any]:
        return self.parts[first:last]

    def release(self) -> None:
        self.parts = []


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
        return HostFrames(parts)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class StagedFrames:
    """Frames packed in one buffer where they were made (the GPU), copied to the host a run at
    a time into one staging buffer, each run walked (:func:`_check_encoded`) before it is
    handed on: a frame that is not whole fails the write before any file of its run is written.

    Parameters
    ----------
    packed : array
        The frames back to back, 1-D uint8 (cupy on the GPU path).
    sizes : ndarray of int64
        Each frame's size.
    chunk_nbytes : int
        A chunk's decoded size (what a frame that states its content size must state).
    copy : callable
        ``copy(src, dst)``: the bytes of ``src`` (a slice of ``packed``) into the host array
        ``dst``, complete when it returns.
    lease : callable
        ``lease(nbytes)``: a context manager giving ``[buffer]`` of at least ``nbytes`` host
        bytes (the runtime's pinned pool), given back on exit.
    group_bytes : int
        The staging buffer's usual size; a run that needs more (one big shard) gets more.
    """

    def __init__(self, packed: Any, sizes: np.ndarray, chunk_nbytes: int, copy: Callable[[Any, np.ndarray], None],
                 lease: Callable[[int], AbstractContextManager[list[np.ndarray]]], group_bytes: int) -> None:
        self.sizes = np.asarray(sizes, np.int64)
        self.group_bytes = group_bytes
        self._packed = packed
        self._ends = np.cumsum(self.sizes)
        self._chunk_nbytes = chunk_nbytes
        self._copy = copy
        self._lease = lease
        self._held = contextlib.ExitStack()
        self._buf: np.ndarray | None = None

    def _staging(self, nbytes: int) -> np.ndarray:
        if self._buf is None or self._buf.nbytes < nbytes:
            self._held.close()  # a smaller buffer back to the pool first
            self._held = contextlib.ExitStack()
            self._buf = self._held.enter_context(self._lease(max(nbytes, self.group_bytes)))[0]
        return self._buf

    def frames(self, first: int, last: int) -> list[Any]:
        if last <= first:
            return []
        sizes = self.sizes[first:last]
        lo, hi = int(self._ends[first] - sizes[0]), int(self._ends[last - 1])
        buf = self._staging(hi - lo)
        self._copy(self._packed[lo:hi], buf[:hi - lo])
        offsets = self._ends[first:last] - sizes - lo
        _check_encoded(buf, offsets, sizes, self._chunk_nbytes, first=first, total=len(self.sizes))
        return [buf[int(o):int(o + s)] for o, s in zip(offsets, sizes, strict=True)]

    def release(self) -> None:
        self._held.close()
        self._buf = None
        self._packed = None


def _check_encoded(buf: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, nbytes: int, *, first: int = 0,
                   total: int | None = None) -> None:
    """Every frame nvCOMP returned walked as the reader walks a chunk's (header, block headers,
    end, a content size of ``nbytes`` where stated) before any is written: a frame that is not
    whole fails the write instead of storing a chunk no reader can decode.

    Raises
    ------
    WriteError
        Naming the first bad frame (``first`` + its place in ``sizes``, of ``total`` in the
        batch); nothing of its run is written, and the write stops (its temporary folder is
        removed: no array that looks complete is left).
    """
    from gpu_zarr.engine.codecs.zstd_frames import check_frames
    from gpu_zarr.engine.plan import LazyNames

    n = len(sizes)
    of = n if total is None else total
    try:
        check_frames(buf, offsets, sizes, nbytes, LazyNames(n, lambda k: f"frame {first + k} of {of} in the batch"))
    except CorruptChunkError as exc:
        raise WriteError(f"nvCOMP's zstd encode returned a frame that is not a whole zstd frame of {nbytes} bytes "
                         f"({exc}); the write stopped before writing it and did not complete. Write with "
                         "encoder='cpu' instead.") from exc


class GpuEncoder:
    """nvCOMP batched zstd encode on the current cupy stream of the calling thread.

    Each writer lane runs in its own thread on its own stream; nvCOMP codecs are kept per
    (stream, thread) by the runtime (:func:`gpu_zarr.engine.decode.nvcomp_codec`).
    ``group_bytes``: frame bytes a lane brings to the host at once (:class:`StagedFrames`).

    Notes
    -----
    nvCOMP's zstd encoder has its own level; the metadata keeps the requested level (zstd
    decoders do not need it). Compressed sizes are within a few per cent of libzstd's at
    level 3 (the issue's H200 measurement: ratio 1.234 against 1.229).
    """

    name = "gpu"
    xp_name = "cupy"

    def __init__(self, spec: CodecSpec, runtime: Any, group_bytes: int | None = None) -> None:
        if spec.name not in GPU_CODECS:
            raise ValueError(f"the GPU encoder writes {GPU_CODECS}, not {spec.name!r}")
        self.spec = spec
        self._runtime = runtime  # keeps the nvCOMP codecs (per stream and thread) and the pinned pool
        # each lane's staging buffer (default): the lanes' together take a quarter of the pinned pool,
        # so a read's staging (a convert reads, then writes, in turn) stays pinned beside them
        # instead of being dropped and pinned again each time
        lanes = max(1, int(settings.get("lanes")))
        self._group_bytes = group_bytes or max(16 << 20, int(settings.get("pinned_bytes")) // (4 * lanes))

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

        def copy(src: Any, dst: np.ndarray) -> None:
            src.get(out=dst, stream=stream)  # on the lane's stream: after the encode and the packing
            stream.synchronize()

        rt = self._runtime
        return StagedFrames(packed, sizes, int(flat.shape[1]), copy, lambda nbytes: rt.pinned.lease(
            nbytes, 1, rt.pinned_alloc), self._group_bytes)

    def close(self) -> None:
        """Nothing to free: the staging buffers belong to the runtime's pinned pool."""
