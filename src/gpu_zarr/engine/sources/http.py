"""HTTP(S) GETs from the native library (``native/gz_http.c``, libcurl's multi interface).

One job: many GETs -- whole objects, byte ranges, suffixes -- in flight from ONE native call,
each body written straight into a buffer the caller gives (a staging buffer, a scratch
array), retried with backoff on 429/5xx, resets, timeouts and answers cut short, with a
callback per finished request so decode overlaps the transfer. No Python per byte and no
event loop: libcurl (TensorStore's client too) spends a fraction of obstore's CPU per byte.

:mod:`gpu_zarr.engine.sources.remote` uses it for ``http(s)://`` stores and anonymous ``s3://`` reads
when it loads (libcurl.so.4, found with dlopen at run time); otherwise, for signed ``s3://`` and
``gs://`` (signing, credential chains) and with the ``native_http`` setting off
(``GPU_ZARR_NATIVE_HTTP=0``) or the ``native`` one, obstore serves. :func:`status` says which;
the settings are asked as each store opens (:func:`client_for`), a store opened before keeps
its client.
"""

from __future__ import annotations

import array
import ctypes
import functools
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import numpy as np

import gpu_zarr.engine.native as native
from gpu_zarr import settings
from gpu_zarr.engine.sources.remote_body import seconds

__all__ = ["AGENT_BYTES", "CHANGED", "MAX_AGENTS", "REFUSED", "REQ", "TOO_LONG", "UNANSWERED", "Carved", "Handoff", "HttpClient",
           "Landing", "Parts", "Sink", "agents_for", "available", "client_for", "new_requests", "seconds", "status"]

#: one request (gz_http_req in gz_http.c)
REQ = np.dtype([("start", "<i8"), ("end", "<i8"), ("dest", "<u8"), ("cap", "<i8"), ("got", "<i8"),
                ("size", "<i8"), ("mtime", "<i8"), ("range_start", "<i8"), ("range_end", "<i8"), ("status", "<i4"),
                ("curl", "<i4"), ("attempts", "<i4"), ("added", "<i4"), ("etag", "S96"), ("err", "S128")])
_DONE = ctypes.CFUNCTYPE(None, ctypes.c_int64)
TOO_LONG = -2  # status: the body was longer than its buffer
CHANGED = -6  # status: a retry brought another object after some of its parts were handed (Parts)
REFUSED = -7  # status: a redirect refused (another scheme, https to http, too many hops); ``err`` says which
TICK_MS = 100  # the native call hands control back this often: the caller's cancel event and Ctrl-C are seen
UNANSWERED = object()  # HttpClient.get_small: ask another client


def _client_lib() -> tuple[Any, str, str]:
    """(library, version, "") or (None, "", why not): the decision, the ``native_http`` and
    ``native`` settings asked now (dict lookups)."""
    if not settings.get("native_http"):
        return None, "", "turned off by the native_http setting (GPU_ZARR_NATIVE_HTTP=0)"
    lib = native.library()
    if lib is None:
        return None, "", f"the native library is not loaded ({native.status().reason})"
    return _lib(lib)


def _bound() -> Any:
    """The library for a call its caller decided on (a client made): the switches are not asked
    again, so turning them off meanwhile does not pull the client from a read under way."""
    lib, _, why = _lib(native.loaded())
    if lib is None:
        raise RuntimeError(f"the native HTTP client is not available ({why})")
    return lib


@functools.cache
def _lib(lib: Any) -> tuple[Any, str, str]:
    """(library, version, "") or (None, "", why not): the HTTP calls of the native library
    ``lib`` bound, once."""
    if not hasattr(lib, "gz_http_fetch"):
        return None, "", "the native library was built without gz_http.c: reinstall the package"
    why, ver = ctypes.c_char_p(), ctypes.c_char_p()
    lib.gz_http_available.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p)]
    if not lib.gz_http_available(ctypes.byref(why), ctypes.byref(ver)):
        return None, "", f"libcurl did not load ({(why.value or b'').decode(errors='replace')}); install libcurl4"
    lib.gz_http_fetch.restype = ctypes.c_int
    i64, vp, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.gz_http_fetch.argtypes = [ctypes.c_char_p, i64, vp, i64, c_int, vp, c_int, i64, i64, c_int, i64, _DONE, vp, c_int,
                                  vp, vp, c_int, vp, i64, i64, c_int, c_int]
    lib.gz_http_publish.restype = None
    lib.gz_http_publish.argtypes = [vp, i64]
    return lib, (ver.value or b"").decode(errors="replace"), ""


