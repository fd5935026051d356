"""What a read's stages share: the batches of a read as a :class:`Feed` (all known at once,
or arriving while the read runs), the chunk cache's :class:`Keep`, :func:`decoded_stride`,
:func:`needs_host_check` and :func:`piece_names`. Sources make feeds; the scheduler
(:mod:`gpu_zarr.engine.scheduler`) runs them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpu_zarr.engine.binary import align_up
from gpu_zarr.engine.codecs import CodecStage
from gpu_zarr.engine.layout import Layout
from gpu_zarr.engine.ops import Ops
from gpu_zarr.engine.options import EngineOptions
from gpu_zarr.engine.plan import Batch, LazyNames, Pieces
from gpu_zarr.engine.sources.locate import Located
from gpu_zarr.errors import ReadCancelled

__all__ = ["Feed", "Keep", "check_cancel", "decoded_stride", "keeper", "needs_host_check", "piece_names"]


def check_cancel(opts: EngineOptions) -> None:
    """Raise ReadCancelled when the read's cancel event is set."""
    if opts.cancel is not None and opts.cancel.is_set():
        raise ReadCancelled("read cancelled: the partial result was discarded")


def needs_host_check(stage: CodecStage, ops: Ops) -> bool:
    """Whether the stage's host half (``prepare``) must run before ``ops`` decode: not where
    the decoder checks its input itself (the batched GPU decoder's frame walk:
    ``device_checks``; the codec's own C decoder on the CPU's fast path: ``native_checks``)."""
    return stage.decodes and ops.needs_host_check(stage.device_checks, stage.native_checks)


def decoded_stride(lay: Layout) -> int:
    """Bytes between decoded chunks in the decoded buffer (16-byte aligned)."""
    return int(align_up(lay.inner_nbytes))


class Keep:
    """Which decoded chunks a read keeps for the chunk cache, and the ones kept (put into the
    cache once the read is done: every stream is through with them by then)."""

    def __init__(self, keys: list[Any], pieces: Pieces, every: bool) -> None:
        self.keys = keys
        self._table, self._every = pieces.table, every
        self._wanted: np.ndarray | None = None  # worked out at the first question (not before a read's requests leave)
        self.chunks: list[tuple[Any, Any]] = []

    def wants(self, k: int) -> bool:
        if self._wanted is None:
            t = self._table
            # a piece that is the whole chunk: nothing of it is left for a neighbouring read
            whole = ((t[:, :, 1] == 0) & (t[:, :, 2] == t[:, :, 0])).all(axis=1) if len(t) else np.zeros(0, bool)
            self._wanted = np.ones(len(t), bool) if self._every else ~whole
        return bool(self._wanted[k])

    def __call__(self, k: int, chunk: Any) -> None:
        self.chunks.append((self.keys[k], chunk))


def keeper(keys: list[Any], pieces: Pieces, cache: Any, mode: Any) -> Keep | None:
    """What a read keeps for the chunk cache under ``EngineOptions.cache`` ``mode``: nothing
    without a cache or with ``"look"``, every chunk with ``"all"``, else the partly used ones."""
    if cache is None or mode == "look":
        return None
    return Keep(keys, pieces, every=mode == "all")


def piece_names(loc: Located, pieces: np.ndarray) -> LazyNames:
    """Names of the located pieces ``pieces`` (a batch's), in that order."""
    return LazyNames(len(pieces), lambda k: loc.names[int(pieces[k])])


class Feed:
    """The batches of a read: all known at once (a list: local files), or arriving while the
    read runs (a remote read, :class:`~gpu_zarr.engine.sources.remote_feed.RemoteFeed`).
    ``get(k)`` is batch k -- made by ``more()`` while it is not there yet -- or None once there
    are no more; ``stop()`` tells ``more`` that the read failed (it must not wait for answers
    any longer)."""

    def __init__(self, batches: Sequence[Batch] | None = None,
                 more: Callable[[], tuple[list[Batch], bool]] | None = None,
                 stop: Callable[[], None] | None = None) -> None:
        self._batches = list(batches) if batches is not None else []
        self._more = more  # () -> (new batches, no more will come); may wait for them
        self._stop = stop
        self._done = more is None
        self._lock = threading.Lock()

    def get(self, k: int) -> Batch | None:
        with self._lock:  # batches are made in order, by one thread at a time
            while k >= len(self._batches) and not self._done:
                assert self._more is not None
                got, self._done = self._more()
                self._batches.extend(got)
            return self._batches[k] if k < len(self._batches) else None

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()

    @property
    def known(self) -> int | None:
        """How many batches there are, when all are known (None while more may come)."""
        return len(self._batches) if self._more is None else None

    def __len__(self) -> int:
        """Batches made so far."""
        return len(self._batches)
