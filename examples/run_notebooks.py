"""Run every notebook in this folder with plain Python (no Jupyter kernel) and report speeds.

For machines without Jupyter (e.g. a GPU box with only numpy, cupy, tqdm, matplotlib and the
project's wheels): each notebook's code cells run in order in one namespace, as a kernel
would run them. The last expression of a cell is "displayed" as its plain-text repr (rich
objects through their ``text/plain``); ``display()`` and ``IPython.display`` work without
IPython; line magics and shell escapes (``%...``, ``!...``) are skipped with a note, and
cell magics (``%%time``...) run their body. A notebook whose imports are missing (e.g.
ipywidgets, napari) is reported as skipped, not failed.

At the end each notebook's backend and GiB/s are printed: from the ``ReadResult`` objects
(``gpu_zarr.zarr_io.ReadResult``) and loader runs (``gpu_zarr.controller.RunRecord``) it
left in its namespace.

Usage::

    python3 examples/run_notebooks.py [NOTEBOOK ...]    # default: every examples/*.ipynb
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAX_TEXT = 1500  # characters of a displayed value that are printed


def _plain(obj: object) -> str:
    for meth in ("_repr_mimebundle_",):
        fn = getattr(obj, meth, None)
        if fn is not None:
            with contextlib.suppress(Exception):
                data = fn()
                if isinstance(data, tuple):
                    data = data[0]
                if isinstance(data, dict) and "text/plain" in data:
                    return str(data["text/plain"])
    if type(obj).__name__ == "HTML" and hasattr(obj, "data"):
        return f"<HTML output, {len(str(obj.data))} characters>"
    return repr(obj)


def _show(obj: object) -> None:
    if obj is None:
        return
    text = _plain(obj)
    print(text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"... [{len(text)} characters]")


def _ipython_display_shim() -> types.ModuleType | None:
    """A tiny IPython.display when IPython is not installed (HTML, Markdown, Image, display)."""
    try:
        import IPython.display  # noqa: F401

        return None
    except ImportError:
        pass
    mod = types.ModuleType("IPython.display")

    class _Obj:
        def __init__(self, data=None, filename=None, **_kw):
            self.data, self.filename = data, filename

        def __repr__(self):
            what = self.filename or f"{len(str(self.data))} characters"
            return f"<{type(self).__name__}: {what}>"

    for name in ("HTML", "Markdown", "Image", "SVG", "JSON"):
        setattr(mod, name, type(name, (_Obj,), {}))
    mod.display = lambda *objs, **_kw: [_show(o) for o in objs] and None
    mod.clear_output = lambda *a, **k: None
    pkg = types.ModuleType("IPython")
    pkg.display = mod
    pkg.get_ipython = lambda: None
    return pkg


def _strip_magics(src: str) -> str:
    lines = src.splitlines()
    if lines and lines[0].lstrip().startswith("%%"):
        print(f"  (cell magic {lines[0].strip()!r}: running its body)")
        lines = lines[1:]
    out = []
    for line in lines:
        s = line.lstrip()
        if s.startswith(("%", "!")):
            print(f"  (skipped {s.split()[0]!r}: needs IPython)")
            out.append(line[: len(line) - len(s)] + "pass")
        else:
            out.append(line)
    return "\n".join(out)


def _run_cell(src: str, ns: dict, name: str) -> None:
    tree = ast.parse(_strip_magics(src), filename=name)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body = tree.body[:-1]
    exec(compile(tree, name, "exec"), ns)  # noqa: S102 - running the notebook is the point
    if last is not None:
        _show(eval(compile(ast.Expression(last.value), name, "eval"), ns))


def _speeds(ns: dict) -> list[str]:
    out = []
    for key, val in ns.items():
        if key.startswith("_"):
            continue
        vals = [val]
        history = getattr(getattr(val, "controller", None), "history", None)
        if isinstance(history, list):
            vals = history
        for v in vals:
            t = type(v).__name__
            if t in ("ReadResult", "RunRecord") and getattr(v, "backend", ""):
                out.append(f"{key}: {v.backend} {v.gib_per_s:.2f} GiB/s ({v.nbytes / 2**20:.1f} MiB)")
    return out


def needs_napari(path: Path) -> bool:
    """Whether a notebook's code opens napari (``import napari`` or our ``gpu_zarr.napari_plugin``)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                     for c in nb["cells"] if c["cell_type"] == "code")
    return re.search(r"^\s*(import napari|from napari\b|from gpu_zarr\.napari_plugin\b|import gpu_zarr\.napari_plugin)",
                     code, re.MULTILINE) is not None


def napari_problem() -> str | None:
    """Why napari cannot open a viewer in this environment (None: it can), tried in child processes."""
    try:
        import napari  # noqa: F401
    except ImportError as exc:
        return f"needs napari ({exc}); pip install -e \".[napari]\""
    from gpu_zarr.napari_plugin.notebook import viewer_problem

    return viewer_problem()


def _cannot_run(path: Path) -> str | None:
    """Why a notebook cannot run here (napari without a display would abort the process)."""
    return napari_problem() if needs_napari(path) else None


def run(path: Path) -> tuple[str, float, list[str]]:
    """Run one notebook; (status, seconds, speed lines)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    ns: dict = {"__name__": "__main__", "__file__": str(path)}
    t0 = time.perf_counter()
    old_cwd = os.getcwd()
    os.chdir(path.parent)
    try:
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] != "code":
                continue
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            print(f"--- [{i}] {src.splitlines()[0][:70] if src else ''}")
            try:
                _run_cell(src, ns, f"{path.name}[{i}]")
            except ImportError as exc:
                return f"skipped: {exc}", time.perf_counter() - t0, _speeds(ns)
            except Exception as exc:  # noqa: BLE001 - reported, then the next notebook runs
                if type(exc).__name__ == "GuiUnavailable":  # napari cannot start here: a skip, with why
                    return f"skipped: {exc}", time.perf_counter() - t0, _speeds(ns)
                traceback.print_exc()
                return "FAILED", time.perf_counter() - t0, _speeds(ns)
    finally:
        os.chdir(old_cwd)
        with contextlib.suppress(Exception):
            import matplotlib.pyplot as plt

            plt.close("all")
    return "ok", time.perf_counter() - t0, _speeds(ns)


def main(argv: list[str] | None = None) -> int:
    """Run the notebooks given (default: all in this folder); 1 if any failed (a skip is not a failure)."""
    args = list(sys.argv[1:] if argv is None else argv)
    paths = [Path(a) for a in args] or sorted(HERE.glob("*.ipynb"))
    shim = _ipython_display_shim()
    if shim is not None:
        sys.modules["IPython"], sys.modules["IPython.display"] = shim, shim.display
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("GPU_ZARR_CACHE", str(Path(tempfile.gettempdir()) / "gpu-zarr-notebooks-cache"))
    src = HERE.parent / "src"
    if src.is_dir() and str(src) not in sys.path:
        sys.path.insert(0, str(src))
    from gpu_zarr.capabilities import probe

    print(probe().report())
    summary = []
    for p in paths:
        print(f"\n=== {p.name}")
        why = _cannot_run(p)
        if why:
            print(f"  skipped: {why}")
            summary.append((p.name, f"skipped: {why}", 0.0, []))
            continue
        status, secs, speeds = run(p)
        summary.append((p.name, status, secs, speeds))
    print("\n=== summary")
    failed = 0
    for name, status, secs, speeds in summary:
        failed += status == "FAILED"
        print(f"{name}: {status} in {secs:.1f} s")
        for s in speeds:
            print(f"    {s}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
