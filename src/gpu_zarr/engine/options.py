"""The knobs of one engine read (:class:`EngineOptions`), with defaults from :mod:`gpu_zarr.settings`.

The entry points take them (:mod:`gpu_zarr.engine.pipeline`, which re-exports the class); the
scheduler (:mod:`gpu_zarr.engine.scheduler`) and the remote feed read them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_zarr import settings

__all__ = ["EngineOptions"]


def _setting(name: str) -> Callable[[], Any]:
    return lambda: settings.get(name)


@dataclass
class EngineOptions:
    """Knobs of the direct engine for one read; defaults come from :mod:`gpu_zarr.settings`.

    Attributes
    ----------
    batch_bytes : int
        Encoded (and decoded) bytes per batch; one read, one copy and one batched decode
        per batch (``settings`` ``batch_bytes``, environment ``GPU_ZARR_BATCH_MIB``).
    slots : int
        Batches in flight (``GPU_ZARR_SLOTS``); 2 is double buffering, 3 lets reads run ahead.
    lanes : int
        GPU work streams decoding at once (``GPU_ZARR_LANES``, at most ``slots``).
    budget_bytes : int
        GPU memory the read may use beyond its result: staging, decoded buffers and decoder
        scratch (``GPU_ZARR_BUDGET_MIB``; 0: a quarter of the free memory, at most 3 GiB).
        Batches are sized to fit it; the stats report it.
    threads : int
        Read threads (kvikio's pool or ours; ``GPU_ZARR_THREADS``). kvikio's own default is 1.
    reader : {"auto", "kvikio", "threads"}
        "auto" uses kvikio when installed on the GPU path (``GPU_ZARR_READER``).
    direct_raw : bool
        Uncompressed chunks read by kvikio go straight into device memory
        (``GPU_ZARR_DIRECT_RAW=0`` turns it off).
    pinned_limit : int, optional
        Upper bound of this read's staging (``slots * batch_bytes`` is reduced to fit);
        default ``settings`` ``pinned_bytes``.
    cache : bool, "all" or "look"
        Serve decoded chunks from the runtime's chunk cache (``settings`` ``cache_bytes``;
        device memory on the GPU path, host memory for small reads decoded on the CPU) and
        keep there the chunks this read decodes but uses only part of: a neighbouring read
        (the next plane of thick chunks) wants the rest. ``"all"`` keeps every chunk it
        decodes (a prefetch of the plane a viewer shows next); ``"look"`` keeps none (a read
        far from the ones before it: keeping costs fresh memory that no neighbour may use).
        Lazy arrays turn it on.
    progress : callable, optional
        ``progress(done_bytes, total_bytes)`` after each batch (decoded bytes).
    cancel : object with ``is_set()``, optional
        Checked between batches; raises :class:`~gpu_zarr.errors.ReadCancelled`.
    on_sent : callable, optional
        ``on_sent()`` runs once, on the reading thread, while a remote read's requests travel
        (the host path: after they are written, before any answer is taken): the caller's
        own setup for the result overlaps the round trip (the engine backend makes the GPU
        array a plane is copied to). Not called by other reads; an exception stops the read.
    """

    batch_bytes: int = field(default_factory=_setting("batch_bytes"))
    slots: int = field(default_factory=_setting("slots"))
    lanes: int = field(default_factory=_setting("lanes"))
    budget_bytes: int = field(default_factory=_setting("budget_bytes"))
    threads: int = field(default_factory=_setting("threads"))
    reader: str = field(default_factory=_setting("reader"))
    direct_raw: bool = field(default_factory=_setting("direct_raw"))
    pinned_limit: int = field(default_factory=_setting("pinned_bytes"))
    cache: bool | str = False  # False, True, "all" or "look"
    progress: Callable[[int, int], None] | None = None
    cancel: Any = None
    on_sent: Callable[[], None] | None = None

    def with_(self, **changes: Any) -> EngineOptions:
        """A copy with some fields changed."""
        return replace(self, **changes)