def available() -> bool:
    """The native HTTP client runs here (the native library and libcurl loaded)."""
    return _client_lib()[0] is not None


def status() -> str:
    """One line for ``gpu-zarr info``: which client serves http(s) stores, and why."""
    lib, ver, why = _client_lib()
    if lib is None:
        return f"obstore (native HTTP client not used: {why})"
    return (f"native (libcurl: {ver.split()[0] if ver else 'loaded'}; anonymous s3:// too); signed s3:// and gs:// "
            "through obstore")


@dataclass(frozen=True)
class Carved:
    """Destinations carved from one block: request i's body goes to
    ``block[offsets[i]:offsets[i] + caps[i]]`` (a remote read's answers in one lease: the
    block is checked once, not each destination)."""

    block: np.ndarray
    offsets: Sequence[int]
    caps: Sequence[int]

    def addresses(self, n: int) -> tuple[list[int], list[int]]:
        """(address, capacity) of the first ``n`` destinations; raises if one lies outside the block."""
        b = self.block
        f = b.flags
        if not (b.ndim == 1 and f.c_contiguous and f.writeable and b.dtype == np.uint8):
            raise ValueError("the block must be a writable contiguous 1-d uint8 array")
        offsets, caps = list(self.offsets[:n]), list(self.caps[:n])
        if len(offsets) < n or len(caps) < n or any([o < 0 or c < 0 or o + c > b.nbytes for o, c in zip(offsets, caps)]):
            raise ValueError(f"{n} destinations do not all lie inside the block of {b.nbytes} bytes")
        base = native.address(b)
        return [base + o for o in offsets], caps


@dataclass(frozen=True)
class Landing:
    """Destinations made once the requests are written (:meth:`HttpClient.fetch`'s ``dests``):
    ``make()`` gives them (arrays, or a :class:`Carved` block), request i's holding at least
    ``caps[i]`` bytes, and no body is written before they are there (one that comes sooner
    waits, paused). So a small read's requests leave before its buffers are set up. A fetch
    that spreads its answers over several threads makes them before its requests leave."""

    caps: Sequence[int]
    make: Callable[[], Sequence[np.ndarray] | Carved]


def _places(dests: Sequence[np.ndarray] | Carved, n: int) -> tuple[list[int], list[int]]:
    """(address, capacity) of the first ``n`` destinations, each checked."""
    if isinstance(dests, Carved):
        return dests.addresses(n)
    if len(dests) < n:
        raise ValueError(f"{n} requests need {n} destinations, got {len(dests)}")
    for d in dests[:n]:
        if not (d.flags.c_contiguous and d.flags.writeable and d.dtype == np.uint8):
            raise ValueError("each destination must be a writable contiguous uint8 array")
    return [native.address(d) for d in dests[:n]], [d.nbytes for d in dests[:n]]


class Handoff:
    """A native decode set (:class:`~gpu_zarr.engine.native.Arrivals`) that fetches hand
    complete bodies to as they arrive (:class:`Sink`): its handle goes into ``cell[0]`` once
    it is open (0 before: answers until then are only reported), and ``alive`` gets the
    destinations of every fetch that fed it. Its owner keeps both until the set is closed
    (a worker may still be decoding from them after the fetch returned)."""

    # (a plain class and an array.array, not a dataclass and numpy: made before a plane's requests leave)
    __slots__ = ("alive", "cell")

    def __init__(self) -> None:
        self.cell = array.array("q", [0])
        self.alive: list[Any] = []


