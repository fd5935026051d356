"""A URL opened in a real napari (``viewer.open(url, plugin=...)``) over a loopback HTTP server."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

pytest.importorskip("obstore")

from gpu_zarr.bench.remote_server import RangeServer  # noqa: E402
from gpu_zarr.engine.runtime import get_runtime  # noqa: E402
from gpu_zarr.engine.sources.remote import byte_cache  # noqa: E402
from gpu_zarr.lazy import GpuLazyArray  # noqa: E402

PLUGIN = "napari-gpu-zarr"


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_viewer_opens_a_url(make_napari_viewer, small_stores, version):
    path = small_stores[version]
    byte_cache(get_runtime()).clear()
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


def test_the_middle_plane_is_asked_for_once(make_napari_viewer, tmp_path):
    """napari slices a new viewer's first layer at step 0, then goes to the middle step: the
    reader asked for the middle plane ahead, and napari's own read of it waited for that one
    rather than asking again; no other plane is read; what napari shows there is zarr's read of
    the same store."""
    from collections import Counter

    from gpu_zarr.sample import write_sample_omezarr

    write_sample_omezarr(tmp_path / "t.ome.zarr", version="0.5", shape=(2, 5, 64, 64), levels=2, labels=False,
                         compressor="zstd", chunks=(1, 1, 32, 32))
    byte_cache(get_runtime()).clear()
    with RangeServer(tmp_path, latency=0.05) as srv:
        viewer = make_napari_viewer()
        layers = viewer.open(f"{srv.url}/t.ome.zarr", plugin=PLUGIN)
        assert viewer.dims.current_step[0] == 2  # napari went to the middle of z
        pending = layers[0].data[-1]._src.prefetching
        if pending is not None:
            pending.result(timeout=30)
        asked = Counter(e["path"].split("/t.ome.zarr/", 1)[1] for e in srv.log if "/t.ome.zarr/1/c/" in e["path"])
    middle = {p: n for p, n in asked.items() if p.split("/")[3] == "2"}
    assert sorted(middle) == ["1/c/0/2/0/0", "1/c/1/2/0/0"] and set(middle.values()) == {1}, asked
    # napari cuts its tile out of a level with every z (as of a dask array), then takes the plane:
    # only the planes napari showed (step 0, then the middle) were read, not the level's stack
    assert {p.split("/")[3] for p in asked} <= {"0", "2"}, asked
    for c, layer in enumerate(layers):
        level = zarr.open_array(str(tmp_path / "t.ome.zarr" / str(layer.data_level)), mode="r")
        shown = np.asarray(layer._slice.image.raw)
        corner = layer.corner_pixels[:, 1:]
        want = level[c, 2][corner[0, 0]: corner[1, 0] + 1, corner[0, 1]: corner[1, 1] + 1]
        np.testing.assert_array_equal(shown, want)
