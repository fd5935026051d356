"""Regenerate docs/screenshot.png: napari with the sample opened and the GPU Zarr loader docked.

The one way to make the README's napari picture, so that it shows what the plugin says today:

    xvfb-run -a python docs/make_screenshot.py            # writes docs/screenshot.png
    xvfb-run -a python docs/make_screenshot.py out.png    # or another path

It opens *File ▸ Open Sample ▸ GPU Zarr: Synthetic OME-Zarr* (written to a private cache),
docks the loader, loads levels 2, 1 and 0 with the ``cpu`` backend (the history and chart
fill in) and saves the whole window. ``tests/napari_plugin/test_sample_and_screenshot.py``
runs :func:`make` on every GUI test run, so the script cannot rot.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PLUGIN = "napari-gpu-zarr"
DEFAULT_OUT = Path(__file__).resolve().parent / "screenshot.png"
WINDOW = (1500, 900)  # pixels: wide enough for the dock's history table and chart
TIMEOUT_S = 60.0  # per level load


def _wait(widget: Any, runs: int) -> None:
    """Spin Qt's event loop until the loader finished ``runs`` loads (the load runs in a thread)."""
    from qtpy.QtWidgets import QApplication

    deadline = time.monotonic() + TIMEOUT_S
    while len(widget.history) < runs or widget._worker is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the loader did not finish load {runs} within {TIMEOUT_S:.0f} s")
        QApplication.processEvents()
        time.sleep(0.01)


def make(out: Path, viewer: Any = None) -> Any:
    """Take the screenshot into ``out`` (PNG) and return it as an (H, W, 4) array.

    ``viewer``: a shown napari viewer to use (the tests pass pytest's); by default one is made.
    """
    import napari
    from qtpy.QtWidgets import QApplication

    own = viewer is None
    if own:
        viewer = napari.Viewer(show=True)
    try:
        viewer.window._qt_window.resize(*WINDOW)
        layers = viewer.open_sample(PLUGIN, "blobs")
        _dock, widget = viewer.window.add_plugin_dock_widget(PLUGIN, "GPU Zarr loader")
        viewer.layers.selection.active = layers[0]
        viewer.dims.set_current_step(0, 32)
        widget.set_backend("cpu")  # the same picture on every machine
        for level in (2, 1, 0):
            widget.level_combo.setCurrentIndex(level)
            n = len(widget.history)
            widget.load_button.click()
            _wait(widget, n + 1)
        failed = [r for r in widget.history if r.status != "ok"]
        if failed:
            raise RuntimeError(f"a load failed: {failed[0].reason}")
        viewer.reset_view()
        for _ in range(30):  # let the canvas and the chart draw
            QApplication.processEvents()
            time.sleep(0.01)
        out.parent.mkdir(parents=True, exist_ok=True)
        return viewer.screenshot(str(out), canvas_only=False, flash=False)
    finally:
        if own:
            viewer.close()


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else DEFAULT_OUT
    from gpu_zarr import settings

    # the sample goes to a private cache (unless GPU_ZARR_CACHE names one), never the user's ~/.cache
    if not settings.get("cache_dir"):
        settings.set(cache_dir=str(Path(tempfile.gettempdir()) / "gpu-zarr-screenshot-cache"))
    img = make(out)
    print(f"wrote {out} ({img.shape[1]}x{img.shape[0]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
