"""A URL opened in a real napari (``viewer.open(url, plugin=...)``) over a loopback HTTP server."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

pytest.importorskip("obstore")

from gpu_zarr.bench.remote_server import RangeServer  # noqa: E402
from gpu_zarr.engine.remote import FETCHED  # noqa: E402
from gpu_zarr.lazy import GpuLazyArray  # noqa: E402

PLUGIN = "napari-gpu-zarr"


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_viewer_opens_a_url(make_napari_viewer, small_stores, version):
    path = small_stores[version]
    FETCHED.clear()
    with RangeServer(path.parent, latency=0.002) as srv:
        url = f"{srv.url}/{path.name}"
        viewer = make_napari_viewer()
        layers = viewer.open(url, plugin=PLUGIN)
        assert [ly.name for ly in layers] == ["nuclei", "membranes", "blobs"]
        nuclei, _membranes, blobs = layers
        assert nuclei.multiscale and all(isinstance(d, GpuLazyArray) for d in nuclei.data)
        for lvl, data in enumerate(nuclei.data):
            cpu = zarr.open_array(str(path / str(lvl)), mode="r")
            np.testing.assert_array_equal(data[5], cpu[0, 5])
        # what napari slices for display equals zarr's read of the same store on disk
        viewer.dims.set_current_step(0, 7)
        level = nuclei.data_level
        shown = np.asarray(nuclei._slice.image.raw)
        corner = nuclei.corner_pixels[:, 1:]
        want = zarr.open_array(str(path / str(level)), mode="r")[0, 7][
            corner[0, 0]: corner[1, 0] + 1, corner[0, 1]: corner[1, 1] + 1]
        assert shown.size > 0
        np.testing.assert_array_equal(shown, want)
        np.testing.assert_array_equal(np.asarray(blobs.data[0][3]),
                                      zarr.open_array(str(path / "labels" / "blobs" / "0"), mode="r")[3])
        assert srv.methods() <= {"GET", "HEAD"}
