"""Dock widget: pick a backend and a level, load the selected layer's source, compare speeds.

A load reads the whole resolution level (all channels of it) through the chosen
backend in a worker thread, measures it, and switches the layer's browsing to that
backend; with "keep on GPU" the level stays in device memory and every slice napari
asks for is a device slice plus one copy to the host.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass

from qtpy.QtCore import QObject, Qt, Signal
from qtpy.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gpu_zarr.errors import GpuZarrError, ReadCancelled
from gpu_zarr.lazy import BACKENDS, GpuLazyArray

__all__ = ["GpuZarrWidget", "RunRecord"]

_MIB = 2**20
_COLUMNS = ("Layer", "Level", "Asked", "Backend", "MiB", "Seconds", "GiB/s", "GPU MiB", "Status")


@dataclass(frozen=True)
class RunRecord:
    """One measured load, as shown in the history table."""

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
    status: str  # "ok", "cancelled" or "error: ..."


class _Relay(QObject):
    """Carries progress from the reading thread to the GUI thread (queued signal)."""

    progressed = Signal(object, object)

    def __init__(self) -> None:
        super().__init__()
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done >= total or now - self._last > 0.05:  # at most ~20 updates a second
            self._last = now
            self.progressed.emit(int(done), int(total))


def _lazy_levels(layer) -> list[GpuLazyArray] | None:
    """The GpuLazyArray levels behind a layer, or None when it is not ours."""
    if layer is None:
        return None
    data = layer.data
    levels = list(data) if getattr(layer, "multiscale", False) else [data]
    if levels and all(isinstance(d, GpuLazyArray) for d in levels):
        return levels
    return None


def _load(lazy: GpuLazyArray, backend: str, resident: bool, cancel, progress):
    """Worker-thread body: one measured read of the whole level (all its channels)."""
    if cancel.is_set():
        raise ReadCancelled("load cancelled before it started")
    if resident:
        r = lazy.load_resident(progress=progress, cancel=cancel)
    else:
        from gpu_zarr.zarr_io import read_zarr

        lazy.release_resident()
        r = read_zarr(lazy.zarr_array, prefer=backend, progress=progress, cancel=cancel)
    # the data itself is dropped here unless resident: browsing reads tiles on demand
    return dataclasses.replace(r, data=None), resident


class GpuZarrWidget(QWidget):
    """Backend picker, level loader, measurements and a history of runs.

    Parameters
    ----------
    napari_viewer : napari.viewer.Viewer
        The viewer whose selected layer is loaded.
    """

    def __init__(self, napari_viewer, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        from gpu_zarr.capabilities import probe

        self.viewer = napari_viewer
        self.caps = probe()
        self.history: list[RunRecord] = []
        self._worker = None
        self._cancel: threading.Event | None = None
        self._relay = _Relay()
        self._relay.progressed.connect(self._on_progress)

        self.device_label = QLabel(self._device_text())
        self.device_label.setWordWrap(True)
        self.device_label.setToolTip(self.caps.report())
        self.layer_label = QLabel()
        self.backend_combo = QComboBox()
        self._fill_backends()
        self.backend_reason = QLabel()
        self.backend_reason.setWordWrap(True)
        self.level_combo = QComboBox()
        self.resident_check = QCheckBox("keep the level on the GPU (fast browsing)")
        ok = bool(self.caps.gpu)
        self.resident_check.setEnabled(ok)
        self.resident_check.setToolTip(
            "Loads the whole level into device memory (checked against free memory first); "
            "each plane napari shows is then a device slice plus one copy."
            if ok else "needs a CUDA GPU: " + self.caps.backend_status("zarr-gpu")[1]
        )
        self.load_button = QPushButton("Load")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.release_button = QPushButton("Free GPU memory")
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setFormat("%p%")
        self.result_label = QLabel("No load yet.")
        self.result_label.setWordWrap(True)
        self.result_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.table = QTableWidget(0, len(_COLUMNS))
        self.table.setHorizontalHeaderLabels(_COLUMNS)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.setMinimumHeight(120)
        self.canvas, self._axes = self._make_chart()

        form = QFormLayout()
        form.addRow("Layer:", self.layer_label)
        form.addRow("Backend:", self.backend_combo)
        form.addRow("", self.backend_reason)
        form.addRow("Level:", self.level_combo)
        form.addRow("", self.resident_check)
        buttons = QHBoxLayout()
        for b in (self.load_button, self.cancel_button, self.release_button):
            buttons.addWidget(b)
        self.setMinimumWidth(460)
        layout = QVBoxLayout(self)
        layout.addWidget(self.device_label)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.progress_bar)
        layout.addWidget(self.result_label)
        layout.addWidget(QLabel("History"))
        layout.addWidget(self.table)
        layout.addWidget(self.canvas)

        self.load_button.clicked.connect(self.start_load)
        self.cancel_button.clicked.connect(self.cancel_load)
        self.release_button.clicked.connect(self.release_gpu)
        self.backend_combo.currentIndexChanged.connect(self._update_reason)
        self.level_combo.currentIndexChanged.connect(self._update_reason)
        self.viewer.layers.selection.events.active.connect(self._on_layer_change)
        self.viewer.layers.events.inserted.connect(self._on_layer_change)
        self.viewer.layers.events.removed.connect(self._on_layer_change)
        self._on_layer_change()

    # -- setup helpers -------------------------------------------------------------
    def _device_text(self) -> str:
        c = self.caps
        if c.gpu:
            free = f", {c.free_bytes / 2**30:.1f} GiB free" if c.free_bytes else ""
            return f"GPU: {c.device_name}{free}"
        return "No usable GPU: reads go through the CPU path. " + c.backend_status("kvikio")[1]

    def _fill_backends(self) -> None:
        model = self.backend_combo.model()
        for i, name in enumerate(BACKENDS):
            ok, why = self.caps.backend_status(name)
            self.backend_combo.addItem(name if ok else f"{name} (unavailable)", name)
            self.backend_combo.setItemData(i, why, Qt.ToolTipRole)
            model.item(i).setEnabled(ok)

    def _make_chart(self):
        from matplotlib.backends.backend_qtagg import FigureCanvasQTAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(3.2, 1.8), layout="constrained")
        canvas = FigureCanvasQTAgg(fig)
        canvas.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        canvas.setFixedHeight(170)
        ax = fig.add_subplot()
        self._draw_chart(ax)
        return canvas, ax

    def _draw_chart(self, ax) -> None:
        ax.clear()
        best: dict[str, float] = {}
        for r in self.history:
            if r.status == "ok":
                best[r.backend] = max(best.get(r.backend, 0.0), r.gib_per_s)
        names = [b for b in ("kvikio", "zarr-gpu", "cpu") if b in best]
        colors = {"kvikio": "#76b900", "zarr-gpu": "#1f77b4", "cpu": "#888888"}
        bars = ax.bar(names, [best[n] for n in names], color=[colors[n] for n in names], width=0.6)
        ax.set_xlim(-0.6, max(len(names), 3) - 0.4)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
        ax.set_ylabel("GiB/s (best)", fontsize=8)
        ax.tick_params(labelsize=8)
        if not names:
            ax.text(0.5, 0.5, "load a level to compare backends", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8, color="gray")
            ax.set_yticks([])

    # -- state ---------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """The backend picked in the combo box."""
        return self.backend_combo.currentData()

    def set_backend(self, name: str) -> None:
        """Pick a backend; raises if it is unavailable on this machine."""
        i = self.backend_combo.findData(name)
        if i < 0:
            raise ValueError(f"unknown backend {name!r}; expected one of {BACKENDS}")
        if not self.backend_combo.model().item(i).isEnabled():
            raise ValueError(f"backend {name!r} is unavailable here: {self.caps.backend_status(name)[1]}")
        self.backend_combo.setCurrentIndex(i)

    def _layer(self):
        return self.viewer.layers.selection.active

    def _on_layer_change(self, *_args) -> None:
        layer = self._layer()
        levels = _lazy_levels(layer)
        self.level_combo.blockSignals(True)
        self.level_combo.clear()
        if levels is None:
            self.layer_label.setText("select a layer opened with GPU Zarr")
        else:
            self.layer_label.setText(layer.name)
            for i, lv in enumerate(levels):
                a = lv.zarr_array
                shape = "×".join(str(s) for s in a.shape)
                self.level_combo.addItem(f"{i}: {shape} {lv.dtype} ({a.nbytes / _MIB:,.1f} MiB)", i)
            i = self.backend_combo.findData(levels[0].backend)
            if i >= 0 and self.backend_combo.model().item(i).isEnabled():
                self.backend_combo.setCurrentIndex(i)
        self.level_combo.blockSignals(False)
        busy = self._worker is not None
        self.load_button.setEnabled(levels is not None and not busy)
        self._update_reason()

    def _selected(self) -> tuple[object, list[GpuLazyArray], int] | None:
        layer = self._layer()
        levels = _lazy_levels(layer)
        if levels is None:
            return None
        return layer, levels, max(self.level_combo.currentIndex(), 0)

    def _update_reason(self, *_args) -> None:
        sel = self._selected()
        ok, why = self.caps.backend_status(self.backend)
        text = why
        if sel is not None and ok:
            from gpu_zarr.zarr_io import choose_backend

            _, levels, i = sel
            try:
                choice = choose_backend(levels[i].zarr_array, prefer=self.backend)
                text = f"→ {choice.backend}: {choice.reason}"
            except GpuZarrError as exc:
                text = f"cannot serve this level: {exc}"
        self.backend_reason.setText(text)

    # -- loading -------------------------------------------------------------------
    def start_load(self) -> None:
        """Load (or reload) the selected layer's level in a worker thread."""
        worker = self._prepare_load()
        if worker is not None:
            worker.start()

    def _prepare_load(self):
        """Set up (but do not start) the worker for a load; None when there is nothing to do."""
        from napari.qt.threading import create_worker

        sel = self._selected()
        if sel is None or self._worker is not None:
            return None
        layer, levels, i = sel
        backend = self.backend
        for lv in levels:  # browsing follows the chosen backend
            lv.backend = backend
        resident = self.resident_check.isChecked() and self.resident_check.isEnabled()
        self._cancel = threading.Event()
        self.progress_bar.setValue(0)
        self.result_label.setText(f"Reading {layer.name} level {i} with {backend}…")
        worker = create_worker(
            _load, levels[i], backend, resident, self._cancel, self._relay,
            _start_thread=False, _ignore_errors=True,  # errors become history rows
            _progress={"desc": f"GPU Zarr: {layer.name} level {i} ({backend})"},
        )
        worker.returned.connect(lambda res, _l=layer, _i=i, _b=backend: self._on_done(_l, _i, _b, res))
        worker.errored.connect(lambda exc, _l=layer, _i=i, _b=backend: self._on_error(_l, _i, _b, exc))
        worker.finished.connect(self._on_finished)
        self._worker = worker
        self.load_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        return worker

    def cancel_load(self) -> None:
        """Ask the running load to stop (it raises ReadCancelled at its next check)."""
        if self._cancel is not None:
            self._cancel.set()
            self.result_label.setText("Cancelling…")

    def release_gpu(self) -> None:
        """Drop GPU-resident levels of the selected layer."""
        levels = _lazy_levels(self._layer()) or []
        freed = sum(lv.resident_bytes for lv in levels)
        for lv in levels:
            lv.release_resident()
        self.result_label.setText(f"Freed {freed / _MIB:,.1f} MiB of GPU memory.")

    def _on_progress(self, done: int, total: int) -> None:
        self.progress_bar.setValue(int(1000 * done / total) if total else 1000)

    def _on_done(self, layer, level: int, requested: str, done) -> None:
        m, resident = done  # (ReadResult without its data, kept resident?)
        rec = RunRecord(layer.name, level, requested, m.backend, m.reason, int(m.nbytes), float(m.seconds),
                        float(m.gib_per_s), int(m.gpu_bytes), resident, "ok")
        kept = "kept on the GPU" if resident else ("freed" if rec.gpu_bytes else "host memory")
        self.result_label.setText(
            f"<b>{rec.backend}</b> ({rec.reason})<br>{rec.nbytes / _MIB:,.1f} MiB in "
            f"{rec.seconds:.3f} s = <b>{rec.gib_per_s:.2f} GiB/s</b><br>"
            f"GPU memory used: {rec.gpu_bytes / _MIB:,.1f} MiB ({kept})"
        )
        self.progress_bar.setValue(1000)
        self._record(rec)
        layer.refresh()

    def _on_error(self, layer, level: int, requested: str, exc: BaseException) -> None:
        status = "cancelled" if isinstance(exc, ReadCancelled) else f"error: {exc}"
        self.result_label.setText("Cancelled." if status == "cancelled" else f"Load failed: {exc}")
        self._record(RunRecord(layer.name, level, requested, "", str(exc), 0, 0.0, 0.0, 0, False, status))

    def _on_finished(self) -> None:
        self._worker = None
        self._cancel = None
        self.cancel_button.setEnabled(False)
        self.load_button.setEnabled(_lazy_levels(self._layer()) is not None)

    def _record(self, rec: RunRecord) -> None:
        self.history.append(rec)
        row = self.table.rowCount()
        self.table.insertRow(row)
        ok = rec.status == "ok"
        cells = (rec.layer, str(rec.level), rec.requested, rec.backend,
                 f"{rec.nbytes / _MIB:,.1f}" if ok else "", f"{rec.seconds:.3f}" if ok else "",
                 f"{rec.gib_per_s:.2f}" if ok else "", f"{rec.gpu_bytes / _MIB:,.1f}" if ok else "",
                 ("ok, resident" if rec.resident else "ok") if ok else rec.status)
        for col, text in enumerate(cells):
            item = QTableWidgetItem(text)
            item.setToolTip(rec.reason)
            self.table.setItem(row, col, item)
        self.table.resizeColumnsToContents()
        self.table.scrollToBottom()
        self._draw_chart(self._axes)
        self.canvas.draw_idle()
