"""Remote stores (http, s3, gs) through obstore: the objects of one array and their requests.

:mod:`gpu_zarr.engine.sources.remote_stream` holds the locate and fetch stages built on it.

Whole objects (unsharded chunks, whole shards; a 404 is None: the fill value) and byte ranges
are fetched with up to ``requests`` in flight, each handed on as it arrives
(:meth:`RemoteSource.stream`); shard indexes by one suffix-range GET each
(:meth:`RemoteSource.get_indexes`). obstore retries 429/5xx, connection errors and timeouts
(:mod:`gpu_zarr.location` configures it); answers that end early are retried here.

Hostile servers: no answer is held beyond what its request needs. Bodies are read as streams
(:mod:`gpu_zarr.engine.sources.remote_body`) and given up past their bound: a whole chunk's
worst case for its codec (:func:`gpu_zarr.engine.bounds.max_encoded_nbytes`; more is a
:class:`~gpu_zarr.errors.CorruptChunkError` naming it), a range's length. Every answer's range
is checked against its request (one that does not match is retried, then raises
:class:`~gpu_zarr.errors.RemoteError`; it is never decoded); each request has a deadline and a
minimum rate (``storage_options["timeout"]``, the ``remote_timeout`` and ``remote_min_rate``
settings), and a read's cancel event (or Ctrl-C) stops the requests in flight. Fetched whole
chunks and shard indexes are kept in a bounded LRU of encoded bytes (``GPU_ZARR_REMOTE_CACHE_MIB``),
so a viewer's next look at a plane sends no request.

What lives across reads -- the event loop of obstore's requests, that byte cache, and one
:class:`RemoteSource` per array (its shard indexes) -- is the runtime's
(:func:`remote_state`): bounded, reported, released by :meth:`Runtime.close
<gpu_zarr.engine.runtime.Runtime.close>`. A :class:`~gpu_zarr.engine.layout.Layout` names its
remote array with a plain :class:`~gpu_zarr.engine.layout.RemoteRef` (:func:`ref_of`);
:func:`remote_source` gives the live source the runtime keeps for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

import gpu_zarr.engine.sources.http as nh
from gpu_zarr import settings
from gpu_zarr.engine.layout import RemoteRef
from gpu_zarr.engine.runtime import Runtime, host_empty
from gpu_zarr.engine.sources.remote_body import Limit, deadline_of, read_body, seconds
from gpu_zarr.errors import CorruptChunkError, NativeHttpDeclined, ReadCancelled, RemoteError, ShortAnswer
from gpu_zarr.location import network_cause
from gpu_zarr.pending import track

if TYPE_CHECKING:
    from gpu_zarr.engine.layout import Layout

__all__ = ["BodyArena", "Bodies", "ByteCache", "Got", "RemoteBlob", "RemoteSource", "RemoteState", "Span",
           "byte_cache", "changed_while_read", "ref_of", "remote_source", "remote_state", "source_of"]

#: what a job GETs: the whole object (None), a byte range (start, end), or its last n bytes ({"suffix": n})
Span = tuple[int, int] | dict[str, int] | None

_ATTEMPTS = 4  # our own retries of answers that ended early (obstore retries the rest)
T = TypeVar("T")


# -- one event loop for the remote requests of a runtime -----------------------------------------
class _Loop:
    """An asyncio loop on a thread of its own (started on first use), where obstore's requests run."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        """Cancel what runs on the loop, stop it and end its thread (the next :meth:`run` starts
        a new one)."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or loop.is_closed():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=5)
        if not loop.is_running():
            loop.close()

    def run(self, coro: Awaitable[T], stop: Callable[[], bool] | None = None) -> T:
        """``coro``'s result, run on the loop's thread. ``stop()`` is asked every ``_TICK_S``:
        true cancels it (its requests in flight with it) and raises ReadCancelled; so does
        Ctrl-C (KeyboardInterrupt, raised on)."""
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, daemon=True, name="gpu-zarr-remote")
                self._thread.start()
                self._loop = loop
            loop = self._loop
        fut: Any = asyncio.run_coroutine_threadsafe(coro, loop)  # type: ignore[arg-type]
        try:
            while True:
                try:
                    return fut.result(timeout=_TICK_S)
                except TimeoutError:
                    if stop is not None and stop():
                        raise ReadCancelled("read cancelled: the requests in flight were stopped") from None
        except BaseException:
            fut.cancel()  # (the requests' tasks are cancelled on the loop; nothing is left writing)
            raise


_TICK_S = 0.1  # how often a waiting read looks at its cancel event


