"""Stage 2, fetch: read a batch's byte ranges, many at a time.

Three readers with one interface: :class:`NativeReader` (the native library's threads,
:mod:`gpu_zarr.engine.native`: one call per batch, no Python per file), :class:`ThreadReader`
(a pool of Python threads calling ``os.preadv``, which releases the GIL; the fallback) and
:class:`KvikioReader` (kvikio's own C++ thread pool, several threads; kvikio's default is
one). All fill a host staging buffer (pinned memory on the GPU path); kvikio can also fill
device memory directly. Large ranges are split into parts so that all threads work on a batch
of few big chunks.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

import gpu_zarr.engine.native as native
from gpu_zarr.errors import CorruptChunkError

if TYPE_CHECKING:
    from gpu_zarr.engine.plan import Batch
    from gpu_zarr.engine.runtime import Runtime

__all__ = ["KvikioReader", "NativeReader", "OwnThreads", "Reader", "ThreadReader", "make_reader", "native_items",
           "raise_read_errors", "read_range", "read_tasks", "reader_of"]

PART_BYTES = 4 << 20


def read_tasks(batch: Batch, part: int = PART_BYTES) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Vectored read tasks for a batch: (file id, file offset, [(dest offset, length), ...]).

    Each coalesced run of adjacent pieces becomes tasks of about ``part`` bytes, cut at piece
    boundaries; a piece larger than ``part`` is cut into byte ranges of its own.
    """
    tasks = []
    fid, foff, src, size = (batch.file_id.tolist(), batch.file_offset.tolist(),
                            batch.src_offsets.tolist(), batch.src_sizes.tolist())
    for a, b in batch.runs.tolist():
        cur: list[tuple[int, int]] = []
        cur_off, cur_len = foff[a], 0
        for k in range(a, b):
            if size[k] > part:
                if cur:
                    tasks.append((fid[a], cur_off, cur))
                    cur, cur_len = [], 0
                for o in range(0, size[k], part):
                    tasks.append((fid[k], foff[k] + o, [(src[k] + o, min(part, size[k] - o))]))
                cur_off = foff[k] + size[k]
                continue
            if cur and cur_len + size[k] > part:
                tasks.append((fid[a], cur_off, cur))
                cur, cur_len, cur_off = [], 0, foff[k]
            cur.append((src[k], size[k]))
            cur_len += size[k]
        if cur:
            tasks.append((fid[a], cur_off, cur))
    return tasks


def read_range(path: Path, offset: int, dest: np.ndarray) -> None:
    """Fill ``dest`` (host uint8) with the file's bytes at ``offset`` (CorruptChunkError if it ends early)."""
    _read_task(path, offset, memoryview(dest).cast("B"), [(0, int(dest.nbytes))])


def _read_task(path: Path, offset: int, dest: memoryview, spans: list[tuple[int, int]]) -> None:
    """One vectored read of adjacent file bytes into (possibly separate) staging spans."""
    total = sum(n for _, n in spans)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = 0
        bufs = [dest[d:d + n] for d, n in spans]
        while got < total:
            n = os.preadv(fd, bufs, offset + got)
            if n == 0:
                raise _ended(path, total, offset, got)
            got += n
            # drop what was filled, keep reading into the rest
            while bufs and n >= len(bufs[0]):
                n -= len(bufs[0])
                bufs.pop(0)
            if n:
                bufs[0] = bufs[0][n:]
    finally:
        os.close(fd)


def _ended(path: Any, n: int, offset: int, got: int) -> CorruptChunkError:
    return CorruptChunkError(f"{path}: expected {n} bytes at offset {offset}, the file ends after {got}; it was "
                             "truncated (or is being written). Re-run once the writer has finished.")


class Reader(Protocol):
    """What the pipeline needs of a reader (:class:`ThreadReader`, :class:`KvikioReader`)."""

    name: str
    threads: int

    def read(self, files: list[Path], batch: Batch, dest: Any) -> None: ...

    def session(self) -> AbstractContextManager[None]: ...

    def close(self) -> None: ...


