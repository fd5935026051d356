"""Remote stores (http, s3, gs) through obstore: the objects of one array and their requests.

:mod:`gpu_zarr.engine.remote_fetch` holds the locate and fetch stages built on it.

Unsharded chunks are fetched whole (:meth:`RemoteSource.get_many`, one GET each, all in
flight at once; a 404 is None: the fill value), shard indexes by one suffix-range GET each
(:meth:`RemoteSource.get_indexes`), and byte ranges with up to ``requests`` in flight
(:meth:`RemoteSource.read_ranges`).

Retries: obstore retries 429/5xx, connection errors and timeouts with exponential backoff
(:mod:`gpu_zarr.location` configures it); answers that end early (a truncated body) are
retried here. A ranged answer whose length is not the length asked for is never decoded:
it is retried and, if it persists, raises :class:`~gpu_zarr.errors.RemoteError`.
Fetched whole chunks and shard indexes are kept in a bounded LRU of encoded bytes
(``GPU_ZARR_REMOTE_CACHE_MIB``, default 256), so a viewer's next look at a plane sends no
request; decoded chunks go to the runtime's chunk cache as for local files.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gpu_zarr.errors import RemoteError, ShortAnswer
from gpu_zarr.location import network_cause

__all__ = ["FETCHED", "Got", "RemoteBlob", "RemoteObject", "RemoteSource", "source_of"]

_ATTEMPTS = 4  # our own retries of answers that ended early (obstore retries the rest)
T = TypeVar("T")


# -- one event loop for every remote request of the process -----------------------------------
class _Loop:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def run(self, coro: Awaitable[T]) -> T:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, daemon=True, name="gpu-zarr-remote").start()
                self._loop = loop
            loop = self._loop
        return asyncio.run_coroutine_threadsafe(coro, loop).result()  # type: ignore[arg-type]


_LOOP = _Loop()


class _Bytes:
    """A bounded LRU of fetched encoded bytes (whole chunks, shard indexes; None: absent)."""

    def __init__(self) -> None:
        self._d: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0

    @staticmethod
    def limit() -> int:
        return int(float(os.environ.get("GPU_ZARR_REMOTE_CACHE_MIB", 256)) * (1 << 20))

    def get(self, key: Any) -> Any:
        with self._lock:
            if key in self._d:
                self._d.move_to_end(key)
                return self._d[key]
        raise KeyError(key)

    def put(self, key: Any, value: Any) -> None:
        size = len(value[0]) if value is not None else 0
        limit = self.limit()
        if size > limit // 4:
            return
        with self._lock:
            if key in self._d:
                return
            self._d[key] = value
            self.nbytes += size
            while self.nbytes > limit and self._d:
                _, old = self._d.popitem(last=False)
                self.nbytes -= len(old[0]) if old is not None else 0

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self.nbytes = 0


FETCHED = _Bytes()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


async def _all(coros: Sequence[Awaitable[Any]]) -> None:
    """Run ``coros`` together; on the first failure cancel the rest and wait for them (nothing
    is left writing into buffers after an error is raised)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class RemoteSource:
    """One remote zarr array's objects: its obstore store, the key prefix of the array in it,
    a URL for messages, and how many requests may be in flight.

    Parameters
    ----------
    store : obstore store
    prefix : str
        Key of the array inside ``store`` ("" at the store's root).
    url : str
        The array's URL (messages, cache keys).
    requests : int
        Requests in flight at once.
    """

    def __init__(self, store: Any, prefix: str, url: str, requests: int = 64) -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        self.url = url.rstrip("/")
        self.requests = max(1, int(requests))
        self.stats: dict[str, float] = {"requests": 0, "bytes": 0}
        self._stats_lock = threading.Lock()
        # shard indexes of this open array: rel -> (index bytes, shard size, mtime ns, etag)
        self._indexes: OrderedDict[str, tuple[Any, int, int, str]] = OrderedDict()
        self._indexes_nbytes = 0
        self.ranges = True  # False once the server said it answers no byte ranges
        self._whole_pending: dict[str, Any] = {}  # rel -> the whole-object GET under way (on _LOOP)

    # -- shard indexes of the open array ---------------------------------------------------------
    def cached_index(self, rel: str) -> tuple[Any, int, int, str] | None:
        """The shard index fetched before for ``rel`` (bytes, shard size, mtime ns, etag), or None."""
        with self._stats_lock:
            got = self._indexes.get(rel)
            if got is not None:
                self._indexes.move_to_end(rel)
            return got

    def keep_index(self, rel: str, raw: Any, size: int, mtime: int, etag: str = "") -> None:
        """Remember a shard's index (bounded by ``GPU_ZARR_REMOTE_INDEX_MIB``, default 64)."""
        limit = int(float(os.environ.get("GPU_ZARR_REMOTE_INDEX_MIB", 64)) * (1 << 20))
        raw = bytes(raw)
        with self._stats_lock:
            old = self._indexes.pop(rel, None)
            self._indexes_nbytes -= len(old[0]) if old is not None else 0
            self._indexes[rel] = (raw, int(size), int(mtime), etag)
            self._indexes_nbytes += len(raw)
            while self._indexes_nbytes > limit and len(self._indexes) > 1:
                _, gone = self._indexes.popitem(last=False)
                self._indexes_nbytes -= len(gone[0])

    def forget_index(self, rel: str) -> None:
        """Drop a shard's index (the shard changed since it was fetched)."""
        with self._stats_lock:
            old = self._indexes.pop(rel, None)
            self._indexes_nbytes -= len(old[0]) if old is not None else 0

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def url_of(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def _count(self, n: int) -> None:
        with self._stats_lock:
            self.stats["requests"] += 1
            self.stats["bytes"] += n

    def _error(self, rel: str, exc: BaseException, what: str) -> RemoteError:
        import obstore.exceptions as oe

        url = self.url_of(rel)
        if isinstance(exc, oe.PermissionDeniedError) or isinstance(exc, oe.UnauthenticatedError):
            hint = ("the server refused access (403/401): check the URL, and for a private bucket the "
                    "credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or storage_options)")
        elif isinstance(exc, FileNotFoundError):
            hint = "it was not found (404) although the store's index points to it: the store changed while read"
        else:
            hint = (f"{network_cause(url, exc)}check that the server is up and reachable (network, DNS, proxy) "
                    "and retry; requests in flight can be lowered with GPU_ZARR_REMOTE_REQUESTS")
        return RemoteError(f"{what} {url} failed: {_first_line(exc)}. {hint}.")

    async def _retry(self, rel: str, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        import obstore.exceptions as oe

        for attempt in range(_ATTEMPTS):
            try:
                return await fn()
            except (FileNotFoundError, oe.PermissionDeniedError, oe.UnauthenticatedError) as exc:
                raise self._error(rel, exc, what) from exc
            except (oe.GenericError, ShortAnswer, ConnectionError, TimeoutError) as exc:
                # obstore already retried 5xx, resets and timeouts; an answer that ended early is ours
                if attempt == _ATTEMPTS - 1:
                    raise self._error(rel, exc, what) from exc
                await asyncio.sleep(0.05 * 2 ** attempt)
            except oe.BaseError as exc:
                raise self._error(rel, exc, what) from exc
        raise AssertionError("unreachable")

    # -- byte ranges, or whole objects cut where the server answers no ranges ------------------
    async def _range_get(self, rel: str, rng: Any) -> tuple[Any, int, int, Any]:
        """(data, start, end, object metadata) of a byte range of ``rel``; ``rng`` is
        ``(start, end)`` or ``{"suffix": n}``. A server that answers no ranges (python's
        ``http.server``, some static hosts) gets one whole-object GET instead, kept in the
        byte cache and cut here: slower, never wrong, said once in the log."""
        import obstore
        import obstore.exceptions as oe

        if self.ranges:
            try:
                res = await obstore.get_async(self.store, self.key(rel), options={"range": rng})
                lo, hi = res.range
                return await res.bytes_async(), int(lo), int(hi), dict(res.meta)
            except oe.NotSupportedError:
                if self.ranges:
                    self.ranges = False
                    logging.getLogger("gpu_zarr.remote").warning(
                        "%s answers no byte ranges: whole objects are fetched and cut (slower, above all for "
                        "shards); serve the store with a server that answers Range requests (nginx, S3, ...)",
                        self.url)
        data, meta = await self._whole(rel)
        size = len(data)
        lo, hi = (max(0, size - int(rng["suffix"])), size) if isinstance(rng, dict) else (
            min(int(rng[0]), size), min(int(rng[1]), size))
        return memoryview(data)[lo:hi], lo, hi, meta

    async def _whole(self, rel: str) -> tuple[bytes, dict[str, Any]]:
        """The whole object (one GET for every range of it asked for at once; kept in the byte cache)."""
        import obstore

        try:
            got: tuple[bytes, dict[str, Any]] = FETCHED.get((self.url, rel, "whole"))
            return got
        except KeyError:
            pass
        task = self._whole_pending.get(rel)
        if task is None:
            async def fetch() -> tuple[bytes, dict[str, Any]]:
                res = await obstore.get_async(self.store, self.key(rel))
                data = bytes(await res.bytes_async())
                if len(data) != int(res.meta["size"]):
                    raise ShortAnswer(f"expected {int(res.meta['size'])} bytes, got {len(data)}")
                self._count(len(data))
                FETCHED.put((self.url, rel, "whole"), (data, dict(res.meta)))
                return data, dict(res.meta)
            task = self._whole_pending[rel] = asyncio.ensure_future(fetch())
            task.add_done_callback(lambda _t: self._whole_pending.pop(rel, None))
        return await asyncio.shield(task)

    # -- whole objects (unsharded chunks) ------------------------------------------------------
    def get_many(self, rels: Sequence[str]) -> list[tuple[bytes, int] | None]:
        """Each object's bytes and modification time in ns (None when it does not exist)."""
        out: list[Any] = [None] * len(rels)
        todo = []
        for i, r in enumerate(rels):
            try:
                out[i] = FETCHED.get((self.url, r))
            except KeyError:
                todo.append(i)
        if todo:
            got = _LOOP.run(self._get_many([rels[i] for i in todo]))
            for i, g in zip(todo, got):
                out[i] = g
                FETCHED.put((self.url, rels[i]), g)
        return out

    async def _get_many(self, rels: Sequence[str]) -> list[Any]:
        sem = asyncio.Semaphore(self.requests)
        return list(await asyncio.gather(*(self._get_one(sem, r) for r in rels)))

    async def _get_one(self, sem: asyncio.Semaphore, rel: str) -> tuple[bytes, int] | None:
        import obstore

        async def once() -> tuple[bytes, int] | None:
            try:
                res = await obstore.get_async(self.store, self.key(rel))
            except FileNotFoundError:
                return None
            data = await res.bytes_async()
            size = int(res.meta["size"])
            if len(data) != size:
                raise ShortAnswer(f"expected {size} bytes, got {len(data)}")
            self._count(size)
            return bytes(data), _mtime(res.meta)
        async with sem:
            return await self._retry(rel, "GET", once)

    # -- shard indexes ---------------------------------------------------------------------------
    def get_indexes(self, rels: Sequence[str], nbytes: int, at_end: bool) -> list[tuple[bytes, int, int] | None]:
        """Per shard (index bytes, shard size, mtime ns), None when the shard does not exist.

        One GET each, with a suffix range (index at the end) or a prefix range.
        """
        out: list[Any] = [None] * len(rels)
        todo = []
        for i, r in enumerate(rels):
            known = self.cached_index(r)
            if known is not None and len(known[0]) == nbytes:
                out[i] = known[:3]
                continue
            try:
                out[i] = FETCHED.get((self.url, r, "index", nbytes, at_end))
            except KeyError:
                todo.append(i)
        if todo:  # all in one wave: one round trip
            sem = asyncio.Semaphore(self.requests)

            async def all_() -> list[Any]:
                return list(await asyncio.gather(*(self._index(sem, rels[i], nbytes, at_end) for i in todo)))
            for i, g in zip(todo, _LOOP.run(all_())):
                out[i] = g[:3] if g is not None else None
                FETCHED.put((self.url, rels[i], "index", nbytes, at_end), out[i])
                if g is not None and len(g[0]) == nbytes:
                    self.keep_index(rels[i], *g)
        return out

    async def _index(self, sem: asyncio.Semaphore, rel: str, nbytes: int, at_end: bool) -> Any:

        async def once() -> Any:
            rng: Any = {"suffix": nbytes} if at_end else (0, nbytes)
            try:
                data, lo, hi, meta = await self._range_get(rel, rng)
            except FileNotFoundError:
                return None
            size = int(meta["size"])
            if len(data) != hi - lo:
                raise ShortAnswer(f"expected {hi - lo} bytes, got {len(data)}")
            self._count(len(data))
            return bytes(data), size, _mtime(meta), _etag(meta)
        async with sem:
            try:
                return await self._retry(rel, "GET (shard index)", once)
            except RemoteError as exc:
                if "416" in str(exc) or "Range Not Satisfiable" in str(exc):
                    return b"", 0, 0, ""  # shorter than its index: locate says it is truncated
                raise

    # -- whole objects and byte ranges, each handed on as it arrives -----------------------------
    def stream(self, jobs: Sequence[tuple[str, tuple[int, int] | None]],
               on_done: Callable[[int, Got | None], None]) -> None:
        """GET every job, up to ``requests`` in flight, and call ``on_done(i, got)`` (on the
        event loop's thread: it must only hand the work on) as each one arrives.

        A job is ``(rel, None)`` for the whole object (``got`` None: it does not exist) or
        ``(rel, (start, end))`` for a byte range (a missing object is an error there). An
        answer shorter than asked for is retried and never handed on. The first error
        cancels the rest and is raised here.
        """
        if jobs:
            _LOOP.run(self._stream(jobs, on_done))

    async def _stream(self, jobs: Sequence[tuple[str, tuple[int, int] | None]],
                      on_done: Callable[[int, Got | None], None]) -> None:
        sem = asyncio.Semaphore(self.requests)

        async def one(i: int, rel: str, rng: tuple[int, int] | None) -> None:
            async with sem:
                got = await self._get(rel, rng)
            on_done(i, got)
        await _all([one(i, *j) for i, j in enumerate(jobs)])

    async def _get(self, rel: str, rng: tuple[int, int] | None) -> Got | None:
        import obstore
        import obstore.exceptions as oe

        async def once() -> Got | None:
            meta: Any
            try:
                if rng is None:
                    res = await obstore.get_async(self.store, self.key(rel))
                    data, meta = await res.bytes_async(), dict(res.meta)
                else:
                    data, _, _, meta = await self._range_get(rel, rng)
            except FileNotFoundError:
                if rng is None:
                    return None
                raise
            except oe.GenericError as exc:
                if rng is not None and ("416" in str(exc) or "Range Not Satisfiable" in str(exc)):
                    return Got(b"", -1, 0, "")  # the object is shorter now: the caller sees it changed
                raise
            size = int(meta["size"])
            if rng is not None and size < rng[1]:
                return Got(b"", size, _mtime(meta), _etag(meta))  # shorter now: it changed
            want = size if rng is None else rng[1] - rng[0]
            if len(data) != want:
                raise ShortAnswer(f"expected {want} bytes, got {len(data)}")
            self._count(len(data))
            return Got(data, size, _mtime(meta), _etag(meta))
        what = "GET" if rng is None else f"GET bytes {rng[0]}-{rng[1] - 1} of"
        return await self._retry(rel, what, once)

    # -- byte ranges -------------------------------------------------------------------------------
    def read_ranges(self, ranges: Sequence[tuple[str, int, int, memoryview]]) -> None:
        """Fill each ``dest`` with ``length`` bytes of object ``rel`` at ``start``:
        (rel, start, length, dest)."""
        if ranges:
            _LOOP.run(self._read_ranges(ranges))

    async def _read_ranges(self, ranges: Sequence[tuple[str, int, int, memoryview]]) -> None:

        sem = asyncio.Semaphore(self.requests)

        async def one(rel: str, start: int, length: int, dest: memoryview) -> None:
            async def once() -> None:
                data, _, _, _ = await self._range_get(rel, (start, start + length))
                if len(data) != length:
                    raise ShortAnswer(f"expected {length} bytes at offset {start}, got {len(data)}")
                dest[:length] = memoryview(data)
                self._count(length)
            async with sem:
                await self._retry(rel, f"GET bytes {start}-{start + length - 1} of", once)
        await _all([one(*r) for r in ranges])


@dataclass(frozen=True)
class Got:
    """One answer: its bytes (a buffer), the object's size, modification time (ns) and etag."""

    data: Any
    size: int
    mtime: int
    etag: str


def _etag(meta: Any) -> str:
    return str(meta.get("e_tag") or "")


def _mtime(meta: Any) -> int:
    lm = meta.get("last_modified")
    try:
        return int(lm.timestamp() * 1e9) if lm is not None else 0
    except (AttributeError, ValueError, OSError):
        return 0


@dataclass(frozen=True)
class RemoteBlob:
    """A whole chunk already fetched (``data``); ``str()`` is its URL."""

    url: str
    data: bytes

    def __str__(self) -> str:
        return self.url


@dataclass(frozen=True)
class RemoteObject:
    """An object read by byte ranges (a shard); ``str()`` is its URL."""

    source: RemoteSource
    rel: str

    def __str__(self) -> str:
        return self.source.url_of(self.rel)


def source_of(arr: Any) -> RemoteSource | None:
    """The remote source of a zarr array opened over obstore (``zarr.storage.ObjectStore``),
    None for any other store."""
    store = getattr(arr, "store", None)
    try:
        from zarr.storage import ObjectStore
    except ImportError:  # zarr without obstore support
        return None
    if not isinstance(store, ObjectStore):
        return None
    loc = getattr(store, "_gpu_zarr_location", None)
    base = loc.url if loc is not None else repr(store.store)
    path = str(getattr(arr, "path", "") or "")
    requests = loc.requests() if loc is not None else int(os.environ.get("GPU_ZARR_REMOTE_REQUESTS") or 64)
    with _SOURCES_LOCK:  # one source per open store and array: its shard indexes stay known
        per = getattr(store, "_gpu_zarr_sources", None)
        if per is None:
            per = {}
            try:
                setattr(store, "_gpu_zarr_sources", per)  # noqa: B010 - zarr's class has no such field
            except AttributeError:  # a store that takes no attribute: a source per read
                pass
        src = per.get(path)
        if src is None or src.store is not store.store or src.requests != max(1, int(requests)):
            src = per[path] = RemoteSource(store.store, path, base.rstrip("/") + ("/" + path if path else ""),
                                           requests)
    return src


_SOURCES_LOCK = threading.Lock()
