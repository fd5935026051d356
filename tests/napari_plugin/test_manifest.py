"""The npe2 manifest ships inside the package, byte-identical to the top-level file."""

from __future__ import annotations

import importlib.resources
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_packaged_manifest_equals_top_level_file():
    top = (ROOT / "napari.yaml").read_bytes()
    packaged = importlib.resources.files("gpu_zarr").joinpath("napari.yaml").read_bytes()
    assert packaged == top
    link = ROOT / "src" / "gpu_zarr" / "napari.yaml"
    assert link.is_symlink() and Path(link.readlink()) == Path("../../napari.yaml")


def _resolve(python_name: str):
    import importlib

    module, _, attr = python_name.partition(":")
    return getattr(importlib.import_module(module), attr)


def test_npe2_discovers_reader_widget_and_sample():
    from npe2 import PluginManager

    pm = PluginManager.instance()
    pm.discover()
    mf = pm.get_manifest("napari-gpu-zarr")
    assert mf.display_name == "GPU Zarr"
    (reader,) = mf.contributions.readers
    assert reader.accepts_directories and "*.zarr" in reader.filename_patterns
    assert [w.display_name for w in mf.contributions.widgets] == ["GPU Zarr loader"]
    assert [s.key for s in mf.contributions.sample_data] == ["blobs"]
    for cmd in mf.contributions.commands:  # every python_name resolves
        assert callable(_resolve(cmd.python_name)), cmd.python_name
    # image files stay with napari's builtins: no "choose a reader" dialog for them
    assert "napari-gpu-zarr" not in {r.plugin_name for r in pm.iter_compatible_readers(["x.tif"])}


def test_built_wheel_holds_the_real_manifest(tmp_path):
    builders = pytest.importorskip("hatchling.builders.wheel")
    (wheel,) = builders.WheelBuilder(str(ROOT)).build(directory=str(tmp_path), versions=["standard"])
    with zipfile.ZipFile(wheel) as zf:
        info = zf.getinfo("gpu_zarr/napari.yaml")
        assert (info.external_attr >> 16) & 0o170000 != 0o120000, "stored as a symlink"
        assert zf.read(info) == (ROOT / "napari.yaml").read_bytes()
        entry_points = next(n for n in zf.namelist() if n.endswith("entry_points.txt"))
        assert "napari-gpu-zarr = gpu_zarr:napari.yaml" in zf.read(entry_points).decode()