class OwnThreads:
    """A reader on threads of our own (the runtime's pools, the native library's): nothing to
    scope around its reads, nothing of its own to release."""

    def session(self) -> AbstractContextManager[None]:
        return nullcontext()

    def close(self) -> None:
        pass


class ThreadReader(OwnThreads):
    """Read byte ranges with a pool of Python threads (``os.preadv``, GIL released)."""

    name = "threads"

    def __init__(self, threads: int, pool: ThreadPoolExecutor | None = None):
        self.threads = threads
        self._pool = pool or ThreadPoolExecutor(threads, thread_name_prefix="gpu-zarr-read")

    def read(self, files: list[Path], batch: Batch, dest: Any) -> None:
        """Fill ``dest`` (host uint8) with the encoded bytes of every piece of ``batch``.

        The read tasks are dealt round-robin to one job per thread, each a plain loop: a
        batch of a thousand small chunk files costs a few pool hand-offs, not one per file
        (each hand-off takes the GIL from the thread that drives the GPU).
        """
        mv = memoryview(dest).cast("B")
        tasks = read_tasks(batch)
        jobs = max(1, min(self.threads, len(tasks)))

        def run(j: int) -> None:
            for f, o, spans in tasks[j::jobs]:
                _read_task(files[f], o, mv, spans)
        if jobs == 1:
            run(0)
            return
        for fut in [self._pool.submit(run, j) for j in range(jobs)]:
            fut.result()


class KvikioReader(OwnThreads):
    """Read byte ranges with kvikio (``CuFile.pread``), into host or device memory.

    Notes
    -----
    Without nvidia-fs kvikio runs in POSIX compat mode: it reads through its own bounce
    buffers with its thread pool, which we size to ``threads`` (kvikio's default is 1).
    """

    name = "kvikio"

    _lock = threading.Lock()
    _active = 0  # engine reads inside session(), all readers together
    _saved: Any = None  # kvikio's own setting, restored when the last of them ends

    def __init__(self, threads: int):
        import kvikio
        import kvikio.defaults

        self.threads = threads
        self._kvikio = kvikio

    @contextmanager
    def session(self) -> Iterator[None]:
        """kvikio's thread pool sized to ``threads`` for the reads inside (kvikio's setting is
        process-wide: the first read in saves the user's value, the last one out restores it;
        resizing rebuilds kvikio's pool, so it is done only when the value differs)."""
        import kvikio.defaults

        cls = type(self)
        with cls._lock:
            if cls._active == 0:
                cls._saved = kvikio.defaults.get("num_threads")
            if kvikio.defaults.get("num_threads") < self.threads:
                kvikio.defaults.set("num_threads", self.threads)
            cls._active += 1
        try:
            yield
        finally:
            with cls._lock:
                cls._active -= 1
                if cls._active == 0 and kvikio.defaults.get("num_threads") != cls._saved:
                    kvikio.defaults.set("num_threads", cls._saved)

    def read(self, files: list[Path], batch: Batch, dest: Any) -> None:
        """Fill ``dest`` (host or device uint8) with the encoded bytes of every piece of ``batch``."""
        handles: dict[int, Any] = {}
        futs = []
        fid, foff, src, size = (batch.file_id.tolist(), batch.file_offset.tolist(),
                                batch.src_offsets.tolist(), batch.src_sizes.tolist())
        try:
            # one pread per run of adjacent pieces (kvikio splits it into tasks for its pool)
            for a, b in batch.runs.tolist():
                f, o, d = fid[a], foff[a], src[a]
                n = foff[b - 1] + size[b - 1] - o
                fh = handles.get(f)
                if fh is None:
                    fh = handles[f] = self._kvikio.CuFile(files[f], "r")
                futs.append((f, o, n, fh.pread(dest[d:d + n], n, o)))
            for f, o, n, fut in futs:
                got = fut.get()
                if got != n:
                    raise _ended(files[f], n, o, got)
        finally:
            for fh in handles.values():
                fh.close()


