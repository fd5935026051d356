"""Requests this library leaves running in the background end before the interpreter does.

A few remote requests are started and not awaited by whoever started them: the metadata of
the nodes an OME-Zarr reader opens next (fetched ahead), and a whole object that several
readers share. When such a request is served by obstore, its end is delivered by one of
obstore's own (Rust) threads, which calls into Python. If the interpreter has already been
torn down by then, that call crashes the process (a segmentation fault at exit: seen on the
GPU machine in 3 of 5 runs of the remote test suites). So every such task is :func:`track`-ed,
and at exit :func:`drain` waits for them for up to ``WAIT_S`` seconds, then cancels what is
left (a dead or stalled server) and gives the cancellations ``GRACE_S`` to land. An exit with
nothing under way waits for nothing.
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any

__all__ = ["GRACE_S", "WAIT_S", "drain", "track", "under_way"]

WAIT_S = 2.0  # at exit: how long requests under way may take to end
GRACE_S = 0.25  # then, after cancelling those that did not: for the cancellations to land

_lock = threading.Lock()
_tasks: set[Any] = set()
_registered = False


def track(task: Any) -> Any:
    """Keep ``task`` (an asyncio task, on any loop; called on that loop) until it is done."""
    global _registered
    with _lock:
        _tasks.add(task)
        if not _registered:
            atexit.register(drain)
            _registered = True
    task.add_done_callback(_forget)
    return task


def _forget(task: Any) -> None:
    with _lock:
        _tasks.discard(task)


def under_way() -> int:
    """How many tracked tasks are not done."""
    with _lock:
        return sum(1 for t in _tasks if not t.done())


def drain(wait_s: float = WAIT_S, grace_s: float = GRACE_S) -> int:
    """Wait up to ``wait_s`` for the tracked tasks, then cancel those still under way (on their
    loops) and wait ``grace_s`` more. Returns how many were cancelled."""
    deadline = time.monotonic() + wait_s
    while True:
        with _lock:
            left = [t for t in _tasks if not t.done()]
        if not left:
            return 0
        if time.monotonic() >= deadline:
            break
        time.sleep(0.005)
    cancelled = 0
    for task in left:
        loop = task.get_loop()
        if loop.is_closed():
            continue
        try:
            loop.call_soon_threadsafe(task.cancel)
            cancelled += 1
        except RuntimeError:  # the loop was closed meanwhile
            pass
    if cancelled:
        time.sleep(grace_s)
    return cancelled
