"""HCS plates and wells in a real napari viewer, against napari-ome-zarr's layers."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_zarr.plate import TiledArray
from plates import write_plate

PLUGIN = "napari-gpu-zarr"
pytest.importorskip("napari_ome_zarr")


@pytest.fixture(scope="module", params=["0.4", "0.5"])
def plate_path(request, tmp_path_factory):
    return write_plate(tmp_path_factory.mktemp("plate") / f"plate-{request.param}.zarr", version=request.param)


def _canvas(viewer, qtbot):
    viewer.reset_view()
    qtbot.wait(200)
    return viewer.screenshot(canvas_only=True, flash=False)


def test_plate_layers_equal_napari_ome_zarr(make_napari_viewer, qtbot, plate_path):
    viewer = make_napari_viewer(show=True)
    ours = viewer.open(str(plate_path), plugin=PLUGIN)
    images = [ly for ly in ours if ly._type_string == "image"]
    wells = [ly for ly in ours if ly._type_string == "points"]
    assert [ly.name.split(": ")[1] for ly in images] == ["DAPI", "GFP"]
    assert len(wells) == 1 and list(wells[0].features["well"]) == ["A1", "A3", "B2", "B3"]
    assert images[0].metadata["gpu_zarr"]["plate"]["wells"] == ["A1", "A3", "B2", "B3"]
    ours_shot = _canvas(viewer, qtbot)

    ours_data = [ly.data for ly in images]
    viewer.layers.clear()  # the reference in the same viewer: same canvas, same view
    ref = viewer.open(str(plate_path), plugin="napari-ome-zarr")
    assert len(ref) == len(images)
    for mine, data, theirs in zip(images, ours_data, ref, strict=True):
        assert isinstance(data[0], TiledArray) and mine.multiscale and len(data) == 3
        assert len(data) == len(theirs.data)
        for a, b in zip(data, theirs.data, strict=True):
            assert a.shape == b.shape
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_allclose(mine.scale, theirs.scale)
        assert mine.colormap.colors[-1].tolist() == pytest.approx(theirs.colormap.colors[-1].tolist())
    ref_shot = _canvas(viewer, qtbot)
    for shot in (ours_shot, ref_shot):
        assert shot[..., :3].max() > 50 and shot[..., :3].std() > 5  # the wells show, not a blank canvas
    # the same picture (the well-name overlay aside): the wells light up the same share of the canvas
    lit = [(s[..., :3].max(axis=-1) > 40).mean() for s in (ours_shot, ref_shot)]
    assert lit[0] == pytest.approx(lit[1], abs=0.05), lit


def test_well_opens_as_its_field_grid(make_napari_viewer, qtbot, plate_path):
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Reader

    viewer = make_napari_viewer(show=True)
    layers = viewer.open(str(plate_path / "A" / "1"), plugin=PLUGIN)
    assert [ly.name for ly in layers] == ["1: DAPI", "1: GFP"]
    ref = list(Reader(parse_url(str(plate_path / "A" / "1")))())[0].data
    for c, ly in enumerate(layers):
        for a, b in zip(ly.data, ref, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[c])
    shot = _canvas(viewer, qtbot)
    assert shot[..., :3].max() > 50 and shot[..., :3].std() > 5
