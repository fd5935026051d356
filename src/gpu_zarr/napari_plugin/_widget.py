"""Dock widget: pick a backend and a level, load the selected layer's source, compare speeds.

A view over :class:`gpu_zarr.controller.LoaderController`, which holds the logic (choices,
the load in a background thread, history, best speeds) shared with the notebook widget.
A load reads the whole resolution level (all channels of it) through the chosen backend,
measures it, and switches the layer's browsing to that backend; with "keep on GPU" the
level stays in device memory and every slice napari asks for is a device slice plus one
copy to the host.
"""

from __future__ import annotations

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

from gpu_zarr.controller import CHART_BACKENDS, LoaderController, LoadJob, RunRecord
from gpu_zarr.errors import INSTALL_HINT, hint_shown_above
from gpu_zarr.lazy import GpuLazyArray

__all__ = ["GpuZarrWidget", "RunRecord"]

_MIB = 2**20
_HISTORY_ROWS = 5  # runs the history table shows without scrolling
# short headers so that the nine columns fit the dock without a horizontal scroll; the long
# names are the headers' tooltips
_COLUMNS = ("Layer", "Lvl", "Asked", "Used", "MiB", "s", "GiB/s", "GPU MiB", "Status")
_COLUMN_TIPS = ("layer", "resolution level", "backend asked for", "backend that served the read", "MiB read",
                "seconds", "GiB per second", "GPU memory used, MiB", "ok, resident, cancelled or failed")
_COLORS = {"kvikio": "#76b900", "zarr-gpu": "#1f77b4", "cpu": "#888888"}


class _Relay(QObject):
    """Carries the loading thread's callbacks to the GUI thread (queued signals)."""

    progressed = Signal(object, object)
    finished = Signal(object)


def _fits(layer) -> bool:
    """A layer the widget should preselect: a visible image layer read by GPU Zarr."""
    return bool(getattr(layer, "visible", False)) and getattr(layer, "_type_string", "") == "image" \
        and _lazy_levels(layer) is not None


def _lazy_levels(layer) -> list[GpuLazyArray] | None:
    """The GpuLazyArray levels behind a layer, or None when it is not ours."""
    if layer is None:
        return None
    data = layer.data
    levels = list(data) if getattr(layer, "multiscale", False) else [data]
    if levels and all(isinstance(d, GpuLazyArray) for d in levels):
        return levels
    return None