@dataclass(frozen=True)
class Sink:
    """One fetch's hand-off: request i's complete body goes to chunk ``chunk[i]`` of the
    set of ``to`` (-1: none) with no Python between. Such a request has ``added`` 1 in its
    row, and is reported (``on_done``) when nothing else is arriving: its Python runs while
    the set decodes. ``chunk``: int64s (an ``array.array("q")`` or a numpy int64 array)."""

    to: Handoff
    chunk: Any

    def pointers(self, n: int) -> tuple[int, int]:
        """(address of the cell, address of the chunk table) for a fetch of ``n`` requests."""
        return _int64s(self.to.cell, 1, "a hand-off's cell is one contiguous int64"), _int64s(
            self.chunk, n, f"a sink's chunk table holds one int64 per request ({n})")


class _PartsC(ctypes.Structure):
    _fields_ = [("at", ctypes.c_void_p), ("rows", ctypes.c_void_p), ("expect", ctypes.c_void_p),
                ("etags", ctypes.c_void_p), ("late", ctypes.c_void_p)]


class Parts:
    """Pieces of whole-object answers handed to a :class:`Sink`'s decode set as the body's
    bytes pass each one's end, before the answer is complete (a whole shard whose index is
    known: its inner chunks decode while the rest of it arrives).

    They are handed only when the answer is the object the offsets were read from: a 200 of
    the expected size, Last-Modified and ETag (those :meth:`set` is given). A request's row
    says how many were handed (``added``: the first ones, in the order given); the rest are
    the caller's when the request is reported. A retry that brings another object after some
    were handed ends with status :data:`CHANGED`, nothing of it written over them.

    ``n``: the fetch's requests. ``late``: parts may also be given while the fetch runs
    (:meth:`publish`: a shard whose index comes in another request of the same fetch)."""

    __slots__ = ("_at", "_c", "_etags", "_expect", "_late", "_next", "_published", "_rows", "n")

    def __init__(self, n: int, late: bool = False) -> None:
        self.n = n
        self._late = array.array("q", bytes(8 * n)) if late else None
        self._published: list[Parts] = []  # (alive until the fetch is done: the native side reads them)
        self._at = array.array("q", bytes(8 * (n + 1)))
        self._rows = array.array("q")
        self._expect = array.array("q", [-1, -1] * n)
        self._etags = ctypes.create_string_buffer(96 * max(1, n))
        self._c: Any = None
        self._next = 0  # requests before this one are set (or have none)

    def set(self, i: int, chunks: Sequence[int], offsets: Sequence[int], sizes: Sequence[int], size: int,
            mtime_s: int, etag: str = "") -> None:
        """Request i's parts: chunk ``chunks[k]`` of the set is ``sizes[k]`` bytes at
        ``offsets[k]`` of the body, in the order of their ends (``offsets + sizes``, ascending).
        Handed only from an object of ``size`` bytes, Last-Modified ``mtime_s`` (seconds; -1:
        none) and ETag ``etag`` (empty: not compared). Requests must be set in order (0, 1, ...),
        each at most once. (Arrays: a whole shard's parts in one step, not a Python step each.)"""
        c, o, z = (np.asarray(v, np.int64).reshape(-1) for v in (chunks, offsets, sizes))
        if not (len(c) == len(o) == len(z)):
            raise ValueError("chunks, offsets and sizes must be as long as each other")
        ends = o + z
        if len(o) and (int(o.min()) < 0 or int(z.min()) < 0 or int(ends.max()) > size or bool((np.diff(ends) < 0).any())):
            raise ValueError(f"request {i}: parts must lie inside the object ({size} bytes) in the order of their ends")
        if not self._next <= i < self.n:
            raise ValueError(f"request {i}: parts are set once per request, in order, for requests 0..{self.n - 1}")
        for k in range(self._next + 1, i + 1):  # (the requests between have none)
            self._at[k] = len(self._rows) // 3
        self._rows.frombytes(np.stack([c, o, z], axis=1).astype("<i8").tobytes())
        self._at[i + 1] = len(self._rows) // 3
        self._next = i + 1
        self._expect[2 * i], self._expect[2 * i + 1] = int(size), int(mtime_s)
        tag = etag.encode()[:95] + b"\0"
        ctypes.memmove(ctypes.addressof(self._etags) + 96 * i, tag, len(tag))

    def pointer(self, n: int) -> int:
        """The address of the native description for a fetch of ``n`` requests (kept alive by this object)."""
        if n != self.n:
            raise ValueError(f"parts for {self.n} requests, the fetch has {n}")
        for k in range(self._next + 1, n + 1):  # (the requests after the last set have none)
            self._at[k] = len(self._rows) // 3
        if not self._rows:
            self._rows.append(0)  # (an address to give, never read: every request has no parts)
        late = self._late.buffer_info()[0] if self._late is not None else None
        self._c = _PartsC(self._at.buffer_info()[0], self._rows.buffer_info()[0], self._expect.buffer_info()[0],
                          ctypes.addressof(self._etags), late)
        return ctypes.addressof(self._c)

    def publish(self, i: int, chunks: Sequence[int], offsets: Sequence[int], sizes: Sequence[int], size: int,
                mtime_s: int, etag: str = "") -> None:
        """Request i's parts (as for :meth:`set`), given while the fetch runs (from its
        ``on_done``, on the fetching thread): the bytes of request i that arrive from now on
        hand them (those already in first), when the answer is that object. Once per request,
        for a request given no parts by :meth:`set`; needs ``late``."""
        if self._late is None:
            raise ValueError("these parts were made without late=True: nothing can be published")
        if not 0 <= i < self.n or self._late[i] or self._at[i + 1] > self._at[i]:
            raise ValueError(f"request {i}: parts are published once, for a request with none set")
        one = Parts(1)
        one.set(0, chunks, offsets, sizes, size, mtime_s, etag)
        self._published.append(one)
        _bound().gz_http_publish(self._late.buffer_info()[0] + 8 * i, one.pointer(1))


