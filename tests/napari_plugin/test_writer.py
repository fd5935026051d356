"""The napari writer: image and labels layers saved as OME-Zarr 0.5, through npe2 and a real napari."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from gpu_zarr.errors import DestinationExists, UsageError
from gpu_zarr.napari_plugin._writer import write_layers

PLUGIN = "napari-gpu-zarr"


def _layers():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 1000, (3, 70, 50)).astype("uint16")
    return img, (img > 500).astype("uint8")


def test_npe2_write_stacks_images_as_channels_with_labels(tmp_path):
    npe2 = pytest.importorskip("npe2")
    pm = npe2.PluginManager.instance()
    pm.discover()
    img, lab = _layers()
    layers = [(img, {"name": "dna", "scale": [2.0, 0.5, 0.5]}, "image"), (img + 1, {"name": "actin"}, "image"),
              (lab, {"name": "cells"}, "labels")]
    out = npe2.write(str(tmp_path / "s.zarr"), layers, plugin_name=PLUGIN)
    assert out == [str(tmp_path / "s.zarr")]
    g = zarr.open_group(tmp_path / "s.zarr", mode="r")
    ome = g.attrs.asdict()["ome"]
    assert [c["label"] for c in ome["omero"]["channels"]] == ["dna", "actin"]
    assert ome["multiscales"][0]["datasets"][0]["coordinateTransformations"][0]["scale"] == [1.0, 2.0, 0.5, 0.5]
    np.testing.assert_array_equal(g["0"][...], np.stack([img, img + 1]))
    np.testing.assert_array_equal(g["labels/cells/0"][...], lab)


def test_writer_refuses_what_it_cannot_save(tmp_path):
    img, lab = _layers()
    with pytest.raises(UsageError, match="needs an image layer"):
        write_layers(str(tmp_path / "a.zarr"), [(lab, {"name": "l"}, "labels")])
    with pytest.raises(UsageError, match="has shape"):
        write_layers(str(tmp_path / "a.zarr"), [(img, {}, "image"), (lab[0], {"name": "l"}, "labels")])
    write_layers(str(tmp_path / "a.zarr"), [(img, {}, "image")])
    with pytest.raises(DestinationExists):
        write_layers(str(tmp_path / "a.zarr"), [(img, {}, "image")])


def test_save_from_a_real_viewer_and_open_again(make_napari_viewer, tmp_path):
    viewer = make_napari_viewer()
    img, lab = _layers()
    viewer.add_image(img, name="raw", scale=(2.0, 1.0, 1.0))
    viewer.add_labels(lab, name="cells")
    saved = viewer.layers.save(str(tmp_path / "v.zarr"), plugin=PLUGIN)
    assert saved == [str(tmp_path / "v.zarr")]
    viewer.layers.clear()
    viewer.open(str(tmp_path / "v.zarr"), plugin=PLUGIN)
    kinds = sorted(type(ly).__name__ for ly in viewer.layers)
    assert kinds == ["Image", "Labels"]
    image = next(ly for ly in viewer.layers if type(ly).__name__ == "Image")
    np.testing.assert_array_equal(np.asarray(image.data[0] if image.multiscale else image.data), img)
