"""Every notebook in examples/ runs top to bottom in a fresh kernel (nbclient), on the CPU path here.

Notebooks that open napari (``examples/run_notebooks.py``'s ``needs_napari``) need a display, like
the GUI tests: without one they skip with the reason, except under ``GPU_ZARR_REQUIRE_GUI=1`` (CI),
where they fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
TIMEOUT_S = int(os.environ.get("GPU_ZARR_NB_TIMEOUT", "180"))  # per cell


def _runner():
    """examples/run_notebooks.py, loaded by path: the one rule for which notebooks need napari."""
    spec = importlib.util.spec_from_file_location("_gpu_zarr_run_notebooks", EXAMPLES / "run_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _skip_or_fail_without_gui(name: str, problem: str) -> None:
    if os.environ.get("GPU_ZARR_REQUIRE_GUI") == "1":
        pytest.fail(f"GUI required (GPU_ZARR_REQUIRE_GUI=1) but unavailable: {problem}", pytrace=False)
    pytest.skip(f"{name} opens napari and needs a display: {problem}")


def test_examples_exist():
    names = {p.stem for p in NOTEBOOKS}
    assert {"quickstart", "lazy_browsing", "loader_widget", "benchmark_your_store",
            "napari_from_jupyter"} <= names, names


def test_the_napari_notebook_is_known_to_need_napari():
    runner = _runner()
    assert runner.needs_napari(EXAMPLES / "napari_from_jupyter.ipynb")
    # a mention of napari in a message is not an import of it
    assert not runner.needs_napari(EXAMPLES / "quickstart.ipynb")


def test_without_a_display_the_runner_skips_the_napari_notebook_and_exits_0(tmp_path):
    pytest.importorskip("napari")
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM",
                                                            "XAUTHORITY")}
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLES.parent / "src"), env.get("PYTHONPATH", "")])
    env["GPU_ZARR_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "run_notebooks.py"), str(EXAMPLES / "napari_from_jupyter.ipynb")],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = proc.stdout.split("=== summary")[-1]
    # skipped with the reason (napari may also render on Qt's offscreen platform: then it ran)
    assert "napari_from_jupyter.ipynb: skipped: napari needs a display" in summary or \
        "napari_from_jupyter.ipynb: ok" in summary, summary
    assert "^^^" not in proc.stdout


def test_notebooks_say_what_the_cpu_path_is_now():
    """The CPU path is the native host path (not "numpy via zarr-python"), and the install hint is
    the install-aware one (the package is installed from a checkout, not by its PyPI name)."""
    for path in NOTEBOOKS:
        text = path.read_text(encoding="utf-8")
        assert "numpy via zarr-python" not in text, path.name
        assert 'pip install \\"napari-gpu-zarr[' not in text, path.name


def test_notebooks_are_committed_without_outputs():
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert not cell.get("outputs") and cell.get("execution_count") is None, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    if _runner().needs_napari(path):
        pytest.importorskip("napari")
        problem = _runner().napari_problem()
        if problem is not None:
            _skip_or_fail_without_gui(path.name, problem)
    # the kernel inherits this environment: sample data in a private cache, no bars in logs
    monkeypatch.setenv("GPU_ZARR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    src = Path(__file__).resolve().parents[1] / "src"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        if exc.ename == "GuiUnavailable":  # napari could not start in the kernel after all
            _skip_or_fail_without_gui(path.name, exc.evalue)
        raise
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors
    text = "\n".join(str(o.get("text", "")) + json.dumps(o.get("data", {})) for o in outputs)
    if path.stem in ("quickstart", "lazy_browsing", "benchmark_your_store"):
        assert "GPU" in text  # it says which path it took
    if path.stem == "quickstart":
        assert "gpu-zarr-read-result" in text and "gpu-zarr-ome-image" in text and "gpu-zarr-chart" in text
    if path.stem == "loader_widget":
        assert "application/vnd.jupyter.widget-view+json" in text
        assert " level 0: " in text and "GiB/s" in text and "Load failed" not in text
    if path.stem == "napari_from_jupyter":
        assert "status='ok'" in text
        pngs = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
        assert pngs, "no screenshot shown"
        import base64
        import io

        import imageio.v3 as iio

        img = iio.imread(io.BytesIO(base64.b64decode(pngs[0])))
        assert img.shape[0] > 100 and img.shape[1] > 100
        assert img[..., :3].max() > 50 and img[..., :3].std() > 5, "the screenshot is blank"
