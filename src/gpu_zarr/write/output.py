"""File output of a write: everything goes into a temporary folder beside the destination,
which is renamed into place only once the whole array (or OME-Zarr group) is written.

So an interrupted write never leaves anything that looks like a complete array at the
destination: at worst a ``.<name>.gpu-zarr-<id>.partial`` folder, removed by :meth:`abort`.
With ``overwrite=True`` the old destination is moved aside, the new one renamed in, and the
old one removed. Each file is created anew (``O_EXCL``: the temporary folder is ours alone)
from the parts it is made of (a shard's chunks, then its index), never joined in Python
first: a batch of files goes to the native library in one call (:func:`gpu_zarr.engine.native.write_files`:
``pwritev`` on native threads, no Python per file) when it is loaded, else each file is
written with ``os.writev`` on the writer's threads (the GIL is released while the kernel
copies). Both say what the file system refused in the same :class:`WriteError`.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import Executor, Future, wait
from pathlib import Path
from typing import Any, Protocol

from gpu_zarr.errors import DestinationExists, UsageError, WriteError
from gpu_zarr.write.metadata import ZARR_DOCS

__all__ = ["Destination", "Output", "is_zarr_node", "open_destination"]

_IOV_MAX = 1024


def is_zarr_node(path: Path) -> bool:
    """Whether ``path`` is a folder holding a zarr metadata document."""
    return path.is_dir() and any((path / d).is_file() for d in ZARR_DOCS)


def os_error(exc: OSError, path: Path | str, what: str) -> WriteError:
    """A :class:`WriteError` that says what the file system refused and what to do."""
    fix = {errno.EROFS: "the file system is read-only: write somewhere writable",
           errno.ENOSPC: "the file system is full: free space or write elsewhere",
           errno.EDQUOT: "the disk quota is exhausted: free space or write elsewhere",
           errno.EACCES: "permission denied: write where you may, or fix the folder's permissions",
           errno.EPERM: "operation not permitted: write where you may"}.get(exc.errno or 0, "")
    return WriteError(f"cannot {what} {path}: {exc.strerror or exc}" + (f"; {fix}" if fix else ""))


class Output(Protocol):
    """Where a write goes: a local :class:`Destination`, or a remote
    :class:`~gpu_zarr.write.remote.RemoteDestination`."""

    path: Any
    bytes_written: int
    #: files the writer's lanes should hand over at once, together, to keep the destination busy
    #: (a remote store: about its requests in flight; a local folder: 1, its writes are memory copies)
    files_at_once: int

    def write_files(self, files: Sequence[tuple[str, Sequence[Any]]], pool: Executor, threads: int) -> int: ...
    def write_documents(self, prefix: str, docs: dict[str, bytes]) -> None: ...
    def free_bytes(self) -> int | None: ...
    def commit(self) -> None: ...
    def abort(self) -> None: ...


def open_destination(path: Any, *, overwrite: bool = False, storage_options: Any = None) -> Output:
    """The output for ``path``: a local folder (a path or ``file://``), or a remote store
    (``s3://``, ``gs://``, ``http(s)://``, with ``storage_options``: :mod:`gpu_zarr.location`).

    Raises
    ------
    UsageError
        An unknown URL scheme, or storage_options for a local path.
    DestinationExists, WriteError
        As :class:`Destination` and :class:`~gpu_zarr.write.remote.RemoteDestination` say.
    """
    from gpu_zarr.location import resolve

    try:
        loc = resolve(path, storage_options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not loc.is_remote:
        return Destination(loc.url, overwrite=overwrite)
    from gpu_zarr.write.remote import RemoteDestination

    return RemoteDestination(loc, overwrite=overwrite)


class Destination:
    """A local destination folder written through a temporary folder and one rename.

    Parameters
    ----------
    path : str or Path
        Where the array or group appears once :meth:`commit` runs.
    overwrite : bool
        Replace an existing zarr at ``path``. Without it an existing path is refused.

    Raises
    ------
    UsageError
        A URL (:func:`open_destination` opens remote stores).
    DestinationExists
        ``path`` exists and ``overwrite`` is False.
    WriteError
        ``path`` exists and is not a zarr (never replaced, whatever ``overwrite`` says), or the
        temporary folder cannot be made (read-only, full, no permission).
    """

    files_at_once = 1

    def __init__(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        text = os.fspath(path)
        if "://" in text:
            raise UsageError(f"{text}: a URL, not a local folder (open_destination opens remote stores)")
        self.path = Path(text).expanduser().absolute()
        self.overwrite = bool(overwrite)
        if self.path.exists() or self.path.is_symlink():
            if not overwrite:
                raise DestinationExists(f"{self.path} already exists; pass overwrite=True (--overwrite) to "
                                        "replace it, or choose another path")
            if not (is_zarr_node(self.path) or (self.path.is_dir() and not any(self.path.iterdir()))):
                raise WriteError(f"{self.path} exists and is not a zarr array or group; it is never replaced "
                                 "(even with overwrite=True): remove it yourself or choose another path")
        parent = self.path.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            self.tmp = parent / f".{self.path.name}.gpu-zarr-{uuid.uuid4().hex[:12]}.partial"
            self.tmp.mkdir()
        except OSError as exc:
            raise os_error(exc, parent, "create a folder in") from None
        self._made: set[Path] = {self.tmp}
        self._lock = threading.Lock()
        self.bytes_written = 0

    def free_bytes(self) -> int | None:
        """Free bytes on the destination's file system."""
        return int(shutil.disk_usage(self.tmp).free)

    def _folder(self, folder: Path) -> None:
        with self._lock:
            if folder in self._made:
                return
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise os_error(exc, folder, "create") from None
        with self._lock:
            self._made.add(folder)

    def write_files(self, files: Sequence[tuple[str, Sequence[Any]]], pool: Executor, threads: int) -> int:
        """Write each ``(key, parts)`` of ``files`` (as :meth:`write`); returns the bytes written.

        One call into the native library on ``threads`` native threads when it is loaded, else
        :meth:`write` per file on ``pool``. Every file has finished (or failed) when this
        returns or raises, so the parts' buffers may be reused at once.

        Raises
        ------
        WriteError
            The file system refused a file (the first one in ``files`` that failed is named).
        """
        from gpu_zarr.engine import native

        if not files:
            return 0
        if not native.available():
            futures: list[Future[int]] = [pool.submit(self.write, key, parts) for key, parts in files]
            wait(futures)
            return sum(f.result() for f in futures)
        targets = [self.tmp / key for key, _ in files]
        status, detail = native.write_files(targets, [list(parts) for _, parts in files], threads)
        bad = (status != native.OK).nonzero()[0]
        if len(bad):
            k = int(bad[0])
            code = int(detail[k])
            what = "create" if int(status[k]) == native.OPEN else "write"
            raise os_error(OSError(code, os.strerror(code)), targets[k], what)
        done = int(detail.sum())
        with self._lock:
            self.bytes_written += done
        return done

    def write(self, key: str, parts: Sequence[Any]) -> int:
        """Write the file ``key`` (relative, "/"-separated; it must not exist yet) from ``parts``
        (bytes-like objects, written in order); returns the bytes written. Safe to call from many
        threads."""
        target = self.tmp / key
        self._folder(target.parent)
        views = [memoryview(p).cast("B") for p in parts]
        views = [v for v in views if v.nbytes]
        total = sum(v.nbytes for v in views)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise os_error(exc, target, "create") from None
        done = 0
        try:
            try:
                while views:
                    n = os.writev(fd, views[:_IOV_MAX])
                    done += n
                    while views and n >= views[0].nbytes:  # drop what went out; keep the rest of a short write
                        n -= views[0].nbytes
                        views.pop(0)
                    if views and n:
                        views[0] = views[0][n:]
            finally:
                os.close(fd)  # a failed close is a failed write (NFS reports a full disk there)
        except OSError as exc:
            raise os_error(exc, target, "write") from None
        with self._lock:
            self.bytes_written += done
        return total

    def write_documents(self, prefix: str, docs: dict[str, bytes]) -> None:
        """Write metadata documents under ``prefix`` (a folder key, "" for the root)."""
        for name, data in docs.items():
            self.write(f"{prefix}/{name}" if prefix else name, [data])

    def commit(self) -> None:
        """Rename the finished folder into place (replacing the old one when overwriting)."""
        old = None
        try:
            if self.path.exists() or self.path.is_symlink():
                old = self.path.parent / f".{self.path.name}.gpu-zarr-{uuid.uuid4().hex[:12]}.replaced"
                os.rename(self.path, old)
            os.rename(self.tmp, self.path)
        except OSError as exc:
            if old is not None and not self.path.exists():
                os.rename(old, self.path)  # put the old array back
            raise os_error(exc, self.path, "rename the finished write into") from None
        if old is not None:
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink()

    def abort(self) -> None:
        """Remove the temporary folder (after a failure or an interruption)."""
        shutil.rmtree(self.tmp, ignore_errors=True)
