"""GUI tests run in a real napari under Xvfb (pytest-xvfb starts it).

Without a usable X server (or Qt platform plugin) the GUI tests skip with the reason,
except when ``GPU_ZARR_REQUIRE_GUI=1`` (CI), where they fail instead.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

GUI_FIXTURES = {"make_napari_viewer", "qtbot"}
_QT_PROBE = (
    "from qtpy.QtWidgets import QApplication; import napari, magicgui; "
    "app = QApplication([]); print(app.platformName())"
)


@functools.lru_cache(maxsize=1)
def gui_problem() -> str | None:
    """Why no GUI can be shown here, or None when Qt starts on a display."""
    if sys.platform.startswith("linux") and os.environ.get("QT_QPA_PLATFORM") != "offscreen":
        display = os.environ.get("DISPLAY")
        if not display and not os.environ.get("WAYLAND_DISPLAY"):
            return ("no X server: DISPLAY is not set (install Xvfb so pytest-xvfb can start one, "
                    "e.g. apt-get install xvfb xauth)")
    # Start Qt in a child process: a missing xcb library aborts the process, not a test.
    try:
        proc = subprocess.run([sys.executable, "-c", _QT_PROBE], capture_output=True, text=True,
                              timeout=120, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return "starting a Qt application timed out"
    if proc.returncode != 0:
        from gpu_zarr.napari_plugin.qt_check import explain

        return "Qt cannot start on this display: " + explain(proc.stderr or proc.stdout)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before any fixture (pytest-qt's session QApplication aborts the process without a display)."""
    if GUI_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
        return
    if item.get_closest_marker("skip") is not None:  # e.g. a gpu test on a machine without one
        return
    problem = gui_problem()
    if problem is None:
        return
    if os.environ.get("GPU_ZARR_REQUIRE_GUI") == "1":
        pytest.fail(f"GUI required (GPU_ZARR_REQUIRE_GUI=1) but unavailable: {problem}", pytrace=False)
    pytest.skip(f"GUI tests need a display: {problem}")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Sample data goes to a per-session cache, never the user's ~/.cache: the ``cache_dir``
    setting for this process, ``GPU_ZARR_CACHE`` for the processes it starts."""
    from gpu_zarr import settings

    cache = str(tmp_path_factory.getbasetemp() / "gpu-zarr-cache")
    monkeypatch.setenv("GPU_ZARR_CACHE", cache)
    with settings.set(cache_dir=cache):
        yield


@pytest.fixture
def reset_cpu_notice(monkeypatch):
    from gpu_zarr.napari_plugin import _reader

    monkeypatch.setattr(_reader, "_cpu_notice_shown", False)


@pytest.fixture(scope="session")
def small_stores(tmp_path_factory) -> dict[str, Path]:
    """OME-Zarr 0.4 (zarr v2) and 0.5 (zarr v3) images with labels, written by zarr-python."""
    from gpu_zarr.sample import write_sample_omezarr

    base = tmp_path_factory.mktemp("ome")
    return {
        v: write_sample_omezarr(base / f"img-{v}.ome.zarr", version=v, shape=(2, 12, 96, 80),
                                levels=3, chunks=(1, 4, 32, 32), seed=7)
        for v in ("0.4", "0.5")
    }
