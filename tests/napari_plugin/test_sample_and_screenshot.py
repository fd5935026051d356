"""File ▸ Open Sample, and a screenshot of the viewer with the widget docked."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import zarr

from gpu_zarr.sample import SAMPLE_NAME, default_cache_dir

PLUGIN = "napari-gpu-zarr"


def test_open_sample(make_napari_viewer):
    viewer = make_napari_viewer()
    layers = viewer.open_sample(PLUGIN, "blobs")
    assert [ly.name for ly in layers] == ["nuclei", "membranes", "blobs"]
    cache = default_cache_dir() / SAMPLE_NAME
    assert (cache / "zarr.json").is_file()
    level0 = zarr.open_array(str(cache / "0"), mode="r")
    assert layers[0].data[0].shape == level0.shape[1:]
    np.testing.assert_array_equal(layers[1].data[0][32], level0[1, 32])
    assert not layers[2].visible


def _script():
    """docs/make_screenshot.py, loaded by path: the one way docs/screenshot.png is made."""
    path = Path(__file__).resolve().parents[2] / "docs" / "make_screenshot.py"
    spec = importlib.util.spec_from_file_location("_gpu_zarr_make_screenshot", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_screenshot_with_widget(make_napari_viewer, tmp_path):
    """The screenshot script on pytest's viewer: a real picture of the window with three loads."""
    viewer = make_napari_viewer(show=True)
    out = tmp_path / "screenshot.png"
    img = _script().make(out, viewer=viewer)
    assert out.stat().st_size > 10_000
    h, w = img.shape[:2]
    assert w >= 1000 and h >= 600, img.shape
    assert img[..., :3].std() > 5  # not a blank window
    assert len([r for r in viewer.layers if r.name in ("nuclei", "membranes", "blobs")]) == 3


def test_the_readme_names_the_sample_as_napari_shows_it():
    """napari puts a plugin's only sample straight in File > Open Sample, titled by its template
    ("<sample> (<plugin>)" in napari 0.5-0.9), not in a submenu."""
    import yaml
    from napari.plugins import menu_item_template

    manifest = yaml.safe_load((Path(__file__).resolve().parents[2] / "napari.yaml").read_text())
    samples = manifest["contributions"]["sample_data"]
    assert len(samples) == 1
    title = menu_item_template.format(manifest["display_name"], samples[0]["display_name"])
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert f"*File ▸ Open Sample ▸ {title}*" in readme