def _int64s(v: Any, n: int, what: str) -> int:
    """The address of at least ``n`` contiguous int64s in ``v`` (an ``array.array("q")`` or a
    numpy array); else ValueError saying ``what``."""
    if isinstance(v, array.array):
        if v.typecode == "q" and v.itemsize == 8 and len(v) >= n:
            return int(v.buffer_info()[0])
    elif isinstance(v, np.ndarray) and v.dtype == np.int64 and v.ndim == 1 and v.size >= n and v.flags.c_contiguous:
        return native.address(v)
    raise ValueError(f"{what}, got a {type(v).__name__} of {np.size(v)} "
                     f"{getattr(v, 'dtype', getattr(v, 'typecode', ''))}")


_local = threading.local()


def _calls() -> list[Callable[[int], None]]:
    """This thread's fetches under way, innermost last (whose ``done`` the thunk calls)."""
    calls = getattr(_local, "calls", None)
    if calls is None:
        calls = _local.calls = []
    return calls


def _dispatch(i: int) -> None:
    _local.calls[-1](i)


_THUNK = _DONE(_dispatch)  # (kept for the process, not made per call)


@functools.lru_cache(maxsize=64)
def _headers(headers: tuple[str, ...]) -> tuple[Any, int]:
    """The ``"Name: value"`` lines as the C array the native call takes, and their count."""
    enc = [h.encode() for h in headers]
    return (ctypes.c_char_p * max(1, len(enc)))(*enc), len(enc)