class GpuZarrWidget(QWidget):
    """Backend picker, level loader, measurements and a history of runs.

    Parameters
    ----------
    napari_viewer : napari.viewer.Viewer
        The viewer whose selected layer is loaded.
    """

    def __init__(self, napari_viewer, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.viewer = napari_viewer
        self.controller = LoaderController()
        self.caps = self.controller.caps
        self._worker: LoadJob | None = None
        self._job_layer = None
        self._relay = _Relay()
        self._relay.progressed.connect(self._on_progress)
        self._relay.finished.connect(self._on_job_finished)

        self.device_label = QLabel(self.controller.device_text())
        self.device_label.setWordWrap(True)
        self.device_label.setToolTip(self.caps.report())
        self.layer_label = QLabel()
        self.backend_combo = QComboBox()
        self._fill_backends()
        self.backend_reason = QLabel()
        self.backend_reason.setWordWrap(True)
        self.level_combo = QComboBox()
        self.resident_check = QCheckBox("keep the level on the GPU (fast browsing)")
        ok, why = self.controller.resident_status()
        self.resident_check.setEnabled(ok)
        self.resident_check.setToolTip(why)
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
        for col, tip in enumerate(_COLUMN_TIPS):
            self.table.horizontalHeaderItem(col).setToolTip(tip)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        # the header and _HISTORY_ROWS runs visible without scrolling (older runs scroll)
        header = self.table.horizontalHeader().sizeHint().height()
        row = self.table.verticalHeader().defaultSectionSize()
        self.table.setMinimumHeight(header + _HISTORY_ROWS * row + 2 * self.table.frameWidth() + 4)
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
        self.backend_combo.currentIndexChanged.connect(self._on_backend_change)
        self.level_combo.currentIndexChanged.connect(self._on_level_change)
        self._inserted: list = []  # layers added since the last preselection
        self.viewer.layers.selection.events.active.connect(self._on_layer_change)
        self.viewer.layers.events.inserted.connect(self._on_inserted)
        self.viewer.layers.events.removed.connect(self._on_layer_change)
        self._preselect(list(self.viewer.layers), only_if_unfit=True)
        self._on_layer_change()

    @property
    def history(self) -> list[RunRecord]:
        """Every finished load (the controller's history)."""
        return self.controller.history

    # -- setup helpers -------------------------------------------------------------
    def _fill_backends(self) -> None:
        model = self.backend_combo.model()
        for i, opt in enumerate(self.controller.backend_options()):
            self.backend_combo.addItem(opt.label, opt.name)
            self.backend_combo.setItemData(i, opt.reason, Qt.ToolTipRole)
            model.item(i).setEnabled(opt.available)

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
        best = self.controller.best_gib_per_s()
        names = list(best)
        bars = ax.bar(names, [best[n] for n in names], color=[_COLORS[n] for n in names], width=0.6)
        ax.set_xlim(-0.6, max(len(names), len(CHART_BACKENDS)) - 0.4)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
        ax.set_ylabel("GiB/s (best)", fontsize=8)
        ax.tick_params(labelsize=8)
        if not names:
            ax.text(0.5, 0.5, "load a level to compare backends", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8, color="gray")
            ax.set_yticks([])
            ax.set_xticks([])  # no bars: no category positions (-0.5...2.5) to label

    def _once(self, text: str) -> str:
        """A reason without the install command when the device line at the top already shows it."""
        return hint_shown_above(text) if INSTALL_HINT in self.device_label.text() else text

    # -- state ---------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """The backend picked in the combo box."""
        return self.backend_combo.currentData()

    def set_backend(self, name: str) -> None:
        """Pick a backend; raises if it is unavailable on this machine."""
        self.controller.set_backend(name)  # raises ValueError with the reason
        self.backend_combo.setCurrentIndex(self.backend_combo.findData(name))

    def _layer(self):
        return self.viewer.layers.selection.active

    def _on_inserted(self, event=None) -> None:
        """napari makes the last added layer active (for an OME-Zarr with labels: the hidden
        Labels layer); once the batch of new layers is in, select the first visible image of it."""
        layer = getattr(event, "value", None)
        if layer is not None:
            self._inserted.append(layer)
        from qtpy.QtCore import QTimer

        QTimer.singleShot(0, self._preselect_inserted)
        self._on_layer_change()

    def _preselect_inserted(self) -> None:
        batch, self._inserted = self._inserted, []
        if batch:
            self._preselect(batch)

    def _preselect(self, candidates: list, *, only_if_unfit: bool = False) -> None:
        """Select the first visible image layer of ours among ``candidates`` (the viewer's
        selection: the widget follows it from then on)."""
        active = self.viewer.layers.selection.active
        if only_if_unfit and active is not None and _fits(active):
            return
        for layer in candidates:
            if layer in self.viewer.layers and _fits(layer):
                if layer is not active:
                    self.viewer.layers.selection.active = layer
                return

    def _on_layer_change(self, *_args) -> None:
        layer = self._layer()
        levels = _lazy_levels(layer)
        self.controller.set_source(layer.name if levels else None, levels)
        self.level_combo.blockSignals(True)
        self.level_combo.clear()
        if levels is None:
            self.layer_label.setText("select a layer opened with GPU Zarr")
        else:
            self.layer_label.setText(layer.name)
            for opt in self.controller.level_options():
                self.level_combo.addItem(opt.label, opt.index)
            self.backend_combo.setCurrentIndex(self.backend_combo.findData(self.controller.backend))
        self.level_combo.blockSignals(False)
        self.load_button.setEnabled(levels is not None and self._worker is None)
        self._update_reason()

    def _on_backend_change(self, *_args) -> None:
        name = self.backend
        if name is not None and self.caps.backend_status(name)[0]:
            self.controller.set_backend(name)
        self._update_reason()

    def _on_level_change(self, *_args) -> None:
        if self.controller.levels:
            self.controller.set_level(max(self.level_combo.currentIndex(), 0))
        self._update_reason()

    def _update_reason(self, *_args) -> None:
        self.backend_reason.setText(self._once(self.controller.choice_text()))

    # -- loading -------------------------------------------------------------------
    def start_load(self) -> None:
        """Load (or reload) the selected layer's level in a background thread."""
        job = self._prepare_load()
        if job is not None:
            job.start()

    def _prepare_load(self) -> LoadJob | None:
        """Set up (but do not start) the load; None when there is nothing to do."""
        if self._worker is not None:
            return None
        resident = self.resident_check.isChecked() and self.resident_check.isEnabled()
        job = self.controller.prepare(resident=resident, on_progress=self._relay.progressed.emit,
                                      on_finish=self._relay.finished.emit)
        if job is None:
            return None
        self._worker, self._job_layer = job, self._layer()
        self.progress_bar.setValue(0)
        self.result_label.setText(f"Reading {job.name} level {job.level} with {job.backend}…")
        self.load_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        return job

    def cancel_load(self) -> None:
        """Ask the running load to stop (it raises ReadCancelled at its next check)."""
        if self._worker is not None:
            self._worker.cancel()
            self.result_label.setText("Cancelling…")

    def release_gpu(self) -> None:
        """Drop GPU-resident levels of the selected layer."""
        freed = self.controller.release_resident()
        self.result_label.setText(f"Freed {freed / _MIB:,.1f} MiB of GPU memory.")

    def _on_progress(self, done: int, total: int) -> None:
        self.progress_bar.setValue(int(1000 * done / total) if total else 1000)

    def _on_job_finished(self, job: LoadJob) -> None:
        rec = job.record
        if rec.ok:
            kept = "kept on the GPU" if rec.resident else ("freed" if rec.gpu_bytes else "host memory")
            self.result_label.setText(
                f"<b>{rec.backend}</b> ({self._once(rec.reason)})<br>{rec.nbytes / _MIB:,.1f} MiB in "
                f"{rec.seconds:.3f} s = <b>{rec.gib_per_s:.2f} GiB/s</b><br>"
                f"GPU memory used: {rec.gpu_bytes / _MIB:,.1f} MiB ({kept})"
            )
            self.progress_bar.setValue(1000)
        else:
            self.result_label.setText("Cancelled." if rec.status == "cancelled"
                                      else f"Load failed: {self._once(rec.reason)}")
        self._add_row(rec)
        if rec.ok and self._job_layer is not None:
            self._job_layer.refresh()  # browsing now goes through the chosen backend
        self._worker = self._job_layer = None
        self.cancel_button.setEnabled(False)
        self.load_button.setEnabled(bool(self.controller.levels))

    def _add_row(self, rec: RunRecord) -> None:
        row = self.table.rowCount()
        self.table.insertRow(row)
        ok = rec.ok
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
