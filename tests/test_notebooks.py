"""Every notebook in examples/ runs top to bottom in a fresh kernel (nbclient), on the CPU path here.

Notebooks that open napari need a display, like the GUI tests: without one they skip with
the reason, except under ``GPU_ZARR_REQUIRE_GUI=1`` (CI), where they fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
TIMEOUT_S = int(os.environ.get("GPU_ZARR_NB_TIMEOUT", "180"))  # per cell


def _needs_display(path: Path) -> bool:
    return "import napari" in path.read_text(encoding="utf-8")


def _gui_problem() -> str | None:
    """The GUI tests' own check (tests/napari_plugin/conftest.py), loaded by path."""
    spec = importlib.util.spec_from_file_location("_gpu_zarr_gui_conftest",
                                                  Path(__file__).parent / "napari_plugin" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.gui_problem()


def test_examples_exist():
    names = {p.stem for p in NOTEBOOKS}
    assert {"quickstart", "lazy_browsing", "loader_widget", "benchmark_your_store",
            "napari_from_jupyter"} <= names, names


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
    if _needs_display(path):
        pytest.importorskip("napari")
        problem = _gui_problem()
        if problem is not None:
            if os.environ.get("GPU_ZARR_REQUIRE_GUI") == "1":
                pytest.fail(f"GUI required (GPU_ZARR_REQUIRE_GUI=1) but unavailable: {problem}")
            pytest.skip(f"{path.name} opens napari and needs a display: {problem}")
    # the kernel inherits this environment: sample data in a private cache, no bars in logs
    monkeypatch.setenv("GPU_ZARR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    src = Path(__file__).resolve().parents[1] / "src"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
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
