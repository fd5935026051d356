"""napari 0.9's chunk-aware 2-D multiscale slicing (napari PR #9145) on our layers.

napari reads ``data[level].chunks`` and widens the region it slices to whole chunks, then keeps
panning inside that region without slicing again. Our levels expose ``chunks`` (the zarr chunk
shape along the layer's axes), so the region napari asks for is chunk-aligned, a pan inside it
reads nothing, and the pixels shown are zarr's.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from gpu_zarr.sample import write_sample_omezarr

napari = pytest.importorskip("napari")
layer_utils = pytest.importorskip("napari.layers.utils.layer_utils")
if not hasattr(layer_utils, "expand_corners_to_chunk_boundaries"):
    pytest.skip(f"napari {napari.__version__} has no chunk-aware multiscale slicing (0.9 and later)",
                allow_module_level=True)

PLUGIN = "napari-gpu-zarr"
CHUNK = 64


@pytest.fixture(scope="module")
def pyramid(tmp_path_factory):
    base = tmp_path_factory.mktemp("chunk-aware")
    return write_sample_omezarr(base / "img.ome.zarr", version="0.5", shape=(2, 4, 1024, 768), levels=3,
                                chunks=(1, 1, CHUNK, CHUNK), seed=11)


def _draw(viewer):
    from qtpy.QtWidgets import QApplication

    for _ in range(5):  # the canvas's size and the camera reach vispy through Qt events
        QApplication.processEvents()
    viewer.window._qt_viewer.canvas.on_draw(None)  # what vispy calls after a camera change


def _center(viewer, layer, pixel):
    """Put the camera's centre on a level-0 pixel (y, x) of ``layer`` (world = pixel x scale)."""
    viewer.camera.center = (0, *(np.asarray(pixel) * layer.scale[-2:] + layer.translate[-2:]))


def _zoom_into_level_0(viewer, layer, pixel):
    """Zoomed out (a coarse level, napari's region reset), then in on ``pixel`` at level 0: napari
    keeps its region while a view stays inside it, so only a level change makes a fresh one."""
    viewer.camera.zoom = 0.05
    _draw(viewer)
    assert layer.data_level == len(layer.data) - 1
    _center(viewer, layer, pixel)
    viewer.camera.zoom = 8.0
    _draw(viewer)
    assert layer.data_level == 0
    (_, y0, x0), (_, y1, x1) = layer.corner_pixels
    assert y1 - y0 < 512 and x1 - x0 < 384, layer.corner_pixels  # a part of the level, not all of it


def test_the_region_napari_slices_is_whole_chunks_and_zarrs_pixels(make_napari_viewer, pyramid):
    viewer = make_napari_viewer(show=True)
    viewer.window._qt_window.resize(900, 700)
    layers = viewer.open(str(pyramid), plugin=PLUGIN)
    nuclei = layers[0]
    assert nuclei.multiscale and nuclei.data[0].chunks == (1, CHUNK, CHUNK)  # c is the layer: (z, y, x)
    viewer.dims.set_current_step(0, 2)
    _zoom_into_level_0(viewer, nuclei, (300.4, 200.7))
    (z0, y0, x0), (_z1, y1, x1) = nuclei.corner_pixels
    # inclusive corners widened to chunk boundaries (or the array's edge)
    assert y0 % CHUNK == 0 and x0 % CHUNK == 0
    assert (y1 + 1) % CHUNK == 0 or y1 + 1 == 1024
    assert (x1 + 1) % CHUNK == 0 or x1 + 1 == 768
    shown = np.asarray(nuclei._slice.image.raw)
    level0 = zarr.open_array(str(pyramid / "0"), mode="r")
    np.testing.assert_array_equal(shown, level0[0, 2, y0:y1 + 1, x0:x1 + 1])


def test_a_pan_inside_the_chunks_slices_nothing_and_a_pan_out_does(make_napari_viewer, pyramid):
    viewer = make_napari_viewer(show=True)
    viewer.window._qt_window.resize(900, 700)
    nuclei = viewer.open(str(pyramid), plugin=PLUGIN)[0]
    _zoom_into_level_0(viewer, nuclei, (320.0, 224.0))
    before, corners = nuclei._slice, nuclei.corner_pixels.copy()
    # a pan of a few pixels: the visible region stays inside the chunks already read
    _center(viewer, nuclei, (322.0, 226.0))
    _draw(viewer)
    assert nuclei._slice is before and np.array_equal(nuclei.corner_pixels, corners)
    # a pan by more than the region: napari slices again, at chunk boundaries, zarr's pixels
    _center(viewer, nuclei, (900.0, 600.0))
    _draw(viewer)
    assert nuclei._slice is not before
    (_, y0, x0), (_, y1, x1) = nuclei.corner_pixels
    assert y0 % CHUNK == 0 and x0 % CHUNK == 0
    level0 = zarr.open_array(str(pyramid / "0"), mode="r")
    z = viewer.dims.current_step[0]
    np.testing.assert_array_equal(np.asarray(nuclei._slice.image.raw), level0[0, z, y0:y1 + 1, x0:x1 + 1])
