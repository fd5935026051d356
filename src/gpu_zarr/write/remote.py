"""Remote output of a write: objects put into an ``s3://``, ``gs://`` or ``http(s)://`` store.

An object store has no folder to rename into place, so completeness is carried by the
order of the puts instead: every chunk and shard object first, then each array's metadata,
then the groups' (the root's, with the OME attributes, last). An interrupted write never
leaves a node that looks complete; :meth:`RemoteDestination.abort` deletes the objects it
put (best effort). ``overwrite=False`` refuses a destination that already holds zarr
metadata; ``overwrite=True`` deletes everything under the destination's prefix first (its
metadata first), so no chunk of the old array survives among the new ones.

The store is the reader's (:meth:`gpu_zarr.location.Location.object_store`, from the URL
and ``storage_options``). Objects go out with obstore's ``put`` on the runtime's put
threads: at most ``requests`` (``storage_options["requests"]``, else the
``remote_requests`` setting) in flight across every lane of the write; an object larger
than :data:`PART_BYTES` goes out as a multipart upload streamed from its parts (a shard's
chunks, then its index), a smaller one is joined into one buffer first. The bytes held are
the writer's batches (``lanes`` x ``batch_bytes``) plus at most one joined object per put
in flight.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, Future, wait
from typing import Any

from gpu_zarr.errors import DestinationExists, UsageError, WriteError
from gpu_zarr.write.metadata import ZARR_DOCS

__all__ = ["PART_BYTES", "RemoteDestination"]

#: objects above this size go out as multipart uploads, in parts of this size (S3's parts
#: are 5 MiB at least; larger parts mean fewer requests per shard)
PART_BYTES = 8 << 20
#: parts of one multipart upload in flight at once
PART_CONCURRENCY = 4


def _nbytes(p: Any) -> int:
    return memoryview(p).nbytes


class RemoteDestination:
    """A remote array or group, written object by object, its metadata last.

    Parameters
    ----------
    location : gpu_zarr.location.Location
        Where the array or group goes (a remote one).
    overwrite : bool
        Replace a zarr already there (every object under its prefix is deleted first).

    Raises
    ------
    DestinationExists
        Zarr metadata is already there and ``overwrite`` is False.
    WriteError
        Objects that are not a zarr are there (never replaced), or the store refused.
    """

    def __init__(self, location: Any, *, overwrite: bool = False) -> None:
        if location.scheme not in ("s3", "gs", "http", "https"):
            raise UsageError(f"{location.url}: the writer writes s3://, gs:// and http(s):// stores")
        self.location = location
        self.path = location.url
        self.overwrite = bool(overwrite)
        self.store = location.object_store()
        self.bytes_written = 0
        self._put: list[str] = []
        self._lock = threading.Lock()
        self._requests = location.requests()
        # objects a write hands over at once to keep its requests busy (a big one puts several parts)
        self.files_at_once = max(1, self._requests // PART_CONCURRENCY)
        self._prepare()

    # -- what is there already -------------------------------------------------------
    def _has(self, key: str) -> bool:
        import obstore

        try:
            obstore.head(self.store, key)
            return True
        except FileNotFoundError:
            return False
        except Exception as exc:  # noqa: BLE001 - obstore's errors differ by store
            raise self._error(exc, key, "look for") from None

    def _existing(self) -> list[str] | None:
        """Every key under the destination's prefix, or None where the store cannot list (http)."""
        import obstore

        try:
            return [m["path"] for batch in obstore.list(self.store) for m in batch]
        except (NotImplementedError, obstore.exceptions.NotSupportedError):
            return None
        except Exception as exc:  # noqa: BLE001 - an HTTP server without listing answers in its own way
            if self.location.scheme in ("http", "https"):
                return None
            raise self._error(exc, "", "list") from None

    def _prepare(self) -> None:
        is_zarr = any(self._has(d) for d in ZARR_DOCS)
        keys = self._existing()
        if is_zarr and not self.overwrite:
            raise DestinationExists(f"{self.path} already holds a zarr; pass overwrite=True (--overwrite) to replace "
                                    "it, or choose another path")
        if keys and not is_zarr:
            raise WriteError(f"{self.path} holds {len(keys)} objects and is not a zarr array or group; it is never "
                             "replaced (even with overwrite=True): remove them yourself or choose another path")
        if is_zarr:
            if keys is None:
                raise WriteError(f"{self.path}: this store cannot list its objects, so an old zarr there cannot be "
                                 "replaced cleanly; remove it yourself or choose another path")
            self._delete(sorted(keys, key=lambda k: k.rsplit("/", 1)[-1] not in ZARR_DOCS))  # metadata first

    def _delete(self, keys: Sequence[str]) -> None:
        import obstore

        if not keys:
            return
        try:
            obstore.delete(self.store, list(keys))
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, keys[0], "delete the old object") from None

    # -- writing ---------------------------------------------------------------------
    def _error(self, exc: BaseException, key: str, what: str) -> WriteError:
        from gpu_zarr.location import network_cause

        url = f"{self.path}/{key}" if key else self.path
        name = type(exc).__name__
        fix = ("; check the credentials (storage_options or the environment) and the bucket's policy"
               if name in ("PermissionDeniedError", "UnauthenticatedError") else "")
        return WriteError(f"cannot {what} {url}: {network_cause(url, exc)}{name}: {exc}"[:2000] + fix)

    def _put_one(self, key: str, parts: Sequence[Any]) -> int:
        import obstore

        views = [memoryview(p).cast("B") for p in parts if _nbytes(p)]
        total = sum(v.nbytes for v in views)
        try:
            if total > PART_BYTES:  # streamed from the parts: no joined copy of a big shard
                obstore.put(self.store, key, iter(views), use_multipart=True, chunk_size=PART_BYTES,
                            max_concurrency=PART_CONCURRENCY)
            else:
                obstore.put(self.store, key, views[0] if len(views) == 1 else b"".join(views),
                            use_multipart=False)  # (b"" for an empty object)
        except Exception as exc:  # noqa: BLE001 - obstore's errors differ by store
            raise self._error(exc, key, "put") from None
        with self._lock:
            self._put.append(key)
            self.bytes_written += total
        return total

    def write_files(self, files: Sequence[tuple[str, Sequence[Any]]], pool: Executor, threads: int) -> int:
        """Put each ``(key, parts)`` of ``files``; returns the bytes put. Every put has finished (or
        failed) when this returns or raises. ``pool`` and ``threads`` (the local writer's) are unused:
        the puts run on the runtime's put threads, ``requests`` at most in flight."""
        from gpu_zarr.engine.runtime import get_runtime

        puts = get_runtime().pool("write-puts", self._requests)
        futures: list[Future[int]] = [puts.submit(self._put_one, key, parts) for key, parts in files]
        wait(futures)
        return sum(f.result() for f in futures)

    def write(self, key: str, parts: Sequence[Any]) -> int:
        """Put the object ``key`` from ``parts`` (bytes-like objects, in order)."""
        return self._put_one(key, parts)

    def write_documents(self, prefix: str, docs: Mapping[str, bytes]) -> None:
        """Put metadata documents under ``prefix`` ("" for the root), in order."""
        for name, data in docs.items():
            self._put_one(f"{prefix}/{name}" if prefix else name, [data])

    def free_bytes(self) -> int | None:
        """None: an object store has no free space to check."""
        return None

    def commit(self) -> None:
        """Nothing to put: the metadata, put last, made the write visible. The reader's cached
        metadata documents are dropped (they may be this store's old ones)."""
        from gpu_zarr.location import clear_metadata_cache

        clear_metadata_cache()

    def abort(self) -> None:
        """Delete the objects put so far (best effort: the write failed or was interrupted)."""
        import contextlib

        import obstore

        with self._lock:
            keys, self._put = list(self._put), []
        if keys:
            with contextlib.suppress(Exception):
                obstore.delete(self.store, keys)
