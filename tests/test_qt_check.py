"""Why Qt cannot start, in words a user can act on (gpu_zarr.napari_plugin.qt_check), from real
child processes: a Python error and a real Qt abort without a display."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpu_zarr.napari_plugin.qt_check import APT_LINE, explain, last_error_line, missing_libraries


def test_the_last_error_line_has_no_position_markers():
    proc = subprocess.run([sys.executable, "-c", "x = None\nresult = x.decode('utf-8')"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    line = last_error_line(proc.stderr)
    assert line.startswith("AttributeError:") and "decode" in line
    assert "^" not in explain(proc.stderr)


def test_a_real_qt_abort_names_the_plugin_and_the_apt_line():
    pytest.importorskip("qtpy")
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY")}
    env["QT_QPA_PLATFORM"] = "xcb"  # no display: the xcb plugin cannot start and Qt aborts
    proc = subprocess.run([sys.executable, "-c", "from qtpy.QtWidgets import QApplication; QApplication([])"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0
    text = explain(proc.stderr)
    assert text.startswith('Qt could not load its "xcb" platform plugin') and APT_LINE in text, text


def test_missing_libraries_is_a_list_of_library_names():
    pytest.importorskip("qtpy")
    libs = missing_libraries()
    assert isinstance(libs, list) and all(lib.startswith("lib") and ".so" in lib for lib in libs)