class ByteCache:
    """A bounded LRU of fetched encoded bytes (whole chunks, shard indexes; None: absent),
    keyed by URL: the runtime keeps one (:func:`byte_cache`)."""

    def __init__(self) -> None:
        self._d: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0

    def find(self, keys: Sequence[Any], default: Any) -> list[Any]:
        """What is kept for each of ``keys`` (``default`` where nothing is), under one lock."""
        with self._lock:
            d = self._d
            found = [d.get(k, default) for k in keys]
            for k, v in zip(keys, found):
                if v is not default:
                    d.move_to_end(k)
        return found

    def get(self, key: Any) -> Any:
        """The value kept for ``key`` (None: the object is absent); KeyError when none is kept."""
        with self._lock:
            value = self._d[key]
            self._d.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        size = _held(value)
        limit = int(settings.get("remote_cache_bytes"))
        if size > limit // 4:
            return
        with self._lock:
            if key in self._d:
                return
            self._d[key] = value
            self.nbytes += size
            while self.nbytes > limit and self._d:
                self.nbytes -= _held(self._d.popitem(last=False)[1])

    def drop(self, key: Any) -> None:
        """Forget ``key`` (what it named changed)."""
        with self._lock:
            self.nbytes -= _held(self._d.pop(key, None))

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self.nbytes = 0


