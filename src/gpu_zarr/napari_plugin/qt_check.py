"""Why Qt (and so napari) cannot start here, in words a user can act on.

Qt's xcb platform plugin aborts the process when a system library is missing and prints
only ``Could not load the Qt platform plugin "xcb"``. This module names the missing
libraries (``ldd`` on the plugin, without starting Qt) and the one Debian/Ubuntu line that
installs every library napari needs (the same packages ``.ci/run`` installs). It imports
only ``qtpy.QtCore``, which never aborts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

__all__ = ["APT_LINE", "APT_PACKAGES", "explain", "last_error_line", "missing_libraries"]

# The system packages napari's Qt (xcb platform plugin, OpenGL) needs on Debian/Ubuntu, and a
# virtual display (xvfb, xauth) for machines without a screen. .ci/run installs exactly these
# (tests/test_readme.py checks that it, the README and this tuple agree).
APT_PACKAGES = (
    "xvfb", "xauth", "libxcb-icccm4", "libxcb-keysyms1", "libxcb-image0", "libxcb-render-util0",
    "libxcb-xinerama0", "libxcb-xkb1", "libxkbcommon-x11-0", "libxcb-randr0", "libxcb-shape0",
    "libxcb-cursor0", "libgl1", "libegl1", "libgl1-mesa-dri", "libglib2.0-0", "libfontconfig1", "libdbus-1-3",
    "libxkbcommon0", "libxcb-xfixes0", "libxcb-shm0", "libxcb-sync1", "libxcb-render0", "libx11-xcb1",
)
APT_LINE = "sudo apt-get install " + " ".join(APT_PACKAGES)

# Lines of a Python traceback that carry no message: source lines are indented, and the
# position markers of Python 3.11+ are runs of ^ and ~.
_MARKERS = re.compile(r"^[\s^~]*$")


def last_error_line(text: str) -> str:
    """The message of the last error in a child's stderr (not a ``^^^^`` marker or a source line)."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip() and not _MARKERS.match(ln)]
    unindented = [ln for ln in lines if not ln.startswith(" ")]
    picked = unindented or lines
    return picked[-1].strip() if picked else ""


def _xcb_plugin() -> Path | None:
    """The Qt xcb platform plugin of the installed binding (found without starting Qt)."""
    try:
        from qtpy import QtCore
    except Exception:  # noqa: BLE001 - no binding at all is reported by the caller's import
        return None
    info = QtCore.QLibraryInfo
    if hasattr(info, "path"):  # Qt 6
        plugins = info.path(info.LibraryPath.PluginsPath)
    else:  # Qt 5
        plugins = info.location(info.PluginsPath)
    path = Path(plugins) / "platforms" / "libqxcb.so"
    return path if path.is_file() else None


def missing_libraries() -> list[str]:
    """Shared libraries Qt's xcb plugin needs and the system lacks (``ldd``: "not found").

    Empty where nothing is missing or where it cannot be told (not Linux, no ldd, no plugin).
    """
    plugin = _xcb_plugin()
    ldd = shutil.which("ldd")
    if plugin is None or ldd is None:
        return []
    try:
        out = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted({ln.split("=>")[0].strip() for ln in out.splitlines() if "not found" in ln})


def explain(stderr: str) -> str:
    """One readable sentence from a failed Qt/napari start: the error, the missing libraries, the fix."""
    msg = last_error_line(stderr)
    if "Could not load the Qt platform plugin" in stderr or "xcb" in msg:
        msg = 'Qt could not load its "xcb" platform plugin'
    missing = missing_libraries()
    if missing:
        return f"{msg}: missing system libraries {', '.join(missing)}; on Debian/Ubuntu: {APT_LINE}"
    if "xcb" in msg or "libGL" in stderr or "EGL" in stderr:
        return f"{msg}; on Debian/Ubuntu the libraries napari needs come with: {APT_LINE}"
    return msg
