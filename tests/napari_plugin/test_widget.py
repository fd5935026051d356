"""The dock widget in a real napari: backends, levels, loads in a worker, history, chart."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from gpu_zarr.capabilities import probe
from gpu_zarr.lazy import BACKENDS

PLUGIN = "napari-gpu-zarr"


@pytest.fixture
def viewer_and_widget(make_napari_viewer, small_stores):
    viewer = make_napari_viewer()
    layers = viewer.open(str(small_stores["0.5"]), plugin=PLUGIN)
    _dock, widget = viewer.window.add_plugin_dock_widget(PLUGIN, "GPU Zarr loader")
    viewer.layers.selection.active = layers[0]
    return viewer, widget, layers


def _wait_for_run(qtbot, widget, n):
    qtbot.waitUntil(lambda: len(widget.history) == n and widget._worker is None, timeout=30_000)


def test_backend_combo_reflects_capabilities(viewer_and_widget):
    _viewer, widget, _ = viewer_and_widget
    caps = probe()
    combo = widget.backend_combo
    assert [combo.itemData(i) for i in range(combo.count())] == list(BACKENDS)
    for i, name in enumerate(BACKENDS):
        ok, why = caps.backend_status(name)
        assert combo.model().item(i).isEnabled() is ok
        assert combo.itemData(i, 3) == why  # Qt.ToolTipRole: the reason, shown on hover
        assert ("unavailable" in combo.itemText(i)) is (not ok)
    if not caps.gpu:
        with pytest.raises(ValueError, match="unavailable here"):
            widget.set_backend("kvikio")
        assert not widget.resident_check.isEnabled()


def test_level_picker_follows_the_selected_layer(viewer_and_widget):
    viewer, widget, layers = viewer_and_widget
    assert widget.layer_label.text() == "nuclei"
    assert widget.level_combo.count() == 3
    assert widget.level_combo.itemText(2).startswith("2: 2×12×24×20 uint16")
    viewer.layers.selection.active = layers[2]  # the labels layer
    assert widget.layer_label.text() == "blobs" and widget.level_combo.count() == 3
    viewer.add_points(np.zeros((1, 3)))  # not ours: nothing to load
    assert widget.level_combo.count() == 0 and not widget.load_button.isEnabled()


def test_load_cpu_then_history_and_chart(qtbot, viewer_and_widget, small_stores):
    viewer, widget, layers = viewer_and_widget
    widget.set_backend("cpu")
    widget.level_combo.setCurrentIndex(1)
    assert "cpu" in widget.backend_reason.text()
    widget.load_button.click()
    _wait_for_run(qtbot, widget, 1)
    rec = widget.history[0]
    level1 = zarr.open_array(str(small_stores["0.5"] / "1"), mode="r")
    assert (rec.status, rec.backend, rec.requested, rec.level, rec.layer) == ("ok", "cpu", "cpu", 1, "nuclei")
    assert rec.nbytes == level1.nbytes and rec.seconds > 0 and rec.gib_per_s > 0 and rec.gpu_bytes == 0
    assert widget.table.rowCount() == 1
    assert [widget.table.item(0, c).text() for c in (0, 1, 3, 8)] == ["nuclei", "1", "cpu", "ok"]
    assert "GiB/s" in widget.result_label.text() and widget.progress_bar.value() == 1000
    assert [t.get_text() for t in widget._axes.get_xticklabels()] == ["cpu"]
    # browsing now goes through the chosen backend and still shows zarr's pixels
    assert all(d.backend == "cpu" for d in layers[0].data)
    np.testing.assert_array_equal(layers[0].data[1][4], level1[0, 4])
    # a second run, other layer and level 0: a second row
    viewer.layers.selection.active = layers[1]
    widget.level_combo.setCurrentIndex(0)
    widget.load_button.click()
    _wait_for_run(qtbot, widget, 2)
    assert widget.table.rowCount() == 2 and widget.history[1].layer == "membranes"
    assert widget.history[1].nbytes == zarr.open_array(str(small_stores["0.5"] / "0"), mode="r").nbytes


def test_cancel_records_a_cancelled_run(qtbot, viewer_and_widget):
    _viewer, widget, _ = viewer_and_widget
    widget.set_backend("cpu")
    worker = widget._prepare_load()
    assert widget.cancel_button.isEnabled() and not widget.load_button.isEnabled()
    widget.cancel_load()
    worker.start()
    _wait_for_run(qtbot, widget, 1)
    assert widget.history[0].status == "cancelled"
    assert widget.table.item(0, 8).text() == "cancelled"
    assert widget.load_button.isEnabled() and not widget.cancel_button.isEnabled()


def test_resident_without_gpu_is_an_error_row(qtbot, viewer_and_widget):
    _viewer, widget, _ = viewer_and_widget
    if probe().gpu:
        pytest.skip("has a GPU: covered by the gpu test")
    widget.resident_check.setEnabled(True)  # force it on, as if the GPU vanished
    widget.resident_check.setChecked(True)
    widget.load_button.click()
    _wait_for_run(qtbot, widget, 1)
    assert widget.history[0].status.startswith("error: GPU-resident mode needs a GPU backend")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "zarr-gpu", "kvikio"])
def test_gpu_resident_load(qtbot, viewer_and_widget, small_stores, backend):
    viewer, widget, layers = viewer_and_widget
    widget.set_backend(backend)
    widget.resident_check.setChecked(True)
    widget.load_button.click()
    _wait_for_run(qtbot, widget, 1)
    rec = widget.history[0]
    assert rec.status == "ok" and rec.resident and rec.backend in ("kvikio", "zarr-gpu")
    assert rec.gpu_bytes == zarr.open_array(str(small_stores["0.5"] / "0"), mode="r").nbytes
    assert layers[0].data[0].is_resident and layers[1].data[0].is_resident  # channels share
    cpu = zarr.open_array(str(small_stores["0.5"] / "0"), mode="r")
    for z in (0, 5, 11):
        np.testing.assert_array_equal(layers[1].data[0][z], cpu[1, z])
    widget.release_gpu()
    assert not layers[0].data[0].is_resident


def test_preselects_first_visible_image_and_follows_selection(make_napari_viewer, qtbot, small_stores):
    viewer = make_napari_viewer()
    _dock, widget = viewer.window.add_plugin_dock_widget(PLUGIN, "GPU Zarr loader")
    layers = viewer.open(str(small_stores["0.5"]), plugin=PLUGIN)
    assert layers[-1]._type_string == "labels" and not layers[-1].visible
    qtbot.waitUntil(lambda: viewer.layers.selection.active is layers[0], timeout=5_000)
    assert widget.layer_label.text() == layers[0].name  # not the hidden Labels layer napari made active
    viewer.layers.selection.active = layers[1]  # the user picks another layer: the widget follows
    qtbot.waitUntil(lambda: widget.layer_label.text() == layers[1].name, timeout=5_000)
    viewer.layers.selection.active = layers[-1]  # even the hidden labels, when the user asks for it
    qtbot.waitUntil(lambda: widget.layer_label.text() == layers[-1].name, timeout=5_000)


def test_docked_after_opening_preselects_first_visible_image(make_napari_viewer, qtbot, small_stores):
    viewer = make_napari_viewer()
    layers = viewer.open(str(small_stores["0.4"]), plugin=PLUGIN)
    assert viewer.layers.selection.active is layers[-1]  # napari's choice: the last (hidden labels) layer
    _dock, widget = viewer.window.add_plugin_dock_widget(PLUGIN, "GPU Zarr loader")
    assert viewer.layers.selection.active is layers[0] and widget.layer_label.text() == layers[0].name


def test_the_install_hint_shows_once_and_nothing_needs_scrolling(qtbot, viewer_and_widget):
    """Issue #37: the dock showed the pip hint three times, a history needing a scroll for two
    runs and x ticks -0.5...2.5 on the empty chart."""
    from qtpy.QtWidgets import QLabel

    from gpu_zarr.errors import INSTALL_HINT
    from gpu_zarr.napari_plugin._widget import _HISTORY_ROWS

    _viewer, widget, _ = viewer_and_widget
    texts = [lab.text() for lab in widget.findChildren(QLabel)]
    if not probe().gpu:
        assert sum(t.count(INSTALL_HINT) for t in texts) == 1, texts
    assert len(widget._axes.get_xticks()) == 0 and len(widget._axes.get_yticks()) == 0
    widget.set_backend("cpu")
    for n in range(1, 3):
        widget.load_button.click()
        _wait_for_run(qtbot, widget, n)
    table = widget.table
    rows_height = sum(table.rowHeight(r) for r in range(table.rowCount()))
    assert table.minimumHeight() >= table.horizontalHeader().height() + _HISTORY_ROWS * table.rowHeight(0) - 4
    assert table.viewport().height() >= rows_height or table.height() < table.minimumHeight()
    if not probe().gpu:
        assert sum(lab.text().count(INSTALL_HINT) for lab in widget.findChildren(QLabel)) == 1
    assert len(widget._axes.get_xticks()) == 1  # one bar: the cpu backend
