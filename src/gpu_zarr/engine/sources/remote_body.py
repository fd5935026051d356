"""Bodies of obstore answers read as streams, bounded in bytes and in time.

One job: :func:`read_body` takes an obstore ``GetResult`` and returns at most ``limit`` bytes
of it. obstore's own ``bytes_async`` holds whatever a server sends: a 400 MiB answer where a
2 KiB chunk was asked for cost gigabytes. Here the body is taken piece by piece and given up
the moment it passes ``limit`` (the connection is dropped with the stream), within the
request's deadline, and never slower than the minimum rate (a body dripped a byte at a time
ends). The caller says what a body over the limit means (:class:`Limit`'s ``over``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_zarr.errors import RemoteError

__all__ = ["Limit", "deadline_of", "read_body", "seconds"]

_PIECE = 64 << 10  # obstore gathers at least this much before handing a piece on


@dataclass(frozen=True)
class Limit:
    """How much of one answer may be taken, and by when.

    Attributes
    ----------
    nbytes : int
        The most bytes kept; a longer body raises ``over(nbytes)``.
    over : callable
        Makes the error for a body longer than ``nbytes`` (it names the object and what to do).
    deadline : float
        ``time.monotonic()`` by which the body must be in (inf: none).
    min_rate : int
        Bytes per second under which (over ``window`` seconds) the transfer fails.
    window : float
    url : str
        For messages.
    """

    nbytes: int
    over: Callable[[int], BaseException]
    deadline: float = float("inf")
    min_rate: int = 1
    window: float = 10.0
    url: str = ""


def seconds(v: Any) -> float:
    """A timeout in seconds, given as a number or a ``timedelta`` (obstore's own type)."""
    return float(v.total_seconds()) if hasattr(v, "total_seconds") else float(v)


def deadline_of(timeout_s: float) -> float:
    """The monotonic time a request started now must be done by (inf: ``timeout_s`` 0, none)."""
    return time.monotonic() + timeout_s if timeout_s > 0 else float("inf")


async def read_body(res: Any, lim: Limit) -> bytes:
    """The body of ``res`` (an obstore ``GetResult``), at most ``lim.nbytes`` bytes.

    Raises
    ------
    whatever ``lim.over`` makes
        The body is longer than ``lim.nbytes`` (nothing past it is read).
    RemoteError
        The deadline passed, or the body came slower than ``lim.min_rate``.
    """
    out = bytearray()
    stream = res.stream(min_chunk_size=min(_PIECE, max(1, lim.nbytes + 1)))
    began = mark = time.monotonic()
    since_mark = 0
    it = stream.__aiter__()
    nxt: Any = None  # the next piece's task: kept across waits (cancelling it could lose a piece)
    try:
        while True:
            now = time.monotonic()
            left = lim.deadline - now
            if left <= 0:
                raise _slow(lim, len(out), f"it was not in within the request's deadline ({now - began:.0f} s so far)")
            if nxt is None:
                nxt = asyncio.ensure_future(it.__anext__())
            # wait at most until the deadline, and a window at a time (the rate is judged per window)
            done, _ = await asyncio.wait({nxt}, timeout=min(left, lim.window))
            piece = b""
            if done:
                task, nxt = nxt, None
                try:
                    piece = task.result()
                except StopAsyncIteration:
                    return bytes(out)
            if len(out) + len(piece) > lim.nbytes:
                raise lim.over(lim.nbytes)
            out += piece
            since_mark += len(piece)
            now = time.monotonic()
            if now - mark >= lim.window:
                if since_mark < lim.min_rate * (now - mark):
                    raise _slow(lim, len(out), f"fewer than {lim.min_rate} bytes a second arrived for "
                                               f"{now - mark:.0f} s")
                mark, since_mark = now, 0
    finally:
        if nxt is not None:  # given up: the stream and its connection are dropped
            nxt.cancel()


def _slow(lim: Limit, got: int, how: str) -> RemoteError:
    return RemoteError(f"GET {lim.url} timed out after {got} bytes: {how}. The server is too slow or stalled; the "
                       "deadline is storage_options 'timeout' (or the remote_timeout setting, GPU_ZARR_REMOTE_TIMEOUT_S) "
                       "and the slowest rate accepted the remote_min_rate setting (GPU_ZARR_REMOTE_MIN_RATE).")