@dataclass(frozen=True)
class HttpClient:
    """How one store's requests are made: extra headers, timeouts and retries.

    Attributes
    ----------
    headers : tuple of str
        ``"Name: value"`` lines sent with every request (not after a redirect to another host).
    connect_timeout_s : float
    stall_s : float
        The window of ``min_rate``: a transfer that moves fewer than ``min_rate`` bytes a
        second for this long fails (and is retried within the deadline).
    attempts : int
        Tries per request (1 + retries).
    backoff_s : float
        Wait before the first retry, doubled per retry (at most 5 s).
    timeout_s : float
        Deadline of each request, its retries and redirects included (0: none): a request not
        done by then fails, saying so (settings ``remote_timeout``; ``storage_options["timeout"]``).
    min_rate : int
        Bytes per second below which a transfer fails (settings ``remote_min_rate``): a body
        dripped byte by byte ends.
    redirects : int
        Redirect hops followed at most (only to http(s), never from https to http).
    """

    headers: tuple[str, ...] = ()
    connect_timeout_s: float = 10.0
    stall_s: float = 10.0
    attempts: int = 9
    backoff_s: float = 0.05
    timeout_s: float = 60.0
    min_rate: int = 1024
    redirects: int = 5

    def fetch(self, urls: Sequence[str], reqs: np.ndarray, dests: Sequence[np.ndarray] | Carved | Landing, in_flight: int,
              on_done: Callable[[int], None] | None = None, sending: threading.Event | None = None,
              agents: int | None = None, sink: Sink | None = None,
              on_sent: Callable[[], None] | None = None, parts: Parts | None = None,
              stop: Callable[[], bool] | None = None) -> np.ndarray:
        """GET ``reqs[i]`` (a table of :func:`new_requests`: fields ``start``, ``end``) of
        ``urls[i]`` into ``dests[i]`` (a writable contiguous uint8 array; or the i-th span of a
        :class:`Carved` block; or a :class:`Landing`: made once the requests are written),
        ``in_flight`` at once; ``on_done(i)`` runs (on this thread) as request i finishes for good.
        Returns ``reqs`` filled in (``got``, ``size``, ``mtime``, ``status``, ``curl``, ``etag``,
        ``err``). ``sending`` is set as the native call starts (it holds no GIL from then on).
        ``agents``: threads receiving the answers (this one and ``agents - 1`` more; default
        :func:`agents_for` the bytes the destinations hold). ``sink``: where complete bodies
        are decoded as they arrive (:class:`Sink`); ``parts``: pieces of whole answers handed to
        that sink's set before they are complete (:class:`Parts`; a request with parts has
        sink chunk -1). ``on_sent()`` runs (on this thread) once
        the first requests are written, before any answer is taken: the caller's own setup for
        the answers overlaps their round trip. ``stop()`` is asked every ``TICK_MS`` while the
        answers travel: true stops the requests in flight and raises
        :class:`~gpu_zarr.errors.ReadCancelled` (Ctrl-C is seen then too).

        An exception raised by ``on_done``, ``on_sent`` or a landing's ``make`` stops the remaining
        requests and is raised here.
        """
        lib = _bound()
        n = len(urls)
        if n == 0:
            return reqs
        dests, landing, addrs, caps, agents = _destinations(dests, n, agents)
        raw = _raw(reqs)
        if raw is None or len(reqs) < n:
            raise ValueError(f"reqs must be a request table of new_requests with at least {n} rows")
        if landing is None:
            _set(raw, "dest", n, addrs)
        _set(raw, "cap", n, caps)
        table = raw.buffer_info()[0]
        # (one buffer of NUL-terminated URLs, cheaper than a ctypes array of n pointers)
        c_urls = ("\0".join(urls) + "\0").encode()
        c_hdr, nhdr = _headers(self.headers)
        sink_at: tuple[int | None, int | None] = (None, None)
        if parts is not None and sink is None:
            raise ValueError("parts are handed to a sink's decode set: give the sink too")
        parts_at = parts.pointer(n) if parts is not None else None
        if sink is not None:
            sink_at = sink.pointers(n)
            if landing is None:
                sink.to.alive.append(dests)  # (the set may read them after this returns)
        cancel = ctypes.c_int32(0)
        cb = _Callbacks(raw, n, caps, landing, sink, on_sent, on_done, stop, cancel)
        if sending is not None:
            sending.set()
        if agents is None:
            agents = agents_for(sum(caps), n)
        # the callback: one native thunk for every call, dispatching to this call's `done`
        # (the innermost fetch of this thread: a `done` may run another fetch)
        calls = _calls()
        calls.append(cb.done)
        try:
            rc = lib.gz_http_fetch(c_urls, len(c_urls), table, n, max(1, int(in_flight)), c_hdr, nhdr,
                                   int(self.connect_timeout_s * 1000), max(1, int(round(self.stall_s))),
                                   max(1, int(self.attempts)), int(self.backoff_s * 1000), _THUNK,
                                   ctypes.addressof(cancel), max(1, int(agents)), *sink_at,
                                   2 if landing is not None else int(on_sent is not None), parts_at,
                                   int(self.timeout_s * 1000), max(1, int(self.min_rate)), TICK_MS,
                                   max(0, int(self.redirects)))
        finally:
            calls.pop()
        if cb.failed:
            raise cb.failed[0]
        if rc == -4:  # (-3: cancelled; the callback's exception was raised above)
            raise MemoryError("the native HTTP client could not allocate its request table")
        if rc == -5:
            raise ValueError(f"{len(urls)} URLs of which one holds a NUL character: {[u for u in urls if chr(0) in u][:1]!r}")
        if rc < 0 and rc != -3:
            raise RuntimeError(f"the native HTTP client failed ({rc})")
        return reqs

    def get_small(self, urls: Sequence[str], cap: int, in_flight: int = 64, sending: threading.Event | None = None,
                  on_each: Callable[[int, Any], None] | None = None) -> list[Any]:
        """GET small whole objects (metadata documents) together, one attempt each.

        Returns per URL its body (bytes), None (404: it does not exist), or :data:`UNANSWERED`
        (anything else: a failure, a body over ``cap`` bytes), which the caller asks its
        other client for: that one retries and explains. ``sending``: as for :meth:`fetch`.
        ``on_each(i, value)`` (on this thread; it must not raise) hands each one on as it
        arrives, the unanswered ones at the end (after a pause when the server said it is busy)."""
        n = len(urls)
        if n == 0:
            return []
        reqs = new_requests(n, ends=[-1] * n)
        bufs = [np.empty(cap, np.uint8) for _ in range(n)]
        out: list[Any] = [UNANSWERED] * n

        def judge(i: int) -> None:
            r = reqs[i]
            st, got, size, curl = int(r["status"]), int(r["got"]), int(r["size"]), int(r["curl"])
            if curl == 0 and st == 200 and (size < 0 or got == size):
                out[i] = bufs[i][:got].tobytes()
            elif curl == 0 and st == 404:
                out[i] = None
            if on_each is not None and out[i] is not UNANSWERED:
                on_each(i, out[i])
        replace(self, attempts=1).fetch(urls, reqs, bufs, in_flight, judge, sending=sending, agents=1)
        if any(int(st) == 429 or int(st) >= 500 for st in reqs["status"]):
            time.sleep(self.backoff_s)  # the server is busy: the other client asks after a pause
        if on_each is not None:
            for i in range(n):
                if out[i] is UNANSWERED:
                    on_each(i, UNANSWERED)
        return out


