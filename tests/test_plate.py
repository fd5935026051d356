"""HCS plates and wells (gpu_zarr.plate) against the reference readers: napari-ome-zarr's
plate pyramid and ome-zarr-py's Well grid, on plates written by ome-zarr-py."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_zarr.errors import NotOmeZarrError
from gpu_zarr.plate import is_plate, is_well, open_plate, open_well
from plates import write_plate

pytest.importorskip("ome_zarr")


@pytest.fixture(scope="module", params=["0.4", "0.5"])
def plate_path(request, tmp_path_factory):
    return write_plate(tmp_path_factory.mktemp("plate") / f"plate-{request.param}.zarr", version=request.param)


def _reference_plate(path):
    zarr = pytest.importorskip("zarr")
    plate_mod = pytest.importorskip("napari_ome_zarr.plate")
    return plate_mod.get_pyramid_lazy(zarr.open_group(str(path), mode="r"))


def _reference_well(path):
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Reader

    return list(Reader(parse_url(str(path)))())[0].data


def test_plate_metadata(plate_path):
    assert is_plate(plate_path) and not is_well(plate_path)
    plate = open_plate(plate_path)
    assert plate.rows == ["A", "B"] and plate.columns == ["1", "2", "3"]
    assert [w.name for w in plate.wells] == ["A1", "A3", "B2", "B3"]
    assert plate.levels == 3 and plate.field_count == 2
    assert plate.acquisitions == [{"id": 0, "name": "first"}]
    assert [c.name for c in plate.image.channels] == ["DAPI", "GFP"]
    assert plate.well_names()[0] == ["A1", None, "A3"]
    assert plate.version == plate_path.name.removesuffix(".zarr").split("-")[1]


def test_plate_levels_equal_napari_ome_zarr(plate_path):
    plate = open_plate(plate_path)
    ref = _reference_plate(plate_path)
    assert len(ref) == plate.levels
    for lv, r in enumerate(ref):
        view = plate.level(lv, backend="cpu")
        expected = np.asarray(r)
        assert view.shape == expected.shape and view.dtype == expected.dtype
        got = np.asarray(view)
        np.testing.assert_array_equal(got, expected)
        # missing well (B/3: listed, deleted) and empty cell (A/2) are zeros; real wells are not
        th, tw = view.tile_shape[-2:]
        assert not got[..., th:, 2 * tw:].any() and not got[..., :th, tw:2 * tw].any()
        assert got[..., :th, :tw].all()
        for key in [(0, 0, slice(None, None, -3), slice(5, None, 7)), (1, 0, 17), (slice(None), 0, slice(3, -2), -1),
                    (0, 0, slice(th - 3, th + 5), slice(tw - 2, 3 * tw - 1, 2))]:
            np.testing.assert_array_equal(view[key], expected[key])


def test_plate_channel_view_and_field_choice(plate_path):
    plate = open_plate(plate_path)
    view = plate.level(0, backend="cpu")
    ch1 = view.index_axis(0, 1)
    assert ch1.shape == view.shape[1:]
    np.testing.assert_array_equal(np.asarray(ch1), np.asarray(view)[1])
    # the second field of each well: A/3's second field is missing, so its cell is filled
    second = np.asarray(plate.level(0, field_index=1, backend="cpu", fill_value=7))
    th, tw = view.tile_shape[-2:]
    assert (second[..., :th, 2 * tw:] == 7).all()
    field = open_well(plate_path / "A" / "1").level(0, backend="cpu")
    np.testing.assert_array_equal(second[..., :th, :tw], np.asarray(field)[..., :, tw:])
    assert not (np.asarray(plate.level(0, acquisition=5, backend="cpu"))).any()  # no such acquisition: all filled


def test_well_equals_ome_zarr_py(plate_path):
    for w in ("A/1", "A/3"):
        well = open_well(plate_path / w)
        assert is_well(plate_path / w)
        assert well.grid == (1, 2) and well.fields == ["0", "1"]
        ref = _reference_well(plate_path / w)
        assert len(ref) == well.levels
        for lv, r in enumerate(ref):
            view = well.level(lv, backend="cpu")
            assert view.shape == r.shape
            if w == "A/1":  # ome-zarr-py cannot read a well with a missing field; ours fills it
                np.testing.assert_array_equal(np.asarray(view), np.asarray(r))
        if w == "A/3":
            got = np.asarray(well.level(0, backend="cpu"))
            assert got[..., :48].all() and not got[..., 48:].any()



def _zarr_plate(path, lv, field_index=0, fill=0):
    """The plate image of level ``lv`` from zarr-python's own read of each well's field
    (a missing well or field, or an empty cell: ``fill``)."""
    import zarr

    plate = open_plate(path)
    ds = plate.image.levels[lv]
    *lead, th, tw = ds.shape
    rows, cols = plate.grid
    want = np.full((*lead, rows * th, cols * tw), fill, ds.dtype)
    for w in plate.wells:
        try:
            a = zarr.open_array(str(path / w.path / str(field_index) / ds.path), mode="r")[...]
        except (FileNotFoundError, KeyError, ValueError, zarr.errors.BaseZarrError):
            continue
        want[..., w.row * th:w.row * th + a.shape[-2], w.column * tw:w.column * tw + a.shape[-1]] = a
    return want


def _per_tile(monkeypatch, view, key):
    """``view[key]`` read tile by tile (the path before one engine read served many tiles)."""
    import gpu_zarr.plate as plate_mod

    with monkeypatch.context() as m:
        m.setattr(plate_mod, "_batch_groups", lambda tiles: ([], tiles))
        return view[key]


@pytest.mark.parametrize("backend", ["cpu", "auto"])
def test_plate_region_is_one_engine_read(plate_path, backend, monkeypatch):
    """A region over several wells is ONE engine read (counted, not timed), pixel for pixel
    napari-ome-zarr's, zarr-python's and the tile-by-tile read's: every level, partial
    regions, a missing well (B/3), an empty cell (A/2), a missing field (A/3's second)."""
    plate = open_plate(plate_path)
    ref = _reference_plate(plate_path)
    for lv in range(plate.levels):
        view = plate.level(lv, backend=backend)
        th, tw = view.tile_shape[-2:]
        want = _zarr_plate(plate_path, lv)
        np.testing.assert_array_equal(want, np.asarray(ref[lv]))
        for key in [Ellipsis, (0, 0, slice(3, th + 5), slice(tw - 2, 3 * tw - 1)), (1, 0, 1),
                    (slice(None), 0, slice(th - 1, th + 1), slice(1, 3 * tw))]:
            before = dict(view.read_counts)
            got = view[key]
            assert view.read_counts["batched_reads"] == before["batched_reads"] + 1, key
            assert view.read_counts["tile_reads"] == before["tile_reads"], key
            np.testing.assert_array_equal(got, want[key])
            np.testing.assert_array_equal(got, _per_tile(monkeypatch, view, key))
        assert view.last_batched["tiles"] == 3  # A1, A3, B2: the missing well and empty cell stay filled
        assert "one engine read of 3 arrays" in view.last_batched["reason"]
        assert view.last_batched["stats"]["arrays"] == 3
    second = plate.level(0, field_index=1, backend=backend, fill_value=7)
    got = np.asarray(second)
    assert second.read_counts["batched_reads"] == 1 and second.last_batched["tiles"] == 2  # A3's second field is gone
    np.testing.assert_array_equal(got, _zarr_plate(plate_path, 0, field_index=1, fill=7))
    np.testing.assert_array_equal(got, _per_tile(monkeypatch, second, Ellipsis))
    ch1 = plate.level(1, backend=backend).index_axis(0, 1)
    np.testing.assert_array_equal(np.asarray(ch1), _zarr_plate(plate_path, 1)[1])
    assert ch1.read_counts["batched_reads"] == 1


def test_plate_tiles_of_other_formats_are_read_one_by_one(tmp_path, monkeypatch):
    """Tiles one engine read cannot serve together are read tile by tile, with the same
    pixels: a well whose chunks differ, stepped selections, a single tile."""
    import shutil

    import zarr

    path = write_plate(tmp_path / "mixed.zarr", version="0.4", drop_well=None, drop_field=None)
    src = path / "B" / "2" / "0" / open_plate(path).image.levels[0].path
    data = zarr.open_array(str(src), mode="r")[...]
    re = zarr.create_array(str(tmp_path / "re.zarr"), shape=data.shape, dtype=data.dtype, chunks=(1, 1, 16, 16),
                           zarr_format=2)
    re[...] = data
    shutil.rmtree(src)
    shutil.copytree(tmp_path / "re.zarr", src)
    plate = open_plate(path)
    view = plate.level(0, backend="cpu")
    want = _zarr_plate(path, 0)
    np.testing.assert_array_equal(want, np.asarray(_reference_plate(path)[0]))
    got = np.asarray(view)
    np.testing.assert_array_equal(got, want)
    # A1, A3, B3 share a chunk format; B2 (other chunks) is read alone
    assert view.read_counts == {"batched_reads": 1, "batched_tiles": 3, "tile_reads": 1}
    th, tw = view.tile_shape[-2:]
    # stepped (read tile by tile), reversed (read forwards in one read, then flipped), one tile
    for key, batched in [((0, 0, slice(None, None, 2), slice(1, None, 3)), 0), ((1, 0, slice(None, None, -1)), 1),
                         ((0, 0, slice(2, 9), slice(tw + 3, tw + 9)), 0)]:
        before = dict(view.read_counts)
        np.testing.assert_array_equal(view[key], want[key])
        assert view.read_counts["batched_reads"] == before["batched_reads"] + batched, key
        np.testing.assert_array_equal(view[key], _per_tile(monkeypatch, view, key))


def test_not_a_plate_is_a_clear_error(tmp_path, small_plain_array):
    with pytest.raises(NotOmeZarrError, match="plate group"):
        open_plate(small_plain_array)
    assert not is_plate(tmp_path / "nothing")


@pytest.fixture
def small_plain_array(tmp_path):
    import zarr

    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=(4, 4), dtype="u1")
    a[:] = 1
    return tmp_path / "a.zarr"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["kvikio", "zarr-gpu"])
