"""File ▸ Open Sample, and a screenshot of the viewer with the widget docked."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import zarr

from gpu_zarr.sample import SAMPLE_NAME

PLUGIN = "napari-gpu-zarr"


def test_open_sample(make_napari_viewer):
    viewer = make_napari_viewer()
    layers = viewer.open_sample(PLUGIN, "blobs")
    assert [ly.name for ly in layers] == ["nuclei", "membranes", "blobs"]
    cache = Path(os.environ["GPU_ZARR_CACHE"]) / SAMPLE_NAME
    assert (cache / "zarr.json").is_file()
    level0 = zarr.open_array(str(cache / "0"), mode="r")
    assert layers[0].data[0].shape == level0.shape[1:]
    np.testing.assert_array_equal(layers[1].data[0][32], level0[1, 32])
    assert not layers[2].visible


def test_screenshot_with_widget(make_napari_viewer, qtbot, tmp_path):
    """Saves a PNG of the whole window; with GPU_ZARR_SCREENSHOT=<path> it is also copied there."""
    viewer = make_napari_viewer(show=True)
    viewer.window._qt_window.resize(1500, 900)
    layers = viewer.open_sample(PLUGIN, "blobs")
    _dock, widget = viewer.window.add_plugin_dock_widget(PLUGIN, "GPU Zarr loader")
    viewer.layers.selection.active = layers[0]
    viewer.dims.set_current_step(0, 32)
    widget.set_backend("cpu")
    for level in (2, 1, 0):
        widget.level_combo.setCurrentIndex(level)
        n = len(widget.history)
        widget.load_button.click()
        qtbot.waitUntil(lambda n=n: len(widget.history) == n + 1 and widget._worker is None,
                        timeout=60_000)
    assert [r.status for r in widget.history] == ["ok"] * 3
    viewer.reset_view()
    qtbot.wait(300)
    out = tmp_path / "screenshot.png"
    img = viewer.screenshot(str(out), canvas_only=False, flash=False)
    assert out.stat().st_size > 10_000
    h, w = img.shape[:2]
    assert w >= 1000 and h >= 600, img.shape
    assert img[..., :3].std() > 5  # not a blank window
    target = os.environ.get("GPU_ZARR_SCREENSHOT")
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, target)