_CORES = os.cpu_count() or 1  # (asked once, not before every plane's requests)
AGENT_BYTES = 16 << 20  # answers' bytes per receiving thread
MAX_AGENTS = 4


def agents_for(nbytes: int, requests: int, cores: int | None = None) -> int:
    """Threads to receive ``requests`` answers of ``nbytes`` in all: one per ``AGENT_BYTES``,
    at most ``MAX_AGENTS`` and a quarter of the cores (the rest decode what arrives): one
    thread receiving every body limits big reads on many cores, while on few cores more threads
    only take time from the server and the decoders."""
    cores = _CORES if cores is None else cores
    return max(1, min(MAX_AGENTS, cores // 4, requests, -(-max(0, nbytes) // AGENT_BYTES)))


def client_for(scheme: str, options: Mapping[str, Any]) -> HttpClient | None:
    """The native client for an ``http``/``https`` store with ``options`` (the store's
    ``storage_options``), or None where obstore serves (other schemes, the client off or missing)."""
    if scheme not in ("http", "https") or not available():
        return None
    headers = tuple(f"{k}: {v}" for k, v in dict(options.get("headers") or {}).items())
    timeout = seconds(options.get("timeout", settings.get("remote_timeout")))
    return HttpClient(headers=headers, connect_timeout_s=seconds(options.get("connect_timeout", 10)),
                      stall_s=rate_window(timeout), attempts=1 + int(options.get("max_retries", 8)), timeout_s=timeout,
                      min_rate=int(settings.get("remote_min_rate")))


def rate_window(timeout_s: float) -> float:
    """Seconds over which ``remote_min_rate`` is measured: 10, shorter for a shorter deadline
    (at least 1): long enough that a pause of a busy server passes, short enough that a dripped
    body is cut within the deadline."""
    return max(1.0, min(10.0, timeout_s / 2)) if timeout_s > 0 else 10.0


_ROW = REQ.itemsize // 8  # int64s per row
#: a field's int64 in a row
_AT = MappingProxyType({f: REQ.fields[f][1] // 8 for f in ("start", "end", "dest", "cap")} if REQ.fields else {})


def new_requests(n: int, starts: Sequence[int] | None = None, ends: Sequence[int] | None = None) -> np.ndarray:
    """A zeroed request table of ``n`` rows (:data:`REQ`), with ``start`` and ``end`` set when given.

    Its memory is an ``array.array`` of int64s: the fields a fetch sets before its requests
    leave are set there, and its address taken, with no numpy call."""
    raw = array.array("q", bytes(n * REQ.itemsize))
    for name, values in (("start", starts), ("end", ends)):
        if values is not None:
            _set(raw, name, n, values)
    return np.frombuffer(raw, REQ)


def _raw(reqs: np.ndarray) -> array.array | None:
    """The int64s under a whole table of :func:`new_requests` (None for any other array)."""
    o = getattr(reqs.base, "obj", None)
    ok = isinstance(o, array.array) and o.typecode == "q" and reqs.dtype == REQ and len(o) == len(reqs) * _ROW
    return o if ok else None


def _set(raw: array.array, name: str, n: int, values: Sequence[int]) -> None:
    """Field ``name`` of the first ``n`` rows of the table over ``raw`` = ``values``."""
    at = _AT[name]
    raw[at:at + n * _ROW:_ROW] = array.array("q", values)


def _destinations(dests: Any, n: int, agents: int | None) -> tuple[Any, Landing | None, Any, list[int], int | None]:
    """(dests, landing, their addresses, capacities, agents): a :class:`Landing` is made now when
    several threads receive from the start (else once the requests are written: addresses None)."""
    landing = dests if isinstance(dests, Landing) else None
    addrs = None
    if landing is not None:
        caps = list(landing.caps[:n])
        if len(caps) < n or min(caps) < 0:
            raise ValueError(f"{n} requests need {n} capacities >= 0, got {landing.caps!r}")
        if agents is None:
            agents = agents_for(sum(caps), n)
        if agents > 1:  # (several threads receive from the start: the destinations first)
            dests, landing = landing.make(), None
    if landing is None:
        assert not isinstance(dests, Landing)
        addrs, caps = _places(dests, n)
    return dests, landing, addrs, list(caps), agents


class _Callbacks:
    """What the native fetch calls back (on the fetching thread): a tick (``stop`` asked), the
    requests written (the landing made, ``on_sent``), or request ``i`` done (``on_done``). An
    exception there is kept in ``failed`` and cancels the fetch; the fetch raises it."""

    def __init__(self, raw: Any, n: int, caps: Sequence[int], landing: Landing | None, sink: Sink | None,
                 on_sent: Callable[[], None] | None, on_done: Callable[[int], None] | None,
                 stop: Callable[[], bool] | None, cancel: Any) -> None:
        self.raw, self.n, self.caps, self.landing, self.sink = raw, n, caps, landing, sink
        self.on_sent, self.on_done, self.stop, self.cancel = on_sent, on_done, stop, cancel
        self.failed: list[BaseException] = []

    def land(self, landing: Landing) -> None:
        made = landing.make()
        addrs, have = _places(made, self.n)
        if any([h < c for h, c in zip(have, self.caps)]):
            raise ValueError(f"the destinations made hold {have} bytes; the requests need {self.caps}")
        _set(self.raw, "dest", self.n, addrs)
        if self.sink is not None:
            self.sink.to.alive.append(made)

    def done(self, i: int) -> None:
        if self.failed:
            return
        try:
            if i == -2:  # a tick: no answer, the caller's chance to stop (and Python's to see Ctrl-C)
                if self.stop is not None and self.stop():
                    from gpu_zarr.errors import ReadCancelled

                    raise ReadCancelled("read cancelled: the requests in flight were stopped")
            elif i < 0:
                if self.landing is not None:
                    self.land(self.landing)
                if self.on_sent is not None:
                    self.on_sent()
            elif self.on_done is not None:
                self.on_done(int(i))
        except BaseException as exc:  # noqa: BLE001 - raised by the fetch, after the native call returns
            self.failed.append(exc)
            self.cancel.value = 1
