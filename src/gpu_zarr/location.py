"""One way to name a store: a local path, ``file://``, ``http(s)://``, ``s3://`` or ``gs://``.

:func:`resolve` turns what a user passes (a path, a URL, a :class:`Location`, and optional
``storage_options``) into a :class:`Location`: whether it is remote, a name to show, the
read-only zarr store zarr-python opens (``zarr.storage.ObjectStore`` over obstore for remote
stores), and the obstore store the engine's remote fetch uses (:mod:`gpu_zarr.engine.sources.remote`).

Remote stores go through obstore (Rust ``object_store``: ranged, concurrent, retried with
backoff): install it with ``pip install "napari-gpu-zarr[remote]"``.

S3 configuration comes from the standard AWS environment (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL``) and from ``storage_options`` (s3fs's names: ``anon``, ``key``,
``secret``, ``token``, ``endpoint_url``, ``region``, ``client_kwargs``; or obstore's own
``S3Config`` keys). Without credentials requests are anonymous (unsigned). GCS takes obstore's
``GCSConfig`` keys (and ``anon`` / ``token="anon"`` for public buckets). HTTP(S) takes
``headers``. Our own keys, for every scheme: ``requests`` (in flight, default 64),
``timeout`` and ``connect_timeout`` (seconds), ``max_retries``, ``retry_timeout``.

Options travel explicitly: every public function that names a store takes
``storage_options``, and what it opens below the store (an image's levels and labels, a plate's
wells) gets the same options; nothing is remembered between calls. Options are never shown in
reprs or messages (they may hold credentials). Nothing here writes: every store is opened
read-only.

What is kept across opens -- the obstore stores made (:func:`object_stores`) and the remote
metadata documents fetched (:func:`metadata_cache`) -- belongs to a
:class:`~gpu_zarr.engine.runtime.Runtime`, given explicitly (user-facing calls default to
the process's :func:`~gpu_zarr.engine.runtime.get_runtime`); the zarr store made here keeps the
runtime it was made with.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from gpu_zarr import ome_children
from gpu_zarr.errors import RemoteError, RemoteUnavailable, install_hint
from gpu_zarr.pending import track

if TYPE_CHECKING:
    from gpu_zarr.engine.runtime import Runtime

__all__ = ["METADATA_NAMES", "REMOTE_HINT", "REMOTE_SCHEMES", "Location", "RemoteError", "RemoteUnavailable",
           "clear_metadata_cache", "is_url", "metadata_cache", "network_cause", "object_stores", "path_and_options",
           "public_http_url", "resolve"]

REMOTE_SCHEMES = ("http", "https", "s3", "s3a", "gs", "gcs")
REMOTE_HINT = install_hint("remote")

# our own options (not passed to the store): requests in flight, timeouts, retries
_OWN = ("requests", "timeout", "connect_timeout", "max_retries", "retry_timeout", "headers")


def network_cause(url: str, exc: BaseException, timeout: Any = None) -> str:
    """What a network failure was, in words, from the client's detailed message ("" when
    unknown): DNS, a timeout (``timeout``: the request timeout in force) or a refused connection."""
    from urllib.parse import urlsplit

    text = str(exc)
    if "dns error" in text or "failed to lookup address" in text or "resolve host" in text:
        return f"the host name {urlsplit(url).hostname!r} could not be resolved (DNS). "
    if "kind: Timeout" in text or "TimedOut" in text or "timed out" in text.lower() or "too slow" in text:
        limit = f"{timeout} s per request" if timeout is not None else "the request timeout"
        return (f"the server did not answer in time ({limit}: storage_options 'timeout'; retries: "
                "'max_retries', 'retry_timeout'). ")
    if "Connection refused" in text or "ConnectionRefused" in text or "Couldn't connect to server" in text:
        return "the connection was refused (nothing listens at that address). "
    return ""


def is_url(path: Any) -> bool:
    """True for ``scheme://...`` strings (and :class:`Location` objects that are remote)."""
    if isinstance(path, Location):
        return path.is_remote
    return isinstance(path, str) and "://" in path