def native_items(batch: Batch, part: int = PART_BYTES) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(file id, file offset, size, staging offset) of every read of a batch for the native
    reader: one per piece, pieces larger than ``part`` cut into parts (vectorised)."""
    size = batch.src_sizes.astype(np.int64)
    nparts = np.maximum(1, -(-size // part))
    rep = np.repeat(np.arange(len(size)), nparts)
    k = np.arange(len(rep), dtype=np.int64) - np.repeat(np.cumsum(nparts) - nparts, nparts)
    off = k * part
    return (batch.file_id[rep].astype(np.int64), batch.file_offset[rep] + off, np.minimum(part, size[rep] - off),
            batch.src_offsets[rep] + off)


def raise_read_errors(files: list[Any], fid: np.ndarray, foff: np.ndarray, size: np.ndarray, status: np.ndarray,
                      detail: np.ndarray) -> None:
    """Raise for the first failed item of a native read: CorruptChunkError naming the file
    for a short file, the OSError of the failed open or read otherwise."""
    bad = np.flatnonzero(status != native.OK)
    if not len(bad):
        return
    i = int(bad[0])
    path, code, det = files[int(fid[i])], int(status[i]), int(detail[i])
    if code == native.SHORT:
        raise _ended(path, int(size[i]), int(foff[i]), det)
    if code in (native.OPEN, native.IO) and det:
        raise OSError(det, f"{os.strerror(det)} (reading chunk bytes)", str(path))
    raise RuntimeError(f"{path}: native read failed: {native.describe(code, det)}")


class NativeReader(OwnThreads):
    """Read byte ranges on the native library's threads (:mod:`gpu_zarr.engine.native`).

    One call per batch: the Python side only computes the batch's read list (vectorised);
    the files are opened and read by C threads (``pread``), consecutive pieces of one file
    with the file opened once per 4 MiB group, while the GIL stays free for the thread that
    drives the GPU.
    """

    name = "native"

    def __init__(self, threads: int):
        if not native.available():
            raise RuntimeError(f"the native reader is not available: {native.status().reason}")
        self.threads = threads

    def read(self, files: list[Path], batch: Batch, dest: Any) -> None:
        """Fill ``dest`` (host uint8) with the encoded bytes of every piece of ``batch``."""
        if not isinstance(dest, np.ndarray):
            raise TypeError("the native reader fills host memory (numpy); use kvikio for device memory")
        fid, foff, size, doff = native_items(batch)
        st, det = native.read(files, fid, foff, size, doff, dest.reshape(-1), self.threads)
        raise_read_errors(files, fid, foff, size, st, det)


def make_reader(kind: str, threads: int, runtime: Runtime | None = None) -> Reader:
    """A reader of ``kind`` "kvikio", "native", "threads", "auto" (kvikio when importable,
    else native when built, else threads) or "cpu-auto" (native when built, else threads:
    the CPU path, where no device memory is filled).

    Readers are long-lived: get them through :func:`reader_of`, which keeps them in the runtime.
    """
    if kind == "auto":
        try:
            import kvikio  # noqa: F401

            kind = "kvikio"
        except ImportError:
            kind = "cpu-auto"
    if kind == "cpu-auto":
        kind = "native" if native.available() else "threads"
    if kind == "native":
        return NativeReader(threads)
    if kind == "kvikio":
        return KvikioReader(threads)
    if kind != "threads":
        raise ValueError(f"reader must be 'auto', 'kvikio', 'native' or 'threads'; got {kind!r}")
    return ThreadReader(threads, runtime.pool("read", threads) if runtime is not None else None)


def reader_of(runtime: Runtime, kind: str, threads: int) -> Reader:
    """The runtime's byte-range reader of ``kind`` ("kvikio", "native", "threads", "auto", "cpu-auto")
    and ``threads``, made once and kept for reuse (closed with the runtime)."""
    return runtime.resource(("reader", kind, threads), lambda: make_reader(kind, threads, runtime),
                            close=lambda r: r.close())
