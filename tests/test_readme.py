"""The README: its first commands, every notebook listed, links that resolve; the napari extra brings Qt."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_first_commands_and_napari_first():
    assert 'pip install -e . && gpu-zarr demo' in README
    assert 'pip install -e ".[test]" && python -m pytest' in README
    heads = re.findall(r"^## (.+)$", README, flags=re.M)
    assert heads[:5] == ["Open a store in napari", "The dock widget", "Backends", "Remote stores",
                         "HCS plates and wells"], heads
    assert "From Jupyter" in heads and "Native host path" in heads


def test_every_notebook_listed():
    for nb in sorted((ROOT / "examples").glob("*.ipynb")):
        assert f"`{nb.name}`" in README, nb.name


def test_local_links_resolve():
    # docs/remote.md and docs/native.md come with the remote-store and native-path work
    pending = {"docs/remote.md", "docs/native.md"}
    for doc in [ROOT / "README.md", ROOT / "docs" / "engine.md", ROOT / "docs" / "dask.md"]:
        for link in re.findall(r"\]\(([^)#\s]+)", doc.read_text(encoding="utf-8")):
            if "://" in link or link in pending:
                continue
            assert (doc.parent / link).exists(), f"{doc.name}: {link}"


def test_napari_extra_brings_a_qt_binding():
    import tomllib  # Python >= 3.11, as the project requires

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(re.match(r"(napari\[pyqt5\]|napari\[pyqt6\]|napari\[pyside6\]|pyqt5|pyqt6|pyside6)", d, re.I)
               for d in extras["napari"]), extras["napari"]


def test_remote_section_names_schemes_and_options():
    section = README.split("## Remote stores", 1)[1].split("\n## ", 1)[0]
    for word in ("s3://", "gs://", "http", "storage_options", "--storage-option", "--anon", "AWS_ENDPOINT_URL"):
        assert word in section, word