@dataclass(frozen=True)
class Location:
    """Where a zarr node is.

    Attributes
    ----------
    url : str
        A local path (``file://`` removed) or a URL without a trailing slash.
    scheme : str
        "file", "http", "https", "s3" or "gs".
    storage_options : mapping
        Options of the remote store (see the module docstring); empty for local paths. Not
        part of the repr (it may hold credentials).
    """

    url: str
    scheme: str
    storage_options: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def is_remote(self) -> bool:
        return self.scheme != "file"

    @property
    def name(self) -> str:
        """Last path component (the display name a viewer shows)."""
        return self.url.rstrip("/").rsplit("/", 1)[-1] or self.url

    def __str__(self) -> str:
        return self.url

    def __fspath__(self) -> str:
        if self.is_remote:
            raise TypeError(f"{self.url} is a remote store, not a local path")
        return self.url

    def join(self, sub: str) -> Location:
        """The location ``sub`` below this one, with the same options."""
        if not sub:
            return self
        if not self.is_remote:
            return Location(os.path.join(self.url, sub), "file")
        return Location(self.url.rstrip("/") + "/" + sub.strip("/"), self.scheme, self.storage_options)

    def key(self) -> tuple[Any, ...]:
        """What names this store in caches: its URL, its options and, for ``s3://``, the AWS
        environment it is signed with."""
        return (self.url, _freeze(self.storage_options), _env_key(self.scheme))

    def requests(self) -> int:
        """Requests in flight for the engine's fetch (``storage_options["requests"]``, else
        the ``remote_requests`` setting)."""
        from gpu_zarr import settings

        v = self.storage_options.get("requests") or settings.get("remote_requests")
        return max(1, int(v))

    def native_http(self) -> tuple[Any, str] | None:
        """``(client, HTTP base URL)`` when the native HTTP client
        (:mod:`gpu_zarr.engine.sources.http`) can serve this location: ``http(s)://``, or an
        ``s3://`` one read anonymously (plain HTTPS); None where obstore serves (signed s3,
        gs, a URL with a query, the client off or missing)."""
        if not self.is_remote or "?" in self.url:
            return None
        from gpu_zarr.engine.sources.http import client_for

        if self.scheme in ("http", "https"):
            client = client_for(self.scheme, self.storage_options)
            return None if client is None else (client, self.url)
        public = public_http_url(self)
        if public is None:
            return None
        client = client_for("https", self.storage_options)
        return None if client is None else (client, public)

    def object_store(self, runtime: Runtime | None = None) -> Any:
        """The obstore store for this location (kept per URL and options by ``runtime``'s
        :func:`object_stores`; default: the process's runtime)."""
        if not self.is_remote:
            raise ValueError(f"{self.url} is a local path, not a remote store")
        return object_stores(_runtime(runtime)).get(self)

    def zarr_store(self, runtime: Runtime | None = None) -> Any:
        """What ``zarr.open(..., mode="r")`` opens: the path itself when local, a read-only
        ``zarr.storage.ObjectStore`` when remote, which keeps ``runtime`` (default: the
        process's) for its metadata cache and obstore store."""
        if not self.is_remote:
            return self.url
        _obstore()  # a missing obstore is RemoteUnavailable, with the install
        rt = _runtime(runtime)
        if self.native_http() is not None:  # the native client serves it: obstore's store when needed
            _client_and_retry(self.storage_options, self.scheme == "http")  # a bad option fails here
            metadata_cache(rt).early(self)
            return _retrying_store_class()(location=self, runtime=rt)
        return _retrying_store_class()(self.object_store(rt), location=self, runtime=rt)


def _runtime(runtime: Runtime | None) -> Runtime:
    """``runtime``, or the process's (user-facing calls default to it)."""
    if runtime is not None:
        return runtime
    from gpu_zarr.engine.runtime import get_runtime

    return get_runtime()


class _Stores:
    """obstore stores made, per URL, options and environment (building one costs 4-7 ms: TLS
    roots), the ``MAX`` most recently used."""

    MAX = 64  # stores of distinct URLs and options kept (a notebook that opens many stays bounded)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: dict[Any, Any] = {}  # key -> obstore store, least recently used first

    def __len__(self) -> int:
        return len(self._stores)

    def get(self, loc: Location) -> Any:
        key = loc.key()
        with self._lock:
            store = self._stores.pop(key, None)
            if store is None:
                store = _make_store(loc)
            self._stores[key] = store  # the most recent last
            while len(self._stores) > self.MAX:  # bounded: the least recently used goes first
                self._stores.pop(next(iter(self._stores)))
            return store

    def clear(self) -> None:
        with self._lock:
            self._stores.clear()


def object_stores(runtime: Runtime) -> _Stores:
    """The obstore stores ``runtime`` keeps (made on first use, released by its ``close()``)."""
    return runtime.resource("object-stores", _Stores, close=lambda s: s.clear())


