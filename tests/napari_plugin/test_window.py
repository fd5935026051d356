"""napari's multiscale slicing cuts the visible tile out of a level with every non-displayed
axis whole, then materializes its plane: a ViewerLevel defers the first step (a Window) and
reads only the plane (no napari needed here: the keys are the ones napari 0.9 sends)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.lazy import GpuLazyArray
from gpu_zarr.napari_plugin._window import ViewerLevel, Window


@pytest.fixture
def level(tmp_path):
    rng = np.random.default_rng(3)
    data = rng.integers(0, 60000, (2, 6, 40, 50), dtype=np.uint16)
    arr = zarr.create_array(tmp_path / "a.zarr", shape=data.shape, chunks=(1, 1, 16, 16), dtype=data.dtype)
    arr[...] = data
    get_runtime().clear_caches()
    return ViewerLevel(zarr.open_array(tmp_path / "a.zarr", mode="r")), data


def test_a_tile_then_its_plane_reads_the_plane_only(level, monkeypatch):
    lv, data = level
    keys = []
    read = GpuLazyArray._read

    def spy(self, key, *, gpu):
        keys.append(key)
        return read(self, key, gpu=gpu)
    monkeypatch.setattr(GpuLazyArray, "_read", spy)
    view = lv.index_axis(0, 1)  # a channel layer's level keeps its kind
    assert isinstance(view, ViewerLevel)
    tile = view[:, 8:30, slice(5, 45, 1)]  # napari: the tile, every z
    assert isinstance(tile, Window) and tile.shape == (6, 22, 40) and tile.dtype == data.dtype
    assert keys == []  # nothing read yet
    plane = np.asarray(tile[slice(3, 4), :, :])  # napari: the thick slice of one plane, materialized
    np.testing.assert_array_equal(plane, data[1, 3:4, 8:30, 5:45])
    assert len(keys) == 1 and (keys[0][0].start, keys[0][0].stop) == (3, 4)  # one read, of that plane
    np.testing.assert_array_equal(tile[4], data[1, 4, 8:30, 5:45])  # an integer reads


@pytest.mark.parametrize("key", [(1, slice(None), slice(3, 9)), (slice(None, None, 2),), (Ellipsis, 7),
                                 (slice(-3, None), Ellipsis), (slice(5, 2),), (slice(None, None, -1), 1, 2)])
def test_every_other_key_is_numpy_s_answer(level, key):
    lv, data = level
    got = lv[key]
    want = data[key]
    np.testing.assert_array_equal(np.asarray(got), want)
    assert np.asarray(got).shape == want.shape


@pytest.mark.parametrize("inner", [(slice(0, 2), 2), (slice(None, None, -2), slice(1, 3)), (Ellipsis, slice(0, 0)),
                                   (1, 2, 3), (slice(None, None, 3), 0, slice(1, 4))])
def test_a_window_indexes_as_numpy(level, inner):
    lv, data = level
    win = lv[:, 2:5, 10:30]
    got = win[inner]
    np.testing.assert_array_equal(np.asarray(got), data[:, 2:5, 10:30][inner])


def test_the_whole_level_as_numpy(level):
    lv, data = level
    np.testing.assert_array_equal(np.asarray(lv), data)
    np.testing.assert_array_equal(np.asarray(lv.index_axis(0, 1)), data[1])
    np.testing.assert_array_equal(np.asarray(lv[:, 1:3]), data[:, 1:3])


def test_a_plate_grid_gives_its_tile_lazily(tmp_path):
    """A plate's level (wells in a grid), as napari's reader hands it over: the tile napari cuts
    with every z is read only as the plane it then takes, equal to the plain grid's read."""
    pytest.importorskip("ome_zarr")
    from gpu_zarr.napari_plugin._window import ViewerGrid
    from gpu_zarr.plate import open_plate
    from plates import write_plate

    path = write_plate(tmp_path / "p.zarr", version="0.5", shape=(2, 3, 64, 48))
    plate = open_plate(str(path))
    grid = plate.level(0, kind=ViewerGrid).index_axis(0, 1)
    plain = plate.level(0).index_axis(0, 1)
    assert isinstance(grid, ViewerGrid)
    tile = grid[:, 10:100, 5:120]
    assert isinstance(tile, Window) and grid.read_counts["tile_reads"] + grid.read_counts["batched_reads"] == 0
    np.testing.assert_array_equal(np.asarray(tile[2:3]), plain[2:3, 10:100, 5:120])
    np.testing.assert_array_equal(np.asarray(grid), np.asarray(plain))
