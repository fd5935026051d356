"""The notebook loader widget (ipywidgets), a view over :class:`LoaderController`."""

from __future__ import annotations

import html
import threading
from typing import Any

import ipywidgets as W

from gpu_zarr import reprs
from gpu_zarr.controller import LoaderController, LoadJob, RunRecord
from gpu_zarr.errors import INSTALL_HINT, hint_shown_above

__all__ = ["LoaderWidget"]


class LoaderWidget(W.VBox):
    """Load an OME-Zarr level (or a zarr array) with a chosen backend and compare speeds.

    Parameters
    ----------
    source : path, zarr.Array or GpuLazyArray levels, optional
        What to load: an OME-Zarr image (all its levels), a zarr array (one level).
    name : str, optional
        Shown in the history (default: the image or folder name).
    backend : {"auto", "kvikio", "zarr-gpu", "cpu"}, optional
        Initial choice; must be available here.
    level : int
        Initial level.
    controller : LoaderController, optional
        Share a controller (and its history) with other views.

    Attributes
    ----------
    controller : LoaderController
        The logic: choices, the running job, :attr:`history`.
    result : gpu_zarr.zarr_io.ReadResult or None
        The last successful load, with its data (cupy on a GPU, numpy otherwise).

    Notes
    -----
    A load runs in a background thread: the notebook stays usable, the progress bar
    moves, and **Cancel** stops the read at its next batch. :meth:`wait` blocks until the
    running load has finished (for scripts and executed notebooks).
    """

    def __init__(self, source: Any = None, *, name: str | None = None, backend: str | None = None,
                 level: int = 0, controller: LoaderController | None = None) -> None:
        self.controller = controller if controller is not None else LoaderController(keep_data=True)
        ctl = self.controller
        if source is not None:
            ctl.open(source, name=name)
        if backend is not None:
            ctl.set_backend(backend)
        if ctl.levels:
            ctl.set_level(level)
        self._lock = threading.Lock()
        self._job: LoadJob | None = None

        caps = ctl.caps
        self.header = W.HTML(f"<div style='line-height:1.4'><b>GPU Zarr loader</b> &mdash; "
                             f"{html.escape(ctl.device_text())}</div>")
        self.header.add_class("gpu-zarr-header")
        opts = ctl.backend_options()
        self.backend_select = W.Dropdown(
            options=[(o.label, o.name) for o in opts if o.available], value=ctl.backend,
            description="Backend:", layout=W.Layout(width="260px"))
        missing = [o for o in opts if not o.available]
        self.unavailable = W.HTML(
            "<div style='font-size:12px;opacity:.65;line-height:1.4'>" + "<br>".join(
                f"<code>{html.escape(o.name)}</code> unavailable here: {html.escape(self._once(o.reason))}"
                for o in missing)
            + "</div>" if missing else "")
        self.unavailable.add_class("gpu-zarr-unavailable")
        self.reason = W.HTML()
        self.reason.add_class("gpu-zarr-reason")
        self.level_select = W.Dropdown(description="Level:", layout=W.Layout(width="420px"))
        ok, why = ctl.resident_status()
        self.resident = W.Checkbox(value=False, description="keep the level on the GPU", disabled=not ok,
                                   tooltip=why, indent=False)
        self.load_button = W.Button(description="Load", button_style="primary", icon="play", tooltip="read the level")
        self.load_button.add_class("gpu-zarr-load")
        self.cancel_button = W.Button(description="Cancel", icon="stop", disabled=True)
        self.cancel_button.add_class("gpu-zarr-cancel")
        self.progress = W.FloatProgress(value=0.0, min=0.0, max=1.0, layout=W.Layout(width="320px"))
        self.progress_text = W.HTML()
        self.result_html = W.HTML("No load yet.")
        self.result_html.add_class("gpu-zarr-result-box")
        self.history_html = W.HTML(reprs.history_html(ctl.history))
        self.history_html.add_class("gpu-zarr-history-box")
        self.chart = W.HTML(reprs.best_chart_svg(ctl.best_gib_per_s()))
        self.chart.add_class("gpu-zarr-chart-box")
        super().__init__(children=[
            self.header,
            W.HBox([self.backend_select, self.level_select]),
            self.unavailable,
            self.reason,
            self.resident,
            W.HBox([self.load_button, self.cancel_button, self.progress, self.progress_text]),
            self.result_html,
            W.HTML("<b>History</b>"),
            self.history_html,
            self.chart,
        ])
        self.add_class("gpu-zarr-loader")
        self.header.description_tooltip = caps.report()
        self._fill_levels()
        self.backend_select.observe(self._on_backend, names="value")
        self.level_select.observe(self._on_level, names="value")
        self.load_button.on_click(lambda _b: self.load())
        self.cancel_button.on_click(lambda _b: self.cancel())

    # -- state ----------------------------------------------------------------------------
    @property
    def history(self) -> list[RunRecord]:
        """Every finished load."""
        return self.controller.history

    @property
    def result(self) -> Any:
        """The last successful :class:`~gpu_zarr.zarr_io.ReadResult` (with its data)."""
        return self.controller.last_result

    def _fill_levels(self) -> None:
        ctl = self.controller
        options = [(o.label, o.index) for o in ctl.level_options()]
        self.level_select.options = options
        if options:
            self.level_select.value = ctl.level
        self.level_select.disabled = not options
        self.load_button.disabled = not options or ctl.busy
        self._update_reason()

    def _on_backend(self, change: dict) -> None:
        self.controller.set_backend(change["new"])
        self._update_reason()

    def _on_level(self, change: dict) -> None:
        if change["new"] is not None and self.controller.levels:
            self.controller.set_level(int(change["new"]))
        self._update_reason()

    def _once(self, text: str) -> str:
        """A reason without the install command when the header already shows it."""
        return hint_shown_above(text) if INSTALL_HINT in self.controller.device_text() else text

    def _update_reason(self) -> None:
        text = self._once(self.controller.choice_text()) if self.controller.levels else "open an image to load"
        self.reason.value = f"<div style='font-size:12px;line-height:1.4'>{html.escape(text)}</div>"

    # -- loading --------------------------------------------------------------------------
    def load(self) -> LoadJob | None:
        """Start loading the chosen level in the background (as the Load button does)."""
        job = self.controller.prepare(resident=bool(self.resident.value and not self.resident.disabled),
                                      on_progress=self._on_progress, on_finish=self._on_finish)
        if job is None:
            return None
        self._job = job
        self.load_button.disabled = True
        self.cancel_button.disabled = False
        self.progress.value = 0.0
        self.progress.bar_style = ""
        self.progress_text.value = ""
        self.result_html.value = html.escape(f"Reading {job.name} level {job.level} with {job.backend}…")
        return job.start()

    def cancel(self) -> None:
        """Ask the running load to stop."""
        if self.controller.busy:
            self.controller.cancel()
            self.result_html.value = "Cancelling…"

    def wait(self, timeout: float | None = 120.0) -> RunRecord | None:
        """Block until the running (or last) load has finished; its record."""
        job = self._job
        return None if job is None else job.wait(timeout)

    def _on_progress(self, done: int, total: int) -> None:
        job = self._job
        self.progress.value = done / total if total else 1.0
        rate = job.throughput() if job is not None else 0.0
        self.progress_text.value = (f"<span style='font-size:12px'>{reprs.format_bytes(done)} of "
                                    f"{reprs.format_bytes(total)}, {rate:.2f} GiB/s</span>")

    def _on_finish(self, job: LoadJob) -> None:
        rec = job.record
        assert rec is not None
        self.result_html.value = reprs.run_record_html(rec, self._once)
        if rec.ok:
            self.progress.value = 1.0
            self.progress.bar_style = "success"
            self.progress_text.value = (f"<span style='font-size:12px'>{reprs.format_bytes(rec.nbytes)}, "
                                        f"{rec.gib_per_s:.2f} GiB/s</span>")
        else:
            self.progress.bar_style = "warning" if rec.status == "cancelled" else "danger"
        self.history_html.value = reprs.history_html(self.controller.history)
        self.chart.value = reprs.best_chart_svg(self.controller.best_gib_per_s())
        self.cancel_button.disabled = True
        self.load_button.disabled = not self.controller.levels