@functools.cache  # (a class made once, on first use: zarr is imported then, not with this module)
def _retrying_store_class() -> Any:
    """``zarr.storage.ObjectStore``, read-only, whose GETs are retried when an answer ends early
    (obstore retries 5xx, resets and timeouts itself, not a body cut short)."""
    import asyncio

    import obstore.exceptions as oe
    from zarr.abc.store import Store
    from zarr.storage import ObjectStore

    class ReadOnlyObjectStore(ObjectStore):
        """With ``location``, its obstore store is built on first use (TLS roots cost ms; reads the native
        client serves never need it); ``runtime`` (default: the process's) keeps documents and stores."""

        def __init__(self, store: Any = None, *, read_only: bool = True, location: Location | None = None,
                     runtime: Runtime | None = None) -> None:
            if store is not None:
                super().__init__(store, read_only=True)
            elif location is not None:
                Store.__init__(self, read_only=True)  # ObjectStore's own only checks and keeps `store`
            else:
                raise ValueError("an obstore store or a location is needed")
            self._gpu_zarr_location = location  # the engine's remote source names this URL
            self._gpu_zarr_runtime = _runtime(runtime)

        @property
        def store(self) -> Any:
            d = self.__dict__
            if d.get("_obstore") is None:  # (unpickled: zarr's __setstate__ put it under "store")
                loc = d.get("_gpu_zarr_location")
                d["_obstore"] = d.get("store") or (loc.object_store(self._rt()) if loc is not None else None)
            return d["_obstore"]

        @store.setter
        def store(self, value: Any) -> None:
            self.__dict__["_obstore"] = value

        def _rt(self) -> Runtime:
            rt = self.__dict__.get("_gpu_zarr_runtime")
            if rt is None:  # (unpickled: the runtime of this process)
                rt = self.__dict__["_gpu_zarr_runtime"] = _runtime(None)
            return rt

        def __eq__(self, other: object) -> bool:
            if not isinstance(other, ReadOnlyObjectStore):
                return False
            mine, theirs = self._gpu_zarr_location, other._gpu_zarr_location
            if mine is None or theirs is None:
                return bool(self.store == other.store)
            return (mine.url, _freeze(mine.storage_options)) == (theirs.url, _freeze(theirs.storage_options))

        __hash__ = None  # type: ignore[assignment]

        def __str__(self) -> str:
            return f"object_store://{self._gpu_zarr_location.url if self._gpu_zarr_location else self.store}"

        def with_read_only(self, read_only: bool = False) -> Any:
            return type(self)(self.__dict__.get("_obstore"), location=self._gpu_zarr_location, runtime=self._rt())

        async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
            node, _, name = key.rpartition("/")
            if byte_range is None and name in METADATA_NAMES and self._gpu_zarr_location is not None:
                raw = await metadata_cache(self._rt()).get(self, self._gpu_zarr_location, node, name)
                return None if raw is None else prototype.buffer.from_bytes(raw)
            return await self.get_retried(key, prototype, byte_range)

        async def get_document(self, key: str) -> bytes | None:
            """A metadata document (None: absent), read as a stream and refused past the
            ``metadata_bytes`` setting: a server's 400 MiB answer is never held."""
            return await _get_document(self.store, self._gpu_zarr_location, key)

        async def get_retried(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
            for attempt in range(4):
                try:
                    return await super().get(key, prototype, byte_range)
                except oe.GenericError:
                    if attempt == 3:
                        raise
                    await asyncio.sleep(0.05 * 2 ** attempt)

    return ReadOnlyObjectStore


async def _get_document(store: Any, loc: Location | None, key: str) -> bytes | None:
    """Document ``key`` of the obstore ``store`` (at ``loc``) read as a stream, at most
    ``metadata_bytes`` of it; None when it is absent; obstore's generic errors retried."""
    import asyncio

    import obstore
    import obstore.exceptions as oe

    from gpu_zarr import settings
    from gpu_zarr.engine.sources.remote_body import Limit, deadline_of, read_body, seconds

    url = f"{loc.url.rstrip('/')}/{key}" if loc is not None else key
    most = int(settings.get("metadata_bytes"))
    timeout = seconds((loc.storage_options if loc is not None else {}).get("timeout", settings.get("remote_timeout")))

    def over(n: int) -> BaseException:
        return RemoteError(f"the metadata document {url} is larger than {n / (1 << 20):g} MiB, the most read "
                           "(setting metadata_bytes): it was not read. If the store really has such a document "
                           "(a big plate's consolidated .zmetadata), raise the limit: GPU_ZARR_METADATA_MIB=64, "
                           "or gpu_zarr.settings.set(metadata_bytes=64 << 20).")
    for attempt in range(4):
        try:
            res = await obstore.get_async(store, key)
            if int(res.meta["size"]) > most:  # (said before its body is read)
                raise over(most)
            lim = Limit(most, over, deadline_of(timeout), int(settings.get("remote_min_rate")),
                        max(1.0, min(10.0, timeout / 2)) if timeout > 0 else 10.0, url)
            return await read_body(res, lim)
        except FileNotFoundError:
            return None
        except oe.GenericError:
            if attempt == 3:
                raise
            await asyncio.sleep(0.05 * 2 ** attempt)
    raise AssertionError("unreachable")


#: the documents zarr-python looks for when it opens a node (v3, then v2 and consolidated)
METADATA_NAMES = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")


class _MetadataCache:
    """A remote node's metadata documents, fetched together and reused for ``metadata_ttl`` s.

    zarr-python opens a node by asking for zarr.json, .zarray, .zattrs and then .zgroup and
    .zmetadata, in two round trips, and a viewer opening an OME-Zarr opens the root, each
    level and the labels several times over: ~28 round trips before the first plane. Here
    the first request for any of a node's documents fetches all five at once (one round
    trip; absent ones are remembered as absent), and later opens of that node within the
    TTL cost none. Keyed by the node's URL and the store's options; bounded.

    Where the native HTTP client serves the location (:meth:`Location.native_http`), the
    documents come through it: one native call for the node, one for the OME children it names
    (on warm connections, which the chunks' requests reuse). What it does not answer (a failure,
    a document over its cap) is asked of obstore, which retries and explains. :meth:`early`
    sends the root's requests before the obstore store is built (building one costs 4-7 ms).
    """

    MAX_NODES = 4096
    PREFETCH = 256  # nodes asked for ahead of the reader, from one node it asked for (cascading)
    CHILD_CAP = 256 << 10  # the most bytes of a child's document the native client takes (bigger: obstore's,
    # up to the metadata_bytes setting, as a root's)
    EARLY_S = 10.0  # an early fetch nobody asked for within this long is not used
    MAX_EARLY = 1024  # early fetches kept at most (nodes asked for ahead that nobody opened)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._docs: dict[tuple[Any, str], tuple[float, dict[str, bytes | None]]] = {}
        # key -> {loop: the fetch under way there} (by key first: "is it under way anywhere" is
        # asked per child of a node, hundreds for a plate, and was a scan of every pending fetch)
        self._pending: dict[tuple[Any, str], dict[int, Any]] = {}
        self._early: dict[tuple[Any, str], tuple[float, Any, tuple[str, ...]]] = {}  # key: (started, future, names)
        self._pool: Any = None
        self._pool_lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._docs.clear()
            self._early.clear()

    def close(self) -> None:
        """Forget everything and end the native fetches' threads."""
        self.clear()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(len(d or b"") for _, docs in self._docs.values() for d in docs.values())

    @staticmethod
    def _key(loc: Location, node: str) -> tuple[Any, str]:
        return ((loc.scheme, _freeze(loc.storage_options), _env_key(loc.scheme)),
                loc.url.rstrip("/") + ("/" + node if node else ""))

    def _fresh(self, key: tuple[Any, str]) -> dict[str, bytes | None] | None:
        """The documents kept for ``key`` while younger than the TTL (under the lock)."""
        import time

        from gpu_zarr import settings

        hit = self._docs.get(key)
        ttl = float(settings.get("metadata_ttl"))
        return hit[1] if ttl > 0 and hit is not None and time.monotonic() - hit[0] <= ttl else None

    def _executor(self) -> Any:
        from concurrent.futures import ThreadPoolExecutor

        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(4, thread_name_prefix="gpu-zarr-metadata")
            return self._pool

    def early(self, loc: Location) -> None:
        """Send the requests for the documents of ``loc``'s root node now, through the native
        HTTP client (nothing where it does not serve ``loc``, or obstore is missing)."""
        import importlib.util
        import time

        nat = loc.native_http()
        if nat is None or importlib.util.find_spec("obstore") is None:
            return
        key = self._key(loc, "")
        with self._lock:
            if self._under_way(key):
                return  # kept, or already asked for (an OME reader's prefetch of this node)
            self._forget_early(time.monotonic())
            sending = threading.Event()
            (fut,) = self._submit(nat, [""], METADATA_NAMES, _root_cap(), sending, (loc, [self.PREFETCH]))
            self._early[key] = (time.monotonic(), fut, METADATA_NAMES)
        # until the requests are out: what comes next (building obstore's store) holds the GIL
        sending.wait(0.05)

    def _forget_early(self, now: float) -> None:
        """Early fetches nobody asked for in time (the open failed, a guess was wrong), and the
        oldest beyond the bound, forgotten (under the lock)."""
        for k in [k for k, e in self._early.items() if now - e[0] > self.EARLY_S]:
            del self._early[k]
        while len(self._early) >= self.MAX_EARLY:
            self._early.pop(next(iter(self._early)))

    def _submit(self, nat: tuple[Any, str], nodes: list[str], names: tuple[str, ...], cap: int,
                sending: threading.Event | None = None, ahead: tuple[Location, list[int]] | None = None) -> list[Any]:
        """Per node a future of its documents, fetched by one native call on the pool; with
        ``ahead`` (the location and the budget of nodes its cascade may still ask for) each
        node's OME children are asked for as soon as its documents are in (:meth:`_ahead`)."""
        from concurrent.futures import Future

        futs: list[Any] = [Future() for _ in nodes]
        then = None if ahead is None else functools.partial(self._ahead, *ahead)
        self._executor().submit(self._native, nat, nodes, names, cap, futs, sending, then)
        return futs

    def _ahead(self, loc: Location, budget: list[int], node: str, got: list[Any]) -> None:
        """On the native client's thread, as ``node``'s documents settle it: send the requests
        for the OME children its attributes name (what :meth:`_fetch` asks for next) now, one
        native call for all, kept as early fetches that :meth:`_send` hands out. Saves the hop
        to zarr-python's event loop and back (~2-3 ms a level of the hierarchy)."""
        import time

        docs = dict(zip(METADATA_NAMES, got))
        if not isinstance(docs.get("zarr.json"), bytes) and not isinstance(docs.get(".zattrs"), bytes):
            return
        children, names = self._children(loc, node, docs)
        nat = loc.native_http()
        if nat is None or not children:
            return
        with self._lock:
            keys = [(c, self._key(loc, c)) for c in children]
            new = [(c, k) for c, k in keys if not self._under_way(k)][:max(0, budget[0])]
            self._forget_early(time.monotonic())
            if not new or len(self._early) + len(new) > self.MAX_EARLY:
                return
            budget[0] -= len(new)
            futs = self._submit(nat, [c for c, _ in new], names, self.CHILD_CAP, None, (loc, budget))
            now = time.monotonic()
            for (_, k), fut in zip(new, futs):
                self._early[k] = (now, fut, names)

    @staticmethod
    def _native(nat: tuple[Any, str], nodes: list[str], names: tuple[str, ...], cap: int, futs: list[Any],
                sending: threading.Event | None = None, then: Callable[[str, list[Any]], None] | None = None) -> None:
        """Fetch the documents ``names`` of ``nodes`` through the native client; ``futs[k]``
        gets node k's (bytes, None or UNANSWERED, in ``METADATA_NAMES`` order; None for those
        not asked) as soon as they settle the node: its zarr.json is there (zarr-python then
        reads no v2 document of it: they count as absent), or all asked for are in. ``then``
        is called with the node and its documents just before (never raising)."""
        from gpu_zarr.engine.sources.http import UNANSWERED

        client, base = nat
        asked = [METADATA_NAMES.index(m) for m in METADATA_NAMES if m in names]
        v3 = METADATA_NAMES.index("zarr.json")
        urls = [f"{base}/{node}/{METADATA_NAMES[m]}" if node else f"{base}/{METADATA_NAMES[m]}" for node in nodes
                for m in asked]
        wait = object()
        got = [[wait if j in asked else None for j in range(len(METADATA_NAMES))] for _ in nodes]

        def each(i: int, value: Any) -> None:
            k, a = divmod(i, len(asked))
            m = asked[a]
            got[k][m] = value
            if futs[k].done():
                return
            docs: list[Any]
            if m == v3 and isinstance(value, bytes):
                docs = [value if j == v3 else None for j in range(len(METADATA_NAMES))]
            elif all(v is not wait for v in got[k]):
                docs = list(got[k])
            else:
                return
            if then is not None:
                try:  # (before the reader hears of the node: it would ask for the children itself)
                    then(nodes[k], docs)
                except Exception:  # noqa: BLE001 - only a head start: the reader asks as before
                    pass
            futs[k].set_result(docs)
        try:
            client.get_small(urls, cap, sending=sending, on_each=each)
        except Exception:  # noqa: BLE001 - obstore asks again, and says what went wrong
            pass
        finally:
            if sending is not None:
                sending.set()
            for k, f in enumerate(futs):
                if not f.done():
                    f.set_result([UNANSWERED if v is wait else v for v in got[k]])

    def _send(self, loc: Location, nodes: list[str], names: tuple[str, ...], cap: int) -> list[Any]:
        """Per node a future of its documents from the native client (one call for all), or
        None each where it does not serve ``loc``. Called under the lock."""
        import time

        nat = loc.native_http()
        if nat is None:
            return [None] * len(nodes)
        out: list[Any] = [None] * len(nodes)
        now, rest = time.monotonic(), []
        for i, node in enumerate(nodes):
            early = self._early.pop(self._key(loc, node), None)  # (the caller holds the lock)
            if early is not None and now - early[0] <= self.EARLY_S and set(names) <= set(early[2]):
                out[i] = early[1]
            else:
                rest.append(i)
        if rest:
            ahead = (loc, [self.PREFETCH])
            for i, fut in zip(rest, self._submit(nat, [nodes[i] for i in rest], names, cap, None, ahead)):
                out[i] = fut
        return out

    async def get(self, store: Any, loc: Location, node: str, name: str) -> bytes | None:
        import asyncio

        got = self._start(store, loc, [node], [self.PREFETCH])[0]
        docs = got if isinstance(got, dict) else await asyncio.shield(got)
        return docs[name]

    async def _fetch(self, store: Any, loc: Location, node: str, fut: Any, budget: list[int],
                     names: tuple[str, ...]) -> dict[str, bytes | None]:
        """``node``'s documents: the native client's (``fut``), obstore's for what it did not answer."""
        import asyncio

        from gpu_zarr.engine.sources.http import UNANSWERED

        got: list[Any] = [UNANSWERED if m in names else None for m in METADATA_NAMES]
        if fut is not None:
            got = list(await asyncio.wrap_future(fut))
        ask = [i for i, g in enumerate(got) if g is UNANSWERED]
        if ask:
            keys = [f"{node}/{m}" if node else m for m in METADATA_NAMES]
            res = await asyncio.gather(*(store.get_document(keys[i]) for i in ask), return_exceptions=True)
            for i, g in zip(ask, res):
                if isinstance(g, BaseException):
                    raise g
                got[i] = g
        docs = dict(zip(METADATA_NAMES, got))
        # the nodes an OME-Zarr reader opens next (levels, labels, wells, fields): asked for now,
        # together, so that they are one more round trip rather than one each; only the
        # documents of this node's format (a zarr hierarchy is all v2 or all v3)
        children, names = self._children(loc, node, docs)
        children = children[:max(0, budget[0])]  # a big plate: the rest when the reader asks
        budget[0] -= len(children)
        if children:
            self._start(store, loc, children, budget, names, self.CHILD_CAP)
        return docs

    def _children(self, loc: Location, node: str, docs: Mapping[str, Any]) -> tuple[list[str], tuple[str, ...]]:
        """The nodes an OME-Zarr reader opens after ``node`` (levels, labels, wells, fields, the
        label images' guessed levels), as paths from the root, and the documents to ask of each:
        only those of ``node``'s format (a zarr hierarchy is all v2 or all v3)."""
        children = [f"{node}/{c}" if node else c
                    for c in ome_children.children(docs) + self._label_levels_guessed(loc, node, docs)]
        return children, _V3_NAMES if isinstance(docs.get("zarr.json"), bytes) else _V2_NAMES

    def _under_way(self, key: tuple[Any, str]) -> bool:
        """``key``'s documents are kept, or asked for already (under the lock)."""
        return self._fresh(key) is not None or key in self._early or key in self._pending

    def _label_levels_guessed(self, loc: Location, node: str, docs: Mapping[str, bytes | None]) -> list[str]:
        """For an image's ``labels`` group: each label image's levels, guessed to have the
        paths of the image's own levels (the writers' habit: ome-zarr-py, bioformats2raw),
        asked for beside the label images. Else they would be one more round trip, after each
        label image's attributes name them; a wrong guess costs a request nobody waits for."""
        image_node = ome_children.image_of_labels(node)
        if image_node is None:
            return []
        with self._lock:
            image = self._fresh(self._key(loc, image_node))
        return ome_children.label_levels_guessed(docs, image)

    def _start(self, store: Any, loc: Location, nodes: list[str], budget: list[int],
               names: tuple[str, ...] = METADATA_NAMES, cap: int | None = None) -> list[Any]:
        """Per node its documents (kept) or the task fetching them on this loop; the nodes
        neither kept nor under way are asked for together (one native call), each then
        settled by a task of its own."""
        import asyncio

        loop = asyncio.get_running_loop()
        cap = _root_cap() if cap is None else cap
        out: list[Any] = []
        new: list[tuple[int, str, tuple[Any, str]]] = []
        with self._lock:
            for node in nodes:
                key = self._key(loc, node)
                hit = self._fresh(key)
                task = hit if hit is not None else self._pending.get(key, {}).get(id(loop))
                if task is None:
                    new.append((len(out), node, key))
                out.append(task)
            if not new:
                return out
            futs = self._send(loc, [node for _, node, _ in new], names, cap)
            for (i, node, key), fut in zip(new, futs):
                task = track(loop.create_task(self._fetch(store, loc, node, fut, budget, names)))  # (ahead of a reader)
                self._pending.setdefault(key, {})[id(loop)] = task
                task.add_done_callback(functools.partial(self._done, key, id(loop)))
                out[i] = task
        return out

    def _done(self, key: tuple[Any, str], loop_id: int, task: Any) -> None:
        import time

        with self._lock:
            tasks = self._pending.get(key)
            if tasks is not None and tasks.get(loop_id) is task:
                del tasks[loop_id]
                if not tasks:
                    del self._pending[key]
            if not task.cancelled() and task.exception() is None:  # kept; used while younger than the TTL
                self._docs[key] = (time.monotonic(), task.result())
                while len(self._docs) > self.MAX_NODES:
                    self._docs.pop(next(iter(self._docs)))


def _root_cap() -> int:
    """The most bytes of a node's document the native client takes (the ``metadata_bytes``
    setting; a longer one is asked of obstore, which refuses it past the same bound, saying so)."""
    from gpu_zarr import settings

    return int(settings.get("metadata_bytes"))


_V3_NAMES = ("zarr.json",)
_V2_NAMES = (".zarray", ".zattrs", ".zgroup")  # (consolidated .zmetadata: at the root a reader opens)


def metadata_cache(runtime: Runtime) -> _MetadataCache:
    """The remote metadata documents ``runtime`` keeps (made on first use, released by its
    ``close()``)."""
    return runtime.resource("metadata-cache", _MetadataCache, close=lambda c: c.close(), nbytes=lambda c: c.nbytes)


def clear_metadata_cache(runtime: Runtime | None = None) -> None:
    """Forget the remote metadata documents kept for ``metadata_ttl`` (a store was rewritten) by
    ``runtime`` (default: the process's)."""
    metadata_cache(_runtime(runtime)).clear()


def _freeze(v: Any) -> Any:
    if isinstance(v, Mapping):
        return tuple(sorted((str(k), _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


def _env_key(scheme: str) -> tuple[Any, ...]:
    if scheme not in ("s3", "s3a"):
        return ()
    return tuple(os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                             "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
                                             "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"))


def resolve(path: Any, storage_options: Mapping[str, Any] | None = None) -> Location:
    """The :class:`Location` of what a user passed.

    Parameters
    ----------
    path : str, os.PathLike or Location
        A local path, ``file://``, ``http(s)://``, ``s3://`` or ``gs://`` URL.
    storage_options : mapping, optional
        Options of a remote store (see the module docstring); for a :class:`Location` they
        are added to its own.

    Raises
    ------
    ValueError
        An unknown URL scheme, or storage_options for a local path.
    """
    if isinstance(path, Location):
        if storage_options:
            if not path.is_remote:
                raise ValueError(f"storage_options are for remote stores; {path.url} is a local path")
            path = Location(path.url, path.scheme, {**path.storage_options, **storage_options})
        return path
    p = os.fspath(path)
    if "://" not in p:
        if storage_options:
            raise ValueError(f"storage_options are for remote stores; {p} is a local path")
        return Location(p, "file")
    parts = urlsplit(p)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if storage_options:
            raise ValueError(f"storage_options are for remote stores; {p} is a local path")
        return Location(unquote(parts.path), "file")
    if scheme not in REMOTE_SCHEMES:
        raise ValueError(f"expected a local path or a URL with a scheme in {('file',) + REMOTE_SCHEMES}, "
                         f"got {p!r}")
    scheme = {"s3a": "s3", "gcs": "gs"}.get(scheme, scheme)
    url = scheme + p[len(parts.scheme):].rstrip("/")
    return Location(url, scheme, dict(storage_options or {}))


def path_and_options(path: Any, storage_options: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """``(path as a string, storage options)`` of what a user passed: a :class:`Location`
    gives its URL and its options (``storage_options`` added); anything else ``os.fspath``.

    Raises
    ------
    ValueError
        storage_options for a local path.
    """
    if isinstance(path, Location):
        loc = resolve(path, storage_options)
        return loc.url, dict(loc.storage_options)
    p = os.fspath(path)
    if storage_options and "://" not in p:
        raise ValueError(f"storage_options are for remote stores; {p} is a local path")
    return p, dict(storage_options or {})


def _obstore() -> Any:
    try:
        import obstore.store
    except ImportError as exc:
        raise RemoteUnavailable(f"reading remote stores (http, s3, gs) needs obstore, which is not installed: "
                                f"{REMOTE_HINT}") from exc
    return obstore.store


def _seconds(v: Any) -> timedelta:
    """A timeout (a number of seconds or a ``timedelta``) as obstore takes it."""
    from gpu_zarr.engine.sources.remote_body import seconds

    return timedelta(seconds=seconds(v))


def _client_and_retry(opts: Mapping[str, Any], allow_http: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    from gpu_zarr import settings

    # (no deadline, 0, is a day for obstore, whose client needs one)
    timeout = _seconds(opts.get("timeout", settings.get("remote_timeout"))).total_seconds() or 86400.0
    client: dict[str, Any] = {"timeout": _seconds(timeout),
                              "connect_timeout": _seconds(opts.get("connect_timeout", 10)),
                              "pool_max_idle_per_host": "256"}
    if allow_http:
        client["allow_http"] = True
    if opts.get("headers"):
        client["default_headers"] = dict(opts["headers"])
    retry = {"max_retries": int(opts.get("max_retries", 8)),
             "retry_timeout": _seconds(opts.get("retry_timeout", 120)),
             "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=5),
                         "base": 2}}
    return client, retry


def _s3_config(opts: Mapping[str, Any]) -> dict[str, Any]:
    """obstore S3Config from s3fs-style (or obstore-style) storage_options."""
    cfg: dict[str, Any] = {}
    ck = dict(opts.get("client_kwargs") or {})
    names = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token",
             "endpoint_url": "endpoint", "region": "region", "region_name": "region"}
    for k, v in {**ck, **opts}.items():
        if k in _OWN or k in ("anon", "client_kwargs") or v is None:
            continue
        cfg[names.get(k, k)] = v
    if opts.get("anon"):
        cfg["skip_signature"] = True
    env = os.environ
    if "endpoint" not in cfg and (env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")):
        cfg["endpoint"] = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if "region" not in cfg and not (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")):
        cfg["region"] = "us-east-1"
    has_creds = ("access_key_id" in cfg or env.get("AWS_ACCESS_KEY_ID") or env.get("AWS_PROFILE")
                 or env.get("AWS_WEB_IDENTITY_TOKEN_FILE") or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI")
                 or env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"))
    if not has_creds:
        cfg.setdefault("skip_signature", True)  # public buckets: no credential lookup, unsigned
    if str(cfg.get("endpoint", "")).startswith("http://"):
        cfg.setdefault("virtual_hosted_style_request", False)
    return cfg


def public_http_url(loc: Location) -> str | None:
    """The plain HTTP(S) URL of an ``s3://`` location read anonymously (unsigned: no
    credentials, or ``anon``), which the native HTTP client can serve; None for anything that
    needs signing or another client. Path style under an endpoint (``AWS_ENDPOINT_URL``,
    ``endpoint_url``) or for bucket names with dots; else AWS's virtual-hosted host (the
    global one unless a region is named)."""
    if loc.scheme != "s3":
        return None
    cfg = _s3_config(loc.storage_options)
    if not cfg.get("skip_signature") or any(k in cfg for k in ("access_key_id", "session_token")):
        return None
    if set(cfg) - {"skip_signature", "endpoint", "region", "virtual_hosted_style_request"}:
        return None  # options only obstore understands
    parts = urlsplit(loc.url)
    bucket, key = parts.netloc, parts.path.strip("/")
    tail = f"/{key}" if key else ""
    endpoint = str(cfg.get("endpoint") or "").rstrip("/")
    if endpoint:
        return f"{endpoint}/{bucket}{tail}"
    region = str(cfg.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "")
    host = f"s3.{region}.amazonaws.com" if region and region != "us-east-1" else "s3.amazonaws.com"
    if "." in bucket:
        return f"https://{host}/{bucket}{tail}"
    return f"https://{bucket}.{host}{tail}"


def _make_store(loc: Location) -> Any:
    st = _obstore()
    opts = loc.storage_options
    parts = urlsplit(loc.url)
    if loc.scheme in ("http", "https"):
        client, retry = _client_and_retry(opts, loc.scheme == "http")
        return st.HTTPStore.from_url(loc.url, client_options=client, retry_config=retry)
    if loc.scheme == "s3":
        cfg = _s3_config(opts)
        client, retry = _client_and_retry(opts, str(cfg.get("endpoint", "")).startswith("http://"))
        prefix = parts.path.strip("/") or None
        return st.S3Store(parts.netloc, prefix=prefix, config=cfg, client_options=client,
                          retry_config=retry)
    if loc.scheme == "gs":
        cfg = {k: v for k, v in opts.items() if k not in _OWN and k not in ("anon", "token")}
        if opts.get("anon") or opts.get("token") == "anon":
            cfg["skip_signature"] = True
        client, retry = _client_and_retry(opts, False)
        prefix = parts.path.strip("/") or None
        return st.GCSStore(parts.netloc, prefix=prefix, config=cfg, client_options=client,
                           retry_config=retry)
    raise ValueError(f"no remote store for scheme {loc.scheme!r}")
