"""Progress bars for reads: a notebook bar in Jupyter, text in a terminal, nothing on request.

:func:`progress_callback` turns the ``progress=`` argument of
:func:`gpu_zarr.zarr_io.read_zarr` / :func:`~gpu_zarr.zarr_io.read_selection` into the
``progress(done_bytes, total_bytes)`` callback the readers call:

- a callable: used as it is;
- ``None`` or ``False``: no progress;
- ``"auto"`` (the default): a bar that appears only when the read takes longer than about
  a second — tqdm's notebook bar (bytes, GiB/s) in Jupyter, a text bar on a terminal,
  nothing when stderr is not a terminal (logs, CI); the ``progress`` setting "off"
  (``GPU_ZARR_PROGRESS=0``) turns it off, "on" (``GPU_ZARR_PROGRESS=1``) shows it even
  without a terminal;
- ``True``: a bar from the start, wherever the output goes.

:func:`release_after_interrupt` is what a read does when it is interrupted (kernel
interrupt, :class:`KeyboardInterrupt`, or a cancel): the partial buffers referenced by
the traceback's finished frames are dropped and cupy's memory pools give their blocks
back, so an interrupted notebook read does not keep GPU memory alive through
``sys.last_traceback``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from gpu_zarr import settings

__all__ = ["ProgressArg", "TqdmProgress", "in_notebook", "progress_callback", "release_after_interrupt"]

#: What ``progress=`` accepts.
ProgressArg = Callable[[int, int], None] | bool | str | None

#: Seconds a read must last before the "auto" bar shows.
AUTO_DELAY_S = 1.0


def in_notebook() -> bool:
    """True inside a Jupyter kernel (IPython's ZMQ shell), without importing IPython."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # noqa: BLE001 - a broken IPython is not a notebook
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class TqdmProgress:
    """A ``(done_bytes, total_bytes)`` callback drawing a tqdm bar (thread-safe).

    The bar is created at the first report (when the total is known), shows bytes in
    binary units and the rate in GiB/s, and is closed by :meth:`close`.

    Parameters
    ----------
    desc : str
        Label left of the bar.
    notebook : bool
        tqdm's notebook (ipywidgets) bar instead of the text one.
    delay : float
        Seconds before the bar is shown (reads that finish sooner show nothing).
    file : file-like, optional
        Where the text bar goes (default stderr).
    """

    def __init__(self, desc: str = "gpu_zarr read", *, notebook: bool = False, delay: float = 0.0,
                 file: Any = None) -> None:
        self.desc = desc
        self.notebook = notebook
        self.delay = delay
        self.file = file
        self.bar: Any = None
        self._lock = threading.Lock()
        self._closed = False

    def _make(self, total: int) -> Any:
        if self.notebook:
            try:
                from tqdm.notebook import tqdm as bar_cls
            except ImportError:  # ipywidgets missing: text bar
                from tqdm.std import tqdm as bar_cls
        else:
            from tqdm.std import tqdm as bar_cls
        return bar_cls(total=total, desc=self.desc, unit="iB", unit_scale=True, unit_divisor=1024,
                       delay=self.delay, leave=True, file=self.file, mininterval=0.2)

    def __call__(self, done: int, total: int) -> None:
        with self._lock:
            if self._closed:
                return
            if self.bar is None:
                self.bar = self._make(int(total))
            elif total and self.bar.total != total:
                self.bar.total = int(total)
            step = int(done) - self.bar.n
            if step > 0:
                self.bar.update(step)

    def close(self, *, failed: bool = False) -> None:
        """Finish the bar (red in a notebook when ``failed``); later reports are ignored."""
        with self._lock:
            self._closed = True
            bar, self.bar = self.bar, None
        if bar is None:
            return
        if failed and self.notebook and hasattr(bar, "disp"):
            with contextlib.suppress(Exception):
                bar.disp(bar_style="danger")
        bar.close()


@contextlib.contextmanager
def progress_callback(progress: ProgressArg = "auto", *, desc: str = "gpu_zarr read"
                      ) -> Iterator[Callable[[int, int], None] | None]:
    """Turn a ``progress=`` value into a ``(done_bytes, total_bytes)`` callback.

    Parameters
    ----------
    progress : callable, bool, "auto" or None
        See the module docstring.
    desc : str
        Label of the bar.

    Yields
    ------
    callable or None
        The callback to hand to the reader (None: report nothing). A bar is closed when
        the block ends, marked failed when it ends with an exception.

    Raises
    ------
    ValueError
        ``progress`` is none of the accepted values.
    """
    if callable(progress):
        yield progress
        return
    if progress is None or progress is False:
        yield None
        return
    if progress is not True and progress != "auto":
        raise ValueError(f"progress must be a callable (done_bytes, total_bytes), True, False, None or "
                         f"'auto'; got {progress!r}")
    mode = settings.get("progress")
    notebook = in_notebook()
    if progress == "auto":
        if mode == "off":
            yield None
            return
        if not (notebook or mode == "on" or _stderr_is_terminal()):
            yield None
            return
    try:
        import tqdm  # noqa: F401
    except ImportError:  # tqdm is a dependency; a broken install reads without a bar
        yield None
        return
    bar = TqdmProgress(desc, notebook=notebook, delay=AUTO_DELAY_S if progress == "auto" else 0.0)
    failed = False
    try:
        yield bar
    except BaseException:
        failed = True
        raise
    finally:
        bar.close(failed=failed)


def _stderr_is_terminal() -> bool:
    try:
        return bool(sys.stderr is not None and sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False


def release_after_interrupt(exc: BaseException) -> None:
    """Free what an interrupted read held, before its exception travels on.

    Clears the local variables of the traceback's finished frames (partial output arrays,
    staging buffers) so that a kept traceback (IPython's ``sys.last_traceback``, a test's
    ``excinfo``) does not keep them alive, and returns the blocks of cupy's default
    memory pools to the driver when cupy is already imported.

    Parameters
    ----------
    exc : BaseException
        The exception being handled (typically KeyboardInterrupt or ReadCancelled).
    """
    tb = exc.__traceback__
    if tb is not None:
        traceback.clear_frames(tb)  # frames still executing (the caller's) are skipped
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        with contextlib.suppress(Exception):
            cupy.get_default_memory_pool().free_all_blocks()
            cupy.get_default_pinned_memory_pool().free_all_blocks()
