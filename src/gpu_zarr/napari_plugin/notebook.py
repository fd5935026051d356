"""napari driven from a notebook (or any script): a viewer that fails clearly without a display,
and screenshots with real pixels from a hidden window.

``napari.Viewer()`` in a kernel with Qt's libraries but no display (a GPU server's
JupyterHub) aborts the process: Qt's xcb plugin calls ``abort()``, the kernel dies. Here Qt is
first started in a child process; when it cannot start, :func:`viewer` tries Qt's
``offscreen`` platform (also in a child first) and otherwise raises
:class:`GuiUnavailable` saying what to do, and the kernel lives on.

A viewer created with ``show=False`` renders nothing (its screenshot is black):
:func:`screenshot` shows the window for the moment of the capture, then hides it again.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from typing import Any

from gpu_zarr.errors import GuiUnavailable
from gpu_zarr.napari_plugin.qt_check import explain

__all__ = ["GuiUnavailable", "display_problem", "png", "screenshot", "viewer", "viewer_problem"]

_PROBE = (
    "import os; os.environ.setdefault('NAPARI_APPLICATION_IPY_INTERACTIVE', 'false'); "
    "import napari, numpy; v = napari.Viewer(show=False); v.add_image(numpy.ones((8, 8))); "
    "v.window._qt_window.show(); v.screenshot(canvas_only=True, flash=False); v.close(); print('ok')"
)


def _probe(env: dict[str, str]) -> str | None:
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=180, env=env)
    except subprocess.TimeoutExpired:
        return "starting napari timed out"
    if proc.returncode == 0 and proc.stdout.strip().endswith("ok"):
        return None
    return f"napari cannot start (exit status {proc.returncode}): {explain(proc.stderr or proc.stdout)}"


@functools.lru_cache(maxsize=4)
def _problem_for(display: str, wayland: str, platform: str) -> str | None:
    return _probe(os.environ.copy())


def display_problem() -> str | None:
    """Why napari cannot start in this process's environment, or None when it can.

    Tried in a child process (cached per DISPLAY / QT_QPA_PLATFORM), so a Qt abort never
    takes this process (a notebook kernel) down.
    """
    if sys.platform.startswith("linux") and os.environ.get("QT_QPA_PLATFORM") != "offscreen" \
            and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        return "no display: DISPLAY is not set"
    return _problem_for(os.environ.get("DISPLAY", ""), os.environ.get("WAYLAND_DISPLAY", ""),
                        os.environ.get("QT_QPA_PLATFORM", ""))


@functools.lru_cache(maxsize=4)
def _offscreen_problem(display: str, wayland: str, platform: str) -> str | None:
    return _probe(dict(os.environ, QT_QPA_PLATFORM="offscreen"))


def viewer_problem() -> str | None:
    """Why :func:`viewer` would raise :class:`GuiUnavailable` here, or None when it can open a viewer.

    None when napari starts on the display or, failing that, on Qt's ``offscreen`` platform.
    Both are tried in child processes (cached), so this process never aborts.
    """
    problem = display_problem()
    if problem is None:
        return None
    key = (os.environ.get("DISPLAY", ""), os.environ.get("WAYLAND_DISPLAY", ""), os.environ.get("QT_QPA_PLATFORM", ""))
    offscreen = _offscreen_problem(*key)
    if offscreen is None:
        return None
    return (f"napari needs a display and none is usable here ({problem}); Qt's offscreen platform "
            f"does not work either ({offscreen}). Start Jupyter under a virtual display "
            "(apt-get install xvfb; xvfb-run -a jupyter lab) or on a machine with a screen. "
            "The library itself (gpu_zarr.read_zarr, lazy arrays, the notebook widget) needs no display.")


def viewer(*, show: bool = False, **kwargs: Any) -> Any:
    """A ``napari.Viewer``, or a clear :class:`GuiUnavailable` where napari cannot start.

    Parameters
    ----------
    show : bool
        Show the window (False: hidden; :func:`screenshot` still captures real pixels).
    **kwargs
        Passed to ``napari.Viewer``.

    Raises
    ------
    GuiUnavailable
        No display and Qt's offscreen platform cannot render napari either. The message says
        how to get one (a virtual display: ``xvfb-run -a jupyter lab``).
    """
    if display_problem() is not None:
        problem = viewer_problem()
        if problem is not None:
            raise GuiUnavailable(problem)
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    os.environ.setdefault("NAPARI_APPLICATION_IPY_INTERACTIVE", "false")  # no Qt loop in the kernel
    import napari

    return napari.Viewer(show=show, **kwargs)


def screenshot(v: Any, *, canvas_only: bool = True) -> Any:
    """The viewer's picture as an (H, W, 4) uint8 array, with real pixels even when hidden.

    A hidden napari window renders black: it is shown for the capture and hidden again.
    """
    qt_window = v.window._qt_window
    hidden = not qt_window.isVisible()
    if hidden:
        qt_window.show()
    try:
        from qtpy.QtWidgets import QApplication

        QApplication.processEvents()
        return v.screenshot(canvas_only=canvas_only, flash=False)
    finally:
        if hidden:
            qt_window.hide()


def png(v: Any, *, canvas_only: bool = True) -> Any:
    """The screenshot as an ``IPython.display.Image`` (PNG) for a notebook cell."""
    import io

    import imageio.v3 as iio
    from IPython.display import Image

    buf = io.BytesIO()
    iio.imwrite(buf, screenshot(v, canvas_only=canvas_only), extension=".png")
    return Image(data=buf.getvalue(), format="png")