def test_plate_on_the_gpu_equals_cpu(plate_path, backend):
    """GPU twin of test_plate_levels_equal_napari_ome_zarr: every level through a GPU backend."""
    plate = open_plate(plate_path)
    for lv in range(plate.levels):
        np.testing.assert_array_equal(np.asarray(plate.level(lv, backend=backend)),
                                      np.asarray(plate.level(lv, backend="cpu")))


@pytest.mark.gpu
def test_plate_region_decoded_on_the_gpu_in_one_read(plate_path, monkeypatch):
    """GPU twin of test_plate_region_is_one_engine_read: with no small reads, the wells' chunks
    go through the GPU pipeline in one engine read."""
    from gpu_zarr import settings

    plate = open_plate(plate_path)
    with settings.set(small_read=0):
        for lv in range(plate.levels):
            view = plate.level(lv, backend="kvikio")
            th, tw = view.tile_shape[-2:]
            for key in [Ellipsis, (0, 0, slice(3, th + 5), slice(tw - 2, 3 * tw - 1))]:
                got = view[key]
                assert "decoded on the GPU" in view.last_batched["reason"]
                np.testing.assert_array_equal(got, _zarr_plate(plate_path, lv)[key])
                np.testing.assert_array_equal(got, _per_tile(monkeypatch, view, key))


def test_plate_and_well_paths_stay_inside(tmp_path):
    """Rows named '..' or well image paths leading out of the well are refused, never followed."""
    import json

    import zarr

    from gpu_zarr.errors import InvalidOmeMetadata

    plate = zarr.open_group(str(tmp_path / "p.zarr"), mode="w", zarr_format=2)
    plate.attrs["plate"] = {"rows": [{"name": ".."}], "columns": [{"name": "x"}], "wells": [{"path": "../x"}],
                            "version": "0.4"}
    with pytest.raises(InvalidOmeMetadata, match=r"p\.zarr: plate well path '\.\./x' points outside"):
        open_plate(tmp_path / "p.zarr")
    well = zarr.open_group(str(tmp_path / "w.zarr"), mode="w", zarr_format=2)
    for bad in ("../other", "/abs/img", "s3://bucket/img"):
        well.attrs["well"] = {"images": [{"path": bad}], "version": "0.4"}
        with pytest.raises(InvalidOmeMetadata, match=r"w\.zarr: well image path .* points outside"):
            open_well(tmp_path / "w.zarr")
    assert json.loads((tmp_path / "w.zarr" / ".zattrs").read_text())["well"]["images"][0]["path"] == "s3://bucket/img"
