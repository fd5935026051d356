"""The README tells the truth: its two commands, its sections, links that resolve, the napari
extra and the apt line (the same as .ci/run's), the Python keywords it names, and a package
without the measured results."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_two_commands_and_the_sections_in_order():
    assert 'pip install -e . && gpu-zarr demo' in README
    assert 'pip install -e ".[test]" && python -m pytest' in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -e ".[test]" && python -m pytest\n' in ci  # CI runs the README's test command
    heads = re.findall(r"^## (.+)$", README, flags=re.M)
    assert heads == ["What it does", "napari", "Python", "Writing", "Jupyter", "Remote stores", "HCS plates", "Command line",
                     "Speed", "Tests", "More"], heads
    assert len(README.splitlines()) < 160  # short: details live in docs/ and benchmarks/README.md


def test_every_notebook_listed():
    for nb in sorted((ROOT / "examples").glob("*.ipynb")):
        assert f"`{nb.name}`" in README, nb.name


def test_local_links_resolve():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
    for doc in docs:
        text = doc.read_text(encoding="utf-8")
        for link in re.findall(r"\]\(([^)#\s]+)", text) + re.findall(r'<img src="([^"]+)"', text):
            if "://" in link:
                continue
            assert (doc.parent / link).exists(), f"{doc.relative_to(ROOT)}: {link}"


def test_no_duplicate_pages_and_no_run_logs_in_docs():
    assert not (ROOT / "docs" / "dask-section.md").exists()
    remote = (ROOT / "docs" / "remote.md").read_text(encoding="utf-8")
    assert "Earlier run" not in remote and "Latest run" not in remote and len(remote.splitlines()) < 200


def test_napari_extra_is_the_binding_napari_recommends_and_test_agrees():
    import tomllib  # Python >= 3.11, as the project requires

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    napari = [d for d in extras["napari"] if d.startswith("napari[")]
    assert napari == ["napari[pyqt6]>=0.5"], extras["napari"]
    assert "napari[pyqt6]>=0.5" in extras["test"] and not any("pyqt5" in d.lower() for d in extras["test"])
    assert 'pip install -e ".[napari]"' in README and "PyQt6" in README


def test_the_apt_line_is_ci_s_and_the_error_helpers():
    from gpu_zarr.napari_plugin.qt_check import APT_LINE, APT_PACKAGES

    assert APT_LINE in README
    ci = (ROOT / ".ci" / "run").read_text()
    block = re.search(r'QT_PACKAGES="([^"]+)"', ci).group(1)
    assert [w for w in block.split() if w != "\\"] == list(APT_PACKAGES)  # bash drops the backslash-newlines


def test_the_python_keywords_the_readme_names_exist():
    """``read_zarr(backend=...)`` raised TypeError while the README said it worked (issue #37)."""
    import gpu_zarr
    from gpu_zarr.lazy import GpuLazyArray
    from gpu_zarr.zarr_io import prepare, read_zarr, read_zarr_to_gpu

    funcs = {"read_zarr": read_zarr, "read_zarr_to_gpu": read_zarr_to_gpu, "prepare": prepare,
             "GpuLazyArray": GpuLazyArray, "to_dask": gpu_zarr.to_dask,
             "read_omezarr": gpu_zarr.read_omezarr}
    for name, kw in re.findall(r"`(\w+)\([^`]*?\b(\w+)=", README):
        if name in funcs:
            assert kw in inspect.signature(funcs[name]).parameters, f"{name}({kw}=...)"
    said = re.search(r"The backend is (.+?)\n\n", README, flags=re.S).group(1)
    for kw, names in re.findall(r"`(\w+)=` in ((?:`\w+`(?:, | and )?)+)", said):
        for name in re.findall(r"`(\w+)`", names):
            assert kw in inspect.signature(funcs[name]).parameters, f"{name}({kw}=...)"
    code = README.split("## Python", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    for name, args in re.findall(r"\b(\w+)\(([^()]*)\)", code):
        for kw in re.findall(r"\b(\w+)=", args):
            if name in funcs:
                assert kw in inspect.signature(funcs[name]).parameters, f"{name}({kw}=...)"


def test_results_stay_out_of_the_sdist_and_the_wheel():
    pytest.importorskip("hatchling")
    from hatchling.builders.sdist import SdistBuilder
    from hatchling.builders.wheel import WheelBuilder

    for builder in (SdistBuilder(str(ROOT)), WheelBuilder(str(ROOT))):
        files = [f.distribution_path for f in builder.recurse_included_files()]
        assert files and not [f for f in files if "results/" in f], type(builder).__name__
    results = ROOT / "benchmarks" / "results"
    assert sorted(p.name for p in results.iterdir()) == ["cpu-2core", "h100", "h200"]  # one folder per machine
    for machine in results.iterdir():
        assert (machine / "README.md").is_file() and (machine / "scripts").is_dir(), machine.name