def _held(value: Any) -> int:
    """Bytes a kept value holds: its first item's (an object's bytes, an index's); None holds none."""
    return len(value[0]) if value is not None else 0


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
    """One remote zarr array's objects: its obstore ``store`` (None: ``store_of()`` builds it,
    not free, when a request first needs it), the key ``prefix`` of the array in it ("" at the
    store's root), its ``url`` (messages, cache keys), and how many ``requests`` may be in flight.

    ``http``: the native HTTP client (:class:`~gpu_zarr.engine.sources.http.HttpClient`) for an
    ``http(s)`` store or an anonymous ``s3://`` one; None: obstore serves (signed s3, gs, no
    libcurl, a fallback). ``http_url``: where that client finds the objects, an anonymous
    ``s3://`` array's HTTPS address (then any failure is left to obstore, whose messages speak
    S3); default ``url``. ``timeout_s``: the deadline of one request, retries included (default
    the ``remote_timeout`` setting; 0: none); ``min_rate``: the slowest transfer accepted
    (default ``remote_min_rate``). ``state``: the runtime's :func:`remote_state` (the event
    loop obstore's requests run on, the byte cache).
    """

    def __init__(self, store: Any, prefix: str, url: str, requests: int = 64, http: Any = None,
                 http_url: str | None = None, store_of: Callable[[], Any] | None = None,
                 timeout_s: float | None = None, min_rate: int | None = None, *, state: RemoteState) -> None:
        self._state = state
        self.fetched = state.fetched  # the runtime's byte cache (whole chunks and shard indexes fetched, by URL)
        self.timeout_s = float(settings.get("remote_timeout") if timeout_s is None else timeout_s)
        self.min_rate = int(settings.get("remote_min_rate") if min_rate is None else min_rate)
        self._store, self._store_of = store, store_of
        self.http = http  # None once obstore serves this source (from the start, or after a fallback)
        self.http_url = (http_url or url).rstrip("/")
        self.prefix = prefix.strip("/")
        self.url = url.rstrip("/")
        self.requests = max(1, int(requests))
        self.stats: dict[str, float] = {"requests": 0, "bytes": 0}
        self._stats_lock = threading.Lock()
        # shard indexes of this open array: rel -> (index bytes, shard size, mtime ns, etag)
        self._indexes: OrderedDict[str, tuple[Any, int, int, str]] = OrderedDict()
        self._indexes_nbytes = 0
        self.ranges = True  # False once the server said it answers no byte ranges
        self._whole_pending: dict[str, Any] = {}  # rel -> the whole-object GET under way (on the state's loop)

    @property
    def store(self) -> Any:
        """The obstore store (``store``, or built by ``store_of`` on first use: the native
        client's reads never need it)."""
        if self._store is None and self._store_of is not None:
            self._store = self._store_of()
        return self._store

    # -- shard indexes of the open array ---------------------------------------------------------
    def cached_index(self, rel: str) -> tuple[Any, int, int, str] | None:
        """The shard index fetched before for ``rel`` (bytes, shard size, mtime ns, etag), or None."""
        with self._stats_lock:
            got = self._indexes.get(rel)
            if got is not None:
                self._indexes.move_to_end(rel)
            return got

    def keep_index(self, rel: str, raw: Any, size: int, mtime: int, etag: str = "") -> None:
        """Remember a shard's index (bounded by the ``remote_index_bytes`` setting)."""
        limit = int(settings.get("remote_index_bytes"))
        raw = bytes(raw)
        with self._stats_lock:
            self._indexes_nbytes -= _held(self._indexes.pop(rel, None))
            self._indexes[rel] = (raw, int(size), int(mtime), etag)
            self._indexes_nbytes += len(raw)
            while self._indexes_nbytes > limit and len(self._indexes) > 1:
                self._indexes_nbytes -= _held(self._indexes.popitem(last=False)[1])

    def forget_index(self, rel: str) -> None:
        """Drop a shard's index (the shard changed since it was fetched)."""
        with self._stats_lock:
            self._indexes_nbytes -= _held(self._indexes.pop(rel, None))

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def url_of(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def _limit(self, rel: str, nbytes: int, over: Callable[[int], BaseException] | None = None) -> Limit:
        """How much of an answer about ``rel`` may be taken (``nbytes``), and by when."""
        url = self.url_of(rel)
        return Limit(int(nbytes), over or (lambda n: ShortAnswer(f"GET {url}: the answer is longer than the {n} bytes "
                                                                  "asked for")),
                     deadline_of(self.timeout_s), self.min_rate, nh.rate_window(self.timeout_s), url)

    def _too_big(self, rel: str, expected: str = "") -> Callable[[int], BaseException]:
        """The error for an object of ``rel`` bigger than its bound (an encoded chunk's worst
        case; ``expected``: what one holds, in words)."""
        url = self.url_of(rel)
        holds = f" ({expected})" if expected else ""
        return lambda n: CorruptChunkError(
            f"chunk {url} is larger than {n} bytes, the most its codec writes for a chunk of this array{holds}: it is "
            "truncated or corrupt, or the server sends something else. Nothing past that was read; rewrite or delete "
            "it, or check the server.")

    def _count(self, n: int) -> None:
        with self._stats_lock:
            self.stats["requests"] += 1
            self.stats["bytes"] += n

    def _error(self, rel: str, exc: BaseException, what: str) -> RemoteError:
        import obstore.exceptions as oe

        url = self.url_of(rel)
        if isinstance(exc, oe.PermissionDeniedError) or isinstance(exc, oe.UnauthenticatedError):
            hint = _denied("AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or storage_options")
        elif isinstance(exc, FileNotFoundError):
            hint = _MISSING
        else:
            hint = network_cause(url, exc) + _NETWORK
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
    async def _range_get(self, rel: str, rng: Any, cap: int | None) -> tuple[Any, int, int, Any]:
        """(data, start, end, object metadata) of a byte range of ``rel``; ``rng`` is
        ``(start, end)`` or ``{"suffix": n}``. A server that answers no ranges (python's
        ``http.server``, some static hosts) gets one whole-object GET instead (at most ``cap``
        bytes: the object's bound), kept in the byte cache and cut here: slower, never wrong,
        said once in the log. The range answered is checked against the one asked for."""
        import obstore
        import obstore.exceptions as oe

        if self.ranges:
            try:
                res = await obstore.get_async(self.store, self.key(rel), options={"range": rng})
                lo, hi = (int(v) for v in res.range)
                size = int(res.meta["size"])
                # the range answered is the one asked for: a suffix ends at the object's end and
                # is as long as asked (or the whole object), a range starts where asked
                ok = (hi == size and hi - lo == min(size, int(rng["suffix"]))) if isinstance(rng, dict) else \
                    (lo == int(rng[0]) and lo <= hi <= int(rng[1]))
                if not ok:
                    raise ShortAnswer(f"{_what(rng)} {self.url_of(rel)} was answered with bytes {lo}-{hi - 1} of {size}")
                return await read_body(res, self._limit(rel, hi - lo)), lo, hi, dict(res.meta)
            except oe.NotSupportedError:
                if self.ranges:
                    self.ranges = False
                    logging.getLogger("gpu_zarr.remote").warning(
                        "%s answers no byte ranges: whole objects are fetched and cut (slower, above all for "
                        "shards); serve the store with a server that answers Range requests (nginx, S3, ...)",
                        self.url)
        data, meta = await self._whole(rel, cap)
        size = len(data)
        lo, hi = (max(0, size - int(rng["suffix"])), size) if isinstance(rng, dict) else (
            min(int(rng[0]), size), min(int(rng[1]), size))
        return memoryview(data)[lo:hi], lo, hi, meta

    async def _whole(self, rel: str, cap: int | None) -> tuple[bytes, dict[str, Any]]:
        """The whole object (one GET for every range of it asked for at once; kept in the byte
        cache), read only up to ``cap`` bytes (None: the ``_WHOLE_CAP``): the ranges of an
        object bigger than its bound are not taken from a server that answers no ranges."""
        cap = _WHOLE_CAP if cap is None else int(cap)
        url = self.url_of(rel)

        def over(n: int) -> BaseException:
            return RemoteError(f"{self.url} answers no byte ranges, and {url} is larger than {n} bytes, the most an "
                               "object of this array can be: it was not read. Serve the store with a server that "
                               "answers Range requests (nginx, S3, ...), or check that the URL is the store.")

        try:
            got: tuple[bytes, dict[str, Any]] = self.fetched.get((self.url, rel, "whole"))
            return got
        except KeyError:
            pass
        task = self._whole_pending.get(rel)
        if task is None:
            async def fetch() -> tuple[bytes, dict[str, Any]]:
                data, meta = await self._get_whole(rel, cap, over)
                self._count(len(data))
                self.fetched.put((self.url, rel, "whole"), (data, meta))
                return data, meta
            task = self._whole_pending[rel] = track(asyncio.ensure_future(fetch()))  # (shared: may outlive its askers)
            task.add_done_callback(lambda _t: self._whole_pending.pop(rel, None))
        return await asyncio.shield(task)

    async def _get_whole(self, rel: str, most: int, over: Callable[[int], BaseException]) -> tuple[Any, dict[str, Any]]:
        """(body, metadata) of one whole-object GET of ``rel``: ``over(most)`` past ``most`` bytes
        (said before its body is read when the server gives its size), ShortAnswer when it ends early."""
        import obstore

        res = await obstore.get_async(self.store, self.key(rel))
        meta: dict[str, Any] = dict(res.meta)
        if int(meta["size"]) > most:
            raise over(most)
        data = await read_body(res, self._limit(rel, most, over))
        if len(data) != int(meta["size"]):
            raise ShortAnswer(f"expected {int(meta['size'])} bytes, got {len(data)}")
        return data, meta

    # -- shard indexes ---------------------------------------------------------------------------
    def get_indexes(self, rels: Sequence[str], nbytes: int, at_end: bool, cap: int | None = None,
                    stop: Callable[[], bool] | None = None) -> list[tuple[bytes, int, int] | None]:
        """Per shard (index bytes, shard size, mtime ns), None when the shard does not exist.

        One GET each, with a suffix range (index at the end) or a prefix range. ``cap``: the
        most bytes a shard can have (a server that answers no ranges sends it whole);
        ``stop``: as for :meth:`stream`.
        """
        out: list[Any] = [None] * len(rels)
        todo = []
        for i, r in enumerate(rels):
            known = self.cached_index(r)
            if known is not None and len(known[0]) == nbytes:
                out[i] = known[:3]
                continue
            try:
                out[i] = self.fetched.get((self.url, r, "index", nbytes, at_end))
            except KeyError:
                todo.append(i)
        if todo:  # all in one wave: one round trip
            rng: Span = {"suffix": nbytes} if at_end else (0, nbytes)
            found: list[Any] = [None] * len(todo)

            def one(j: int, g: Got | None) -> None:  # None: no such shard; size -1: shorter than its index
                found[j] = None if g is None else (b"", 0, 0, "") if g.size < 0 else (
                    bytes(g.data), g.size, g.mtime, g.etag)
            self.stream([(rels[i], rng) for i in todo], one, cap, stop=stop, missing_ok=True)
            for i, g in zip(todo, found):
                out[i] = g[:3] if g is not None else None
                self.fetched.put((self.url, rels[i], "index", nbytes, at_end), out[i])
                if g is not None and len(g[0]) == nbytes:
                    self.keep_index(rels[i], *g)
        return out

    # -- whole objects and byte ranges, each handed on as it arrives -----------------------------
    def stream(self, jobs: Sequence[tuple[str, Span]],
               on_done: Callable[[int, Got | None], None], cap: int | None = None,
               arena: Bodies | None = None, sink: Any = None, on_sent: Callable[[], None] | None = None,
               parts: Any = None, stop: Callable[[], bool] | None = None, expected: str = "",
               missing_ok: bool = False) -> None:
        """GET every job, up to ``requests`` in flight, and call ``on_done(i, got)`` (on the
        event loop's thread: it must only hand the work on) as each one arrives.

        A job is ``(rel, None)`` for the whole object (``got`` None: it does not exist),
        ``(rel, {"suffix": n})`` for its last n bytes, or ``(rel, (start, end))`` for a byte range
        (an object that is gone, or shorter than the range now, is handed on as a ``Got`` with no
        data and its new size, -1 when gone: the caller sees that it changed; None with
        ``missing_ok``). An answer cut short is retried and never handed on. The first error
        cancels the rest and is raised here.

        ``cap``: the most bytes a whole object may have (the native client needs it for
        whole-object jobs; without it obstore serves them); ``arena``: where the native client's
        answers land (else buffers of their own); ``sink``: where it hands complete whole bodies
        to be decoded as they arrive (a :class:`~gpu_zarr.engine.sources.http.Sink`, one chunk per
        job; those answers come with ``handed`` 1, obstore's never do); ``parts``: pieces of whole
        answers handed to that sink's set as their bytes arrive (a
        :class:`~gpu_zarr.engine.sources.http.Parts`; ``handed`` counts them). ``on_sent()`` runs
        once, on this thread, before any ``on_done``: once the native client's first requests are
        written (the caller's setup then overlaps their round trip), else before obstore's are
        made. ``stop()`` is asked every 0.1 s while the answers travel: true stops the requests
        in flight and raises ReadCancelled. ``expected``: what one whole object holds, in words
        (the message for one past ``cap``).
        """
        if not jobs:
            return
        told = [on_sent is None]

        def sent() -> None:
            if not told[0]:
                told[0] = True
                assert on_sent is not None
                on_sent()
        left = list(range(len(jobs)))
        if self.http is not None and (cap is not None or all(j[1] is not None for j in jobs)):
            left = self._native(list(jobs), on_done, cap, missing_ok=missing_ok, arena=arena, sink=sink, on_sent=sent,
                                parts=parts, stop=stop, expected=expected)
        if left:
            sent()
            sub = [jobs[j] for j in left]
            self._state.loop.run(self._stream(sub, lambda k, got: on_done(left[k], got), cap, expected, missing_ok),
                                 stop)

    async def _stream(self, jobs: Sequence[tuple[str, Span]], on_done: Callable[[int, Got | None], None],
                      cap: int | None, expected: str, missing_ok: bool) -> None:
        sem = asyncio.Semaphore(self.requests)

        async def one(i: int, rel: str, rng: Span) -> None:
            async with sem:
                got = await self._get(rel, rng, cap, expected, missing_ok)
            on_done(i, got)
        await _all([one(i, *j) for i, j in enumerate(jobs)])

    async def _get(self, rel: str, rng: Span, cap: int | None, expected: str, missing_ok: bool) -> Got | None:
        """One job through obstore; a whole object at most ``cap`` bytes (None: ``_WHOLE_CAP``;
        more is a CorruptChunkError naming it, said before its body is read when the server
        gives its size)."""
        import obstore.exceptions as oe

        async def once() -> Got | None:
            meta: Any
            try:
                if rng is None:
                    data, meta = await self._get_whole(rel, _WHOLE_CAP if cap is None else int(cap),
                                                       self._too_big(rel, expected))
                else:
                    data, _, _, meta = await self._range_get(rel, rng, cap)
            except FileNotFoundError:
                # a whole object: missing (the fill value); a range: the shard is gone since its
                # index was read, and the caller sees it changed (``missing_ok``: no such shard)
                return None if rng is None or missing_ok else Got(b"", -1, 0, "")
            except oe.GenericError as exc:
                if rng is not None and ("416" in str(exc) or "Range Not Satisfiable" in str(exc)):
                    return Got(b"", -1, 0, "")  # the object is shorter now: the caller sees it changed
                raise
            size = int(meta["size"])
            if isinstance(rng, tuple) and size < rng[1]:
                return Got(b"", size, _mtime(meta), _etag(meta))  # shorter now: it changed
            # (a dict: its last n bytes)
            want = size if rng is None else min(size, int(rng["suffix"])) if isinstance(rng, dict) else rng[1] - rng[0]
            if len(data) != want:
                raise ShortAnswer(f"expected {want} bytes, got {len(data)}")
            self._count(len(data))
            return Got(data, size, _mtime(meta), _etag(meta))
        return await self._retry(rel, _what(rng), once)

    # -- the native HTTP client (gpu_zarr.engine.sources.http) -----------------------------------
    def _native(self, jobs: list[tuple[str, Any]], on_done: Callable[[int, Got | None], None], cap: int | None, *,
                missing_ok: bool = False, arena: Bodies | None = None, sink: Any = None,
                on_sent: Callable[[], None] | None = None, parts: Any = None,
                stop: Callable[[], bool] | None = None, expected: str = "") -> list[int]:
        """Run ``jobs`` (``(rel, None | (start, end) | {"suffix": n})``) through the native
        client, ``on_done(i, got)`` as each arrives (None: the object does not exist; for ranges
        only with ``missing_ok``). Each body goes into a buffer of its own (``cap`` bytes for
        whole objects; carved from ``arena`` when given). Returns the jobs given back to obstore
        (a server that answers no byte ranges, or a body longer than ``cap``), which serves this
        source from then on."""
        http = self.http
        assert http is not None
        n = len(jobs)
        # (Python lists, not numpy per element: a plane's few requests leave sooner)
        starts, ends, sizes = [0] * n, [-1] * n, [int(cap or 0)] * n  # (whole objects: a plane's chunks)
        for i, (_rel, rng) in enumerate(jobs):
            if isinstance(rng, dict):
                starts[i], ends[i], sizes[i] = -int(rng["suffix"]), 0, int(rng["suffix"])
            elif rng is not None:
                starts[i], ends[i] = int(rng[0]), int(rng[1])
                sizes[i] = ends[i] - starts[i]
        reqs = nh.new_requests(n, starts, ends)
        # where the answers land, made once the requests are written (they travel meanwhile): one
        # lease carved (64-byte aligned; each answer's view made as it is done), else their own buffers
        block: Any = None
        at: list[int] = []
        bufs: list[Any] = []

        def land() -> Any:
            nonlocal block, at
            at = list(itertools.accumulate([(z + 63) // 64 * 64 for z in sizes], initial=0))
            if arena is not None and at[-1] <= arena.limit:
                block = arena.take(at[-1])
                return nh.Carved(block, at, sizes)
            bufs.extend([np.empty(max(z, 1), np.uint8) for z in sizes])
            return bufs
        left: list[int] = []
        why: list[str] = []

        def done(i: int) -> None:
            rel, rng = jobs[i]
            if block is not None:
                buf = block[at[i]:at[i] + sizes[i]]
            else:
                buf, bufs[i] = bufs[i], None  # finished: only the answer's consumer keeps it alive
            try:
                got = self._judge(rel, rng, reqs[i], buf, missing_ok, expected)
            except NativeHttpDeclined as exc:
                left.append(i)
                why.append(str(exc))
                return
            if got is not None:
                self._count(len(got.data))
            on_done(i, got)
        http.fetch([f"{self.http_url}/{r}" for r, _ in jobs], reqs, nh.Landing(sizes, land), self.requests, done,
                   sink=sink, on_sent=on_sent, parts=parts, stop=stop)
        if left:
            self.http = None
            logging.getLogger("gpu_zarr.remote").warning(
                "%s: %s; obstore serves this store from now on instead of the native HTTP client", self.url, why[0])
        return sorted(left)

    def _judge(self, rel: str, rng: Any, r: Any, buf: np.ndarray, missing_ok: bool, expected: str = "") -> Got | None:
        """One finished native request: its answer (``handed``: what the native client handed to
        the fetch's decode set, its row's ``added``), None (missing), or a clear error."""
        st, code = int(r["status"]), int(r["curl"])
        got_n, size = int(r["got"]), int(r["size"])
        mtime = int(r["mtime"]) * 10**9 if int(r["mtime"]) >= 0 else 0
        etag = bytes(r["etag"]).decode(errors="replace")
        if code == 0:
            if rng is None:
                if st == 200 and (size < 0 or got_n == size):
                    return Got(buf[:got_n], got_n, mtime, etag, int(r["added"]))
                if st == 404:
                    return None
            else:
                if st == 404:  # a shard gone since its index was read: the caller sees it changed
                    return None if missing_ok else Got(b"", -1, 0, "")
                if st == 416:
                    return Got(b"", -1, 0, "")  # shorter than the range: the caller sees it changed
                if st == 200:
                    raise NativeHttpDeclined("it answers no byte ranges")
                # (the Content-Range answered is the one asked for: start, end and total)
                lo, hi = int(r["range_start"]), int(r["range_end"])
                if isinstance(rng, dict):
                    want = min(size, int(rng["suffix"]))
                    if st == 206 and size > 0 and got_n == want and lo == size - want and hi == size - 1:
                        return Got(buf[:got_n], size, mtime, etag)
                else:
                    a, b = int(rng[0]), int(rng[1])
                    if st == 206 and lo == a and hi == b - 1 and got_n == b - a and size >= b:
                        return Got(buf[:got_n], size, mtime, etag)
                    if st == 206 and 0 <= size < b:
                        return Got(b"", size, mtime, etag)  # shorter now: it changed
        if st == nh.TOO_LONG and rng is None:  # a whole object past its codec's worst case
            raise self._too_big(rel, expected)(int(r["cap"]))
        if st == nh.TOO_LONG:  # a 200 to a range (a server that answers none): obstore reads it bounded
            raise NativeHttpDeclined("an answer was longer than expected")
        if st == nh.REFUSED:
            raise RemoteError(f"{_what(rng)} {self.url_of(rel)} failed: {bytes(r['err']).decode(errors='replace')}. "
                              "Redirects are followed only to http(s), never from https to http, at most "
                              f"{self.http.redirects if self.http else 5} hops; use the final URL of the store.")
        if st == nh.CHANGED:
            raise changed_while_read(self.url_of(rel), "a retry after a failed transfer brought another version of it "
                                                        "than the part already decoded")
        if self.http_url != self.url:  # an s3:// store: obstore says what went wrong, in S3's terms
            raise NativeHttpDeclined(f"HTTP {st}" if code == 0 else bytes(r["err"]).decode(errors="replace"))
        url, what = self.url_of(rel), _what(rng)
        tries = f" (after {int(r['attempts'])} attempts)" if int(r["attempts"]) > 1 else ""
        if code != 0:
            err = bytes(r["err"]).decode(errors="replace")
            cause = network_cause(url, ConnectionError(err), self.http.stall_s if self.http else None)
            raise RemoteError(f"{what} {url} failed{tries}: {err}. {cause}{_NETWORK}.")
        if st in (401, 403):
            hint = _denied("storage_options 'headers', e.g. an Authorization header")
        elif st == 404:
            hint = _MISSING
        elif st in (206, 200):
            hint = ("the answer ended early or did not match the range asked for, every time: a proxy or server that "
                    "cuts answers short; retry later")
        elif st == 429 or st >= 500:
            hint = "the server is busy or failing; retry later, or lower GPU_ZARR_REMOTE_REQUESTS"
        else:
            hint = "the server refused the request"
        raise RemoteError(f"{what} {url} failed{tries}: HTTP {st}. {hint}.")


class Bodies(Protocol):
    """Where the native client's answers land (else in buffers of their own): ``take(n)`` gives
    a buffer of ``n`` bytes, at most ``limit``; ``lasting``: the answers may outlive the read
    (they go to the byte cache). A :class:`BodyArena` (a big read's, not lasting) or the
    runtime's :class:`~gpu_zarr.engine.runtime.Recycled` (a small read's, lasting)."""

    lasting: bool

    @property
    def limit(self) -> int: ...

    def take(self, nbytes: int) -> np.ndarray: ...


class BodyArena:
    """Where one big read's answers land: buffers leased from a runtime pool (``host_scratch``:
    reused, so already touched; the GPU path's pinned staging pool: the answers are uploaded
    from where they landed) and given back by :meth:`close` -- fresh memory for every
    answer costs more CPU in page faults than the transfer itself. Nothing carved from it may
    outlive the read (it is not put in the byte cache). Bounded by ``limit``: the answers of
    bigger reads get buffers of their own, each freed once decoded, so a huge read never holds
    all its encoded bytes at once.

    ``lease(nbytes)``: a context manager giving ``[buffer]`` (default: ``pool.lease`` of
    ``host_empty`` memory)."""

    lasting = False

    def __init__(self, pool: Any, limit: int,
                 lease: Callable[[int], contextlib.AbstractContextManager[list[np.ndarray]]] | None = None) -> None:
        self._lease = lease or (lambda n: pool.lease(n, 1, host_empty))
        self.limit = int(limit)  # a read whose answers need more gets buffers of their own (freed as decoded)
        self._stack = contextlib.ExitStack()
        self._owners: dict[int, np.ndarray] = {}  # id -> the arrays owning the memory handed out

    def take(self, nbytes: int) -> np.ndarray:
        """A buffer of ``nbytes`` valid until :meth:`close`."""
        (buf,) = self._stack.enter_context(self._lease(max(1, nbytes)))
        owner = buf if buf.base is None or not isinstance(buf.base, np.ndarray) else buf.base
        self._owners[id(owner)] = owner
        return buf

    def holds(self, view: Any) -> bool:
        """``view`` is an array over memory this arena handed out."""
        base = getattr(view, "base", None)
        return isinstance(view, np.ndarray) and base is not None and self._owners.get(id(base)) is base

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> BodyArena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_WHOLE_CAP = 1 << 30  # a whole object with no bound given (every engine read gives one)

_NETWORK = ("check that the server is up and reachable (network, DNS, proxy) and retry; requests in flight can be "
            "lowered with GPU_ZARR_REMOTE_REQUESTS")
_MISSING = "it was not found (404) although the store's index points to it: the store changed while read"


def _denied(credentials: str) -> str:
    return f"the server refused access (403/401): check the URL, and for a private store the credentials ({credentials})"


def changed_while_read(url: str, how: str) -> RemoteError:
    """The error for an object that changed while part of it was being decoded already (its
    inner chunks handed on as its bytes came): not read again, said."""
    return RemoteError(f"{url} changed while it was read ({how}). Nothing was returned; read again once the store "
                       "is no longer being written.")


def _what(rng: Any) -> str:
    """A request in words, for messages: a whole object, a shard index (a suffix), a byte range."""
    if rng is None:
        return "GET"
    if isinstance(rng, dict):
        return "GET (shard index)"
    return f"GET bytes {rng[0]}-{int(rng[1]) - 1} of"


@dataclass(frozen=True)
class Got:
    """One answer: its bytes (a buffer), the object's size, modification time (ns) and etag;
    ``handed``: what of it was handed to the read's native decode set as it arrived (a
    :class:`~gpu_zarr.engine.sources.http.Sink`: 1, the whole body; with
    :class:`~gpu_zarr.engine.sources.http.Parts`: that many of its parts), being decoded already."""

    data: Any
    size: int
    mtime: int
    etag: str
    handed: int = 0


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
    """Bytes of an object already fetched (``data``: the object from its offset ``base`` on,
    a whole chunk or shard when 0); ``str()`` is its URL."""

    url: str
    data: Any
    base: int = 0

    def __str__(self) -> str:
        return self.url


def ref_of(arr: Any) -> RemoteRef | None:
    """The plain description of a zarr array opened over obstore (``zarr.storage.ObjectStore``):
    its URL, key and request settings, for its :class:`~gpu_zarr.engine.layout.Layout`; None
    for any other store."""
    store = getattr(arr, "store", None)
    try:
        from zarr.storage import ObjectStore
    except ImportError:  # zarr without obstore support
        return None
    if not isinstance(store, ObjectStore):
        return None
    loc = getattr(store, "_gpu_zarr_location", None)
    base = (loc.url if loc is not None else repr(store.store)).rstrip("/")
    path = str(getattr(arr, "path", "") or "")
    requests = loc.requests() if loc is not None else int(settings.get("remote_requests"))
    timeout = loc.storage_options.get("timeout") if loc is not None else None
    return RemoteRef(base + ("/" + path if path else ""), path, base, loc, max(1, int(requests)),
                     seconds(timeout) if timeout is not None else None, None if loc is not None else store.store)


class RemoteState:
    """What a runtime keeps for remote reads: the event loop obstore's requests run on, the byte
    cache (:class:`ByteCache`), and one :class:`RemoteSource` per array (URL, key, options and
    request settings: its shard indexes and what the server was found to do stay known),
    the ``MAX_SOURCES`` most recently used."""

    MAX_SOURCES = 256

    def __init__(self) -> None:
        self.loop = _Loop()
        self.fetched = ByteCache()
        self._sources: OrderedDict[Hashable, RemoteSource] = OrderedDict()
        self._lock = threading.Lock()

    def source(self, key: Hashable, make: Callable[[], RemoteSource]) -> RemoteSource:
        """The source kept under ``key``, made by ``make()`` when there is none."""
        with self._lock:
            src = self._sources.pop(key, None)
            if src is None:
                src = make()
            self._sources[key] = src  # the most recent last
            while len(self._sources) > self.MAX_SOURCES:
                self._sources.popitem(last=False)
            return src

    @property
    def nbytes(self) -> int:
        """Bytes held: the byte cache and the sources' shard indexes."""
        with self._lock:
            sources = list(self._sources.values())
        return int(self.fetched.nbytes) + sum(int(s._indexes_nbytes) for s in sources)

    def close(self) -> None:
        """Stop the loop (cancelling what runs on it), forget every source and cached byte."""
        self.loop.close()
        with self._lock:
            self._sources.clear()
        self.fetched.clear()


def remote_state(rt: Runtime) -> RemoteState:
    """The runtime's :class:`RemoteState` (made on first use, released by ``rt.close()``)."""
    return rt.resource("remote", RemoteState, close=lambda s: s.close(), nbytes=lambda s: s.nbytes)


def byte_cache(rt: Runtime) -> ByteCache:
    """The runtime's cache of fetched encoded bytes (whole chunks, shard indexes)."""
    return remote_state(rt).fetched


def remote_source(rt: Runtime, lay: Layout | RemoteRef) -> RemoteSource:
    """The live source the runtime keeps for a remote layout (or its
    :class:`~gpu_zarr.engine.layout.RemoteRef`): one per URL, key, store options and request
    settings."""
    ref = lay if isinstance(lay, RemoteRef) else lay.source
    if ref is None:
        raise ValueError("a local array has no remote source")
    state = remote_state(rt)
    loc = ref.location
    if loc is None:  # a zarr ObjectStore not opened by gpu_zarr: its obstore store, as given (kept
        # alive by the source, so its id names it while the source is kept)
        key: Hashable = ("store", id(ref.store), ref.path, ref.requests, ref.timeout_s)
        store = ref.store
        return state.source(key, lambda: RemoteSource(store, ref.path, ref.url, ref.requests,
                                                      timeout_s=ref.timeout_s, state=state))

    def make() -> RemoteSource:
        http, http_url = None, None
        nat = loc.native_http()
        if nat is not None:  # http(s), or an anonymous s3:// read (plain HTTPS)
            http = nat[0]
            if nat[1] != ref.base:
                http_url = nat[1] + ("/" + ref.path if ref.path else "")
        return RemoteSource(None, ref.path, ref.url, ref.requests, http, http_url,
                            store_of=lambda: loc.object_store(rt), timeout_s=ref.timeout_s, state=state)
    return state.source(("location", loc.key(), ref.path, ref.requests, ref.timeout_s), make)


def source_of(arr: Any, rt: Runtime) -> RemoteSource | None:
    """The live source ``rt`` keeps for a zarr array opened over obstore, None for any other store."""
    ref = ref_of(arr)
    return None if ref is None else remote_source(rt, ref)
