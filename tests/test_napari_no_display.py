"""Without a display our napari helper fails clearly (or renders offscreen) and the process lives on.

Run in a child process with DISPLAY, WAYLAND_DISPLAY and QT_QPA_PLATFORM unset, whatever display
this session has (pytest-xvfb's included): the situation of a Jupyter kernel on a GPU server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("napari")

_CHILD = """
from gpu_zarr.napari_plugin import notebook
try:
    v = notebook.viewer()
except notebook.GuiUnavailable as exc:
    print("CLEAR ERROR:", exc)
else:
    import numpy
    v.add_image(numpy.arange(64, dtype="uint8").reshape(8, 8))
    img = notebook.screenshot(v)
    print("OFFSCREEN", int(img[..., :3].max()))
print("STILL ALIVE")
"""


def test_no_display_raises_a_clear_error_and_the_process_survives():
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM",
                                                            "XAUTHORITY")}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "STILL ALIVE" in proc.stdout
    if "CLEAR ERROR:" in proc.stdout:
        assert "napari needs a display" in proc.stdout and "xvfb-run" in proc.stdout
    else:  # Qt's offscreen platform rendered it: real pixels
        assert "OFFSCREEN" in proc.stdout and int(proc.stdout.split("OFFSCREEN")[1].split()[0]) > 0
