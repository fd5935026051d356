"""The loader's logic without any GUI: backend and level choice, a load in a thread, history.

The napari dock (:mod:`gpu_zarr.napari_plugin._widget`) and the notebook widget
(:mod:`gpu_zarr.jupyter`) are thin views over one :class:`LoaderController`: they show
its choices, call :meth:`LoaderController.prepare` and start the returned
:class:`LoadJob`, and draw :attr:`LoaderController.history` and
:meth:`LoaderController.best_gib_per_s`. Everything here is testable without a display.

Examples
--------
>>> from gpu_zarr.controller import LoaderController
>>> ctl = LoaderController()                               # doctest: +SKIP
>>> ctl.open("image.ome.zarr")                             # doctest: +SKIP
>>> ctl.set_backend("cpu"); ctl.set_level(1)               # doctest: +SKIP
>>> rec = ctl.prepare().start().wait()                     # doctest: +SKIP
>>> rec.gib_per_s, ctl.best_gib_per_s()                    # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_zarr.backends import BACKENDS, READ_BACKENDS, check_backend
from gpu_zarr.capabilities import Capabilities, probe
from gpu_zarr.errors import GpuZarrError, ReadCancelled
from gpu_zarr.lazy import GpuLazyArray

__all__ = ["CHART_BACKENDS", "BackendOption", "LevelOption", "LoadJob", "LoaderController", "RunRecord"]

_MIB = 2**20
#: Backends that can serve a read, in the order the charts show them.
CHART_BACKENDS = READ_BACKENDS


@dataclass(frozen=True)
class BackendOption:
    """One entry of the backend choice.

    Attributes
    ----------
    name : str
        ``"auto"``, ``"kvikio"``, ``"zarr-gpu"`` or ``"cpu"``.
    available : bool
        Whether it can run on this machine.
    reason : str
        Why (not), from :meth:`gpu_zarr.capabilities.Capabilities.backend_status`.
    """

    name: str
    available: bool
    reason: str

    @property
    def label(self) -> str:
        """Text for a combo box: the name, marked when unavailable."""
        return self.name if self.available else f"{self.name} (unavailable)"


@dataclass(frozen=True)
class LevelOption:
    """One resolution level that can be loaded."""

    index: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    @property
    def label(self) -> str:
        """e.g. ``"1: 2×64×256×256 uint16 (16.0 MiB)"``."""
        shape = "×".join(str(s) for s in self.shape)
        return f"{self.index}: {shape} {self.dtype} ({self.nbytes / _MIB:,.1f} MiB)"


@dataclass(frozen=True)
class RunRecord:
    """One measured load, as the history tables show it.

    Attributes
    ----------
    layer : str
        Name of what was loaded (layer or image name).
    level : int
    requested : str
        Backend asked for (may be ``"auto"``).
    backend, reason : str
        Backend that served and why (empty backend when the load failed).
    nbytes : int
    seconds : float
    gib_per_s : float
    gpu_bytes : int
        Device memory the level occupied (0 on the CPU path).
    resident : bool
        Whether the level was kept in GPU memory.
    status : str
        ``"ok"``, ``"cancelled"`` or ``"error: ..."``.
    """

    layer: str
    level: int
    requested: str
    backend: str
    reason: str
    nbytes: int
    seconds: float
    gib_per_s: float
    gpu_bytes: int
    resident: bool
    status: str

    @property
    def ok(self) -> bool:
        """True for a finished load."""
        return self.status == "ok"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from gpu_zarr import reprs

        return reprs.bundle(reprs.run_record_text(self), reprs.run_record_html(self))


class LoadJob:
    """One load of one level, prepared by :meth:`LoaderController.prepare`.

    ``start()`` runs it in a daemon thread; ``cancel()`` asks it to stop (the read raises
    :class:`~gpu_zarr.errors.ReadCancelled` at its next check); ``wait()`` returns its
    :class:`RunRecord`. The callbacks run in the loading thread: a GUI relays them to its
    own thread.

    Attributes
    ----------
    record : RunRecord or None
        Set when the job has finished (also appended to the controller's history).
    result : gpu_zarr.zarr_io.ReadResult or None
        The read, with its data when the controller keeps data, else without.
    done_bytes, total_bytes : int
        Progress so far.
    """

    def __init__(self, controller: LoaderController, name: str, level: int, lazy: GpuLazyArray,
                 backend: str, resident: bool,
                 on_progress: Callable[[int, int], None] | None = None,
                 on_finish: Callable[[LoadJob], None] | None = None) -> None:
        self.controller = controller
        self.name = name
        self.level = level
        self.lazy = lazy
        self.backend = backend
        self.resident = resident
        self.on_progress = on_progress
        self.on_finish = on_finish
        self.cancel_event = threading.Event()
        self.record: RunRecord | None = None
        self.result: Any = None
        self.done_bytes = 0
        self.total_bytes = int(lazy.zarr_array.nbytes)
        self.started_at: float | None = None
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_report = 0.0

    # -- control --------------------------------------------------------------------
    def start(self) -> LoadJob:
        """Run the load in a background (daemon) thread; returns ``self``."""
        if self._thread is not None:
            raise RuntimeError("this load was already started; prepare a new one")
        self._thread = threading.Thread(target=self.run, name="gpu-zarr-load", daemon=True)
        self._thread.start()
        return self

    def cancel(self) -> None:
        """Ask the load to stop; it finishes as a ``"cancelled"`` record."""
        self.cancel_event.set()

    @property
    def finished(self) -> bool:
        """True once the record exists."""
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> RunRecord | None:
        """Block until the load has finished (or ``timeout`` seconds); its record or None."""
        self._finished.wait(timeout)
        return self.record

    def throughput(self) -> float:
        """GiB/s so far (0 before the first progress report)."""
        if self.started_at is None or not self.done_bytes:
            return 0.0
        dt = time.perf_counter() - self.started_at
        return self.done_bytes / 2**30 / dt if dt > 0 else 0.0

    # -- the load itself (runs in the loading thread, or inline when called directly) --
    def _progress(self, done: int, total: int) -> None:
        self.done_bytes, self.total_bytes = int(done), int(total)
        now = time.monotonic()
        if self.on_progress is not None and (done >= total or now - self._last_report > 0.05):
            self._last_report = now  # at most ~20 updates a second reach the GUI
            self.on_progress(int(done), int(total))

    def run(self) -> RunRecord:
        """Do the load in the calling thread; errors become the record's status."""
        from gpu_zarr.zarr_io import read_zarr

        self.started_at = time.perf_counter()
        try:
            if self.cancel_event.is_set():
                raise ReadCancelled("load cancelled before it started")
            if self.resident:
                r = self.lazy.load_resident(progress=self._progress, cancel=self.cancel_event)
            else:
                self.lazy.release_resident()
                r = read_zarr(self.lazy.zarr_array, prefer=check_backend(self.backend), progress=self._progress,
                              cancel=self.cancel_event)
            self.result = r if self.controller.keep_data and not self.resident else dataclasses.replace(r, data=None)
            del r
            rec = RunRecord(self.name, self.level, self.backend, self.result.backend, self.result.reason,
                            int(self.result.nbytes), float(self.result.seconds), float(self.result.gib_per_s),
                            int(self.result.gpu_bytes), self.resident, "ok")
        except ReadCancelled as exc:
            rec = self._failed("cancelled", exc)
        except Exception as exc:  # noqa: BLE001 - a failed load is a history row, not a crash of the GUI
            rec = self._failed(f"error: {exc}", exc)
        self.record = rec
        self.controller._finished(self)
        self._finished.set()
        if self.on_finish is not None:
            self.on_finish(self)
        return rec

    def _failed(self, status: str, exc: BaseException) -> RunRecord:
        return RunRecord(self.name, self.level, self.backend, "", str(exc), 0, 0.0, 0.0, 0, self.resident, status)


class LoaderController:
    """Backend and level choice, loads in a background thread, history and best speeds.

    Parameters
    ----------
    caps : Capabilities, optional
        What this machine offers (default: :func:`gpu_zarr.capabilities.probe`).
    keep_data : bool
        Keep the last load's data (:attr:`last_result`) for the caller (the notebook
        widget does); the napari dock drops it (browsing reads tiles on demand).

    Attributes
    ----------
    history : list of RunRecord
        Every finished load, in order.
    name : str or None
        Name of the current source.
    levels : list of GpuLazyArray
        Its resolution levels (empty when there is nothing to load).
    job : LoadJob or None
        The running load.
    last_result : gpu_zarr.zarr_io.ReadResult or None
        The last successful load (with its data when ``keep_data``).
    """

    def __init__(self, caps: Capabilities | None = None, *, keep_data: bool = False) -> None:
        self.caps = caps if caps is not None else probe()
        self.keep_data = keep_data
        self.history: list[RunRecord] = []
        self.name: str | None = None
        self.levels: list[GpuLazyArray] = []
        self.level = 0
        self.job: LoadJob | None = None
        self.last_result: Any = None
        self._backend = "auto"
        self._lock = threading.Lock()

    # -- the machine -------------------------------------------------------------------
    def device_text(self) -> str:
        """One line about the GPU (or its absence) for the widget's header."""
        c = self.caps
        if c.gpu:
            free = f", {c.free_bytes / 2**30:.1f} GiB free" if c.free_bytes else ""
            return f"GPU: {c.device_name}{free}"
        return "No usable GPU: reads go through the CPU path. " + c.backend_status("kvikio")[1]

    def backend_options(self) -> list[BackendOption]:
        """Every backend with its availability here and the reason."""
        return [BackendOption(b, *self.caps.backend_status(b)) for b in BACKENDS]

    def resident_status(self) -> tuple[bool, str]:
        """Whether "keep the level on the GPU" can be offered here, and why (not)."""
        if self.caps.gpu:
            return True, ("Loads the whole level into device memory (checked against free memory "
                          "first); each plane shown is then a device slice plus one copy.")
        return False, "needs a CUDA GPU: " + self.caps.backend_status("zarr-gpu")[1]

    # -- backend -----------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """The chosen backend name."""
        return self._backend

    def set_backend(self, name: str) -> None:
        """Choose a backend.

        Raises
        ------
        ValueError
            Unknown name, or a backend that cannot run on this machine (with the reason).
        """
        if name not in BACKENDS:
            raise ValueError(f"unknown backend {name!r}; expected one of {BACKENDS}")
        ok, why = self.caps.backend_status(name)
        if not ok:
            raise ValueError(f"backend {name!r} is unavailable here: {why}")
        self._backend = name

    # -- source and level ----------------------------------------------------------------
    def set_source(self, name: str | None, levels: Sequence[GpuLazyArray] | None) -> None:
        """Point the controller at the levels of one image (None: nothing to load).

        The level is reset to 0 and, when the source has a backend that is available
        here, the backend follows it.
        """
        self.name = name if levels else None
        self.levels = list(levels or [])
        self.level = 0
        if self.levels:
            b = self.levels[0].backend
            if b in BACKENDS and self.caps.backend_status(b)[0]:
                self._backend = b

    def open(self, source: Any, *, name: str | None = None) -> None:
        """Load-able levels from a path, a ``zarr.Array`` or lazy arrays.

        Parameters
        ----------
        source : str, os.PathLike, zarr.Array, GpuLazyArray or sequence of GpuLazyArray
            An OME-Zarr image (all its levels), a plain zarr array (one level), or
            levels already wrapped (e.g. a napari layer's data).
        name : str, optional
            Shown in the history; default the image name or the folder name.
        """
        levels, default = _levels_of(source)
        self.set_source(name or default, levels)

    def level_options(self) -> list[LevelOption]:
        """The current source's levels (empty when there is none)."""
        out = []
        for i, lv in enumerate(self.levels):
            a = lv.zarr_array
            out.append(LevelOption(i, tuple(int(s) for s in a.shape), str(lv.dtype), int(a.nbytes)))
        return out

    def set_level(self, index: int) -> None:
        """Choose a level (0 is the full resolution)."""
        if not self.levels:
            raise ValueError("no source: open an image (or select a layer opened with GPU Zarr) first")
        if not 0 <= index < len(self.levels):
            raise IndexError(f"level {index} does not exist: the image has levels 0..{len(self.levels) - 1}")
        self.level = int(index)

    def choice_text(self) -> str:
        """What the chosen backend would do with the chosen level, and why (never raises)."""
        ok, why = self.caps.backend_status(self.backend)
        if not self.levels or not ok:
            return why
        from gpu_zarr.zarr_io import choose_backend

        try:
            choice = choose_backend(self.levels[self.level].zarr_array, prefer=check_backend(self.backend))
        except GpuZarrError as exc:
            return f"cannot serve this level: {exc}"
        return f"→ {choice.backend}: {choice.reason}"

    # -- loading -----------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """True while a load is running."""
        return self.job is not None

    def prepare(self, *, resident: bool = False, on_progress: Callable[[int, int], None] | None = None,
                on_finish: Callable[[LoadJob], None] | None = None) -> LoadJob | None:
        """Set up (but do not start) a load of the chosen level with the chosen backend.

        Browsing of the source's levels follows the chosen backend from now on.

        Parameters
        ----------
        resident : bool
            Keep the whole level in GPU memory (:meth:`GpuLazyArray.load_resident`).
        on_progress : callable, optional
            ``on_progress(done_bytes, total_bytes)``, at most ~20 times a second.
        on_finish : callable, optional
            ``on_finish(job)`` once the job's record exists (also for errors).

        Returns
        -------
        LoadJob or None
            None when there is nothing to load or a load is already running.
        """
        with self._lock:
            if not self.levels or self.job is not None:
                return None
            for lv in self.levels:  # browsing follows the chosen backend
                lv.backend = self.backend
            job = LoadJob(self, self.name or "", self.level, self.levels[self.level], self.backend,
                          bool(resident), on_progress, on_finish)
            self.job = job
            return job

    def load(self, **kwargs: Any) -> LoadJob | None:
        """:meth:`prepare` and start a load; the job (or None when nothing was started)."""
        job = self.prepare(**kwargs)
        return job.start() if job is not None else None

    def cancel(self) -> None:
        """Ask the running load (if any) to stop."""
        job = self.job
        if job is not None:
            job.cancel()

    def _finished(self, job: LoadJob) -> None:
        with self._lock:
            assert job.record is not None
            self.history.append(job.record)
            if job.record.ok and job.result is not None:
                self.last_result = job.result
            if self.job is job:
                self.job = None

    def release_resident(self) -> int:
        """Drop GPU-resident levels of the current source; the bytes freed."""
        freed = sum(lv.resident_bytes for lv in self.levels)
        for lv in self.levels:
            lv.release_resident()
        return freed

    def best_gib_per_s(self) -> dict[str, float]:
        """Best GiB/s of the successful loads, per backend that served, in chart order."""
        best: dict[str, float] = {}
        for r in self.history:
            if r.ok:
                best[r.backend] = max(best.get(r.backend, 0.0), r.gib_per_s)
        return {b: best[b] for b in CHART_BACKENDS if b in best}


def _levels_of(source: Any) -> tuple[list[GpuLazyArray], str]:
    """(levels, default name) of a path, zarr array or lazy arrays."""
    import zarr

    if isinstance(source, GpuLazyArray):
        return [source], source.zarr_array.basename or "array"
    if isinstance(source, (list, tuple)):
        if not source or not all(isinstance(s, GpuLazyArray) for s in source):
            raise TypeError("expected a non-empty sequence of GpuLazyArray levels")
        return list(source), source[0].zarr_array.basename or "array"
    if isinstance(source, zarr.Array):
        return [GpuLazyArray(source)], source.basename or "array"
    if isinstance(source, (str, os.PathLike)):
        from gpu_zarr.omezarr import is_ome_zarr, open_ome
        from gpu_zarr.zarr_io import open_array

        if is_ome_zarr(source):
            img = open_ome(source, with_labels=False)
            return [GpuLazyArray(img.open_level(i)) for i in range(len(img.levels))], img.name
        arr = open_array(source)
        return [GpuLazyArray(arr)], os.path.basename(os.fspath(source).rstrip("/")) or "array"
    raise TypeError(f"expected a path, a zarr.Array or GpuLazyArray levels, got {type(source).__name__}")
