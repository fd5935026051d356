"""OME-NGFF 0.4 (zarr v2) / 0.5 (zarr v3) metadata and level access, on real stores."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from gpu_zarr.errors import NotAZarrError
from gpu_zarr.omezarr import (
    Axis,
    InvalidOmeMetadata,
    NotOmeZarrError,
    find_zarr_node,
    is_ome_zarr,
    open_ome,
    read_omezarr,
)
from gpu_zarr.sample import write_sample_omezarr


@pytest.fixture(scope="module", params=["0.4", "0.5"])
def store(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("ome") / f"img-{request.param}.ome.zarr"
    return write_sample_omezarr(path, version=request.param, shape=(2, 8, 48, 40), levels=3,
                                chunks=(1, 4, 16, 16), seed=1), request.param


def _write(path, *, fmt=3, ms=None, arrays=(("0", (4, 6)),), **extra):
    g = zarr.open_group(str(path), mode="w", zarr_format=fmt)
    for name, shape in arrays:
        g.create_array(name, shape=shape, dtype="uint8", chunks=shape)[...] = 1
    attrs = dict(extra)
    if ms is not None:
        attrs["multiscales"] = ms
    g.attrs.update({"ome": {"version": "0.5", **attrs}} if fmt == 3 else attrs)
    return path


def test_read_omezarr(store):
    path, version = store
    for level, res in [(0, [1.0, 2.0, 0.5, 0.5]), (1, [1.0, 2.0, 1.0, 1.0]), (-1, [1.0, 2.0, 2.0, 2.0])]:
        arr, resolution = read_omezarr(path, level=level)
        assert isinstance(arr, zarr.Array) and resolution == res
        assert arr.metadata.zarr_format == (3 if version == "0.5" else 2)
        cpu = zarr.open_array(str(path / str(level % 3)), mode="r")
        np.testing.assert_array_equal(arr[1, 3], cpu[1, 3])
        assert isinstance(arr[1, 3], np.ndarray)
    with pytest.raises(IndexError, match=r"level 3 does not exist .* 3 level\(s\)"):
        read_omezarr(path, level=3)
    with pytest.raises(TypeError, match="level must be an int"):
        read_omezarr(path, level="0")
    arr, _ = read_omezarr(str(path))
    before = arr[0, 0, 0, 0].item()
    with pytest.raises(ValueError, match="read-only"):
        arr[0, 0, 0, 0] = before + 1  # opened read-only: user data is never altered
    assert zarr.open_array(str(path / "0"), mode="r")[0, 0, 0, 0] == before


def test_open_ome_model(store):
    path, version = store
    img = open_ome(path)
    assert img.version == version and img.name == "img-" + version
    assert img.axes == [Axis("c", "channel"), Axis("z", "space", "micrometer"),
                        Axis("y", "space", "micrometer"), Axis("x", "space", "micrometer")]
    assert img.channel_axis == 0 and img.ndim == 4
    assert [lv.path for lv in img.levels] == ["0", "1", "2"]
    assert [lv.shape for lv in img.levels] == [(2, 8, 48, 40), (2, 8, 24, 20), (2, 8, 12, 10)]
    assert img.levels[1].translation == (0.0, 0.0, 0.25, 0.25)
    assert img.levels[2].scale == (1.0, 2.0, 2.0, 2.0) and img.levels[2].translation == (0, 0, 0.75, 0.75)
    assert img.levels[0].dtype == "uint16" and img.levels[0].chunks == (1, 4, 16, 16)
    assert img.levels[0].nbytes == 2 * 8 * 48 * 40 * 2
    nuc, mem = img.channels
    assert (nuc.name, nuc.color, mem.name, mem.color) == ("nuclei", "#FF00FF", "membranes", "#00FF00")
    assert nuc.active and nuc.min == 0 and nuc.max == 65535 and 0 < nuc.start < nuc.end
    (lab,) = img.labels.values()
    assert lab.is_label and lab.name == "blobs" and lab.channel_axis is None
    assert len(lab.label_colors) >= 1 and all(len(c) == 4 and max(c) <= 1 for c in lab.label_colors.values())
    np.testing.assert_array_equal(lab.open_level(0)[...], zarr.open_array(str(path / "labels/blobs/0"))[...])
    assert is_ome_zarr(path) and is_ome_zarr(path / "labels" / "blobs")
    assert not is_ome_zarr(path / "0") and not is_ome_zarr(path / "labels")


@pytest.mark.parametrize("fmt", [2, 3])
def test_global_and_level_transforms_compose(tmp_path, fmt):
    ms = [{"version": "0.4", "axes": [{"name": "y", "type": "space"}, {"name": "x", "type": "space"}],
           "datasets": [
               {"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [2, 3]}]},
               {"path": "1", "coordinateTransformations": [
                   {"type": "scale", "scale": [4, 6]}, {"type": "translation", "translation": [1, 1.5]}]}],
           "coordinateTransformations": [{"type": "scale", "scale": [10, 1]},
                                         {"type": "translation", "translation": [5, 7]}]}]
    path = _write(tmp_path / "t.zarr", fmt=fmt, ms=ms, arrays=[("0", (4, 6)), ("1", (2, 3))])
    img = open_ome(path)
    assert img.levels[0].scale == (20, 3) and img.levels[0].translation == (5, 7)
    assert img.levels[1].scale == (40, 6) and img.levels[1].translation == (15, 8.5)
    assert read_omezarr(path, 1)[1] == [40.0, 6.0]
    assert img.channels == [] and img.labels == {}


def test_older_layouts(tmp_path):
    # 0.3: axes as strings; 0.1/0.2: no axes at all, no transforms
    p3 = _write(tmp_path / "a.zarr", fmt=2, arrays=[("0", (3, 4, 5))],
                ms=[{"version": "0.3", "axes": ["z", "y", "x"], "datasets": [{"path": "0"}]}])
    img = open_ome(p3)
    assert [a.name for a in img.axes] == ["z", "y", "x"] and img.levels[0].scale == (1, 1, 1)
    p1 = _write(tmp_path / "b.zarr", fmt=2, arrays=[("0", (2, 3, 4, 5))],
                ms=[{"version": "0.1", "datasets": [{"path": "0"}]}])
    img = open_ome(p1)
    assert [a.name for a in img.axes] == ["c", "z", "y", "x"] and img.channel_axis == 0


def test_bioformats2raw_layout(tmp_path, store):
    root = zarr.open_group(str(tmp_path / "bf.zarr"), mode="w", zarr_format=3)
    root.attrs["ome"] = {"version": "0.5", "bioformats2raw.layout": 3}
    series = _write(tmp_path / "bf.zarr" / "0", ms=[{"axes": [{"name": "y"}, {"name": "x"}],
                                                     "datasets": [{"path": "0"}]}])
    assert is_ome_zarr(tmp_path / "bf.zarr")
    assert open_ome(tmp_path / "bf.zarr").path == str(series)


@pytest.mark.parametrize(
    ("ms", "arrays", "match"),
    [
        ([{"axes": [{"name": "x"}], "datasets": [{"path": "0"}]}], [("0", (4, 6))], r"1 axes \['x'\] but the arrays have 2"),
        ([{"datasets": [{"path": "9"}]}], [("0", (4, 6))], "names the array '9', but there is no such array"),
        ([{"datasets": []}], [("0", (4, 6))], "no 'datasets'"),
        ([], [("0", (4, 6))], "non-empty list"),
        ([{"datasets": [{"path": "0", "coordinateTransformations": [{"type": "affine", "affine": []}]}]}],
         [("0", (4, 6))], "unsupported coordinate transformation type 'affine'"),
        ([{"datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "path": "s.bin"}]}]}],
         [("0", (4, 6))], "separate 'path' are not supported"),
        ([{"datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1]}]}]}],
         [("0", (4, 6))], "scale has 1 values but the image has 2 axes"),
        ([{"datasets": [{"path": "0"}, {"path": "1"}]}], [("0", (4, 6)), ("1", (4,))], "level '1' has 1 dimensions"),
    ],
)
def test_invalid_metadata_is_explained(tmp_path, ms, arrays, match):
    path = _write(tmp_path / "bad.zarr", ms=ms, arrays=arrays)
    with pytest.raises(InvalidOmeMetadata, match=match) as info:
        open_ome(path)
    assert str(path) in str(info.value)


def test_not_ome_and_not_zarr(tmp_path, store):
    plain = _write(tmp_path / "plain.zarr", fmt=2, custom=1)
    with pytest.raises(NotOmeZarrError, match=r"expected OME-NGFF 'multiscales' .* found \['custom'\]"):
        open_ome(plain)
    plate = _write(tmp_path / "plate.zarr", plate={"version": "0.4"})
    with pytest.raises(NotOmeZarrError, match="HCS plate"):
        open_ome(plate)
    path, _ = store
    with pytest.raises(NotOmeZarrError, match="found a zarr array .* open its parent folder"):
        open_ome(path / "0")
    with pytest.raises(NotAZarrError, match="nothing exists there"):
        read_omezarr(tmp_path / "missing.zarr")
    empty = tmp_path / "empty.zarr"
    empty.mkdir()
    with pytest.raises(NotAZarrError, match="the folder is empty"):
        open_ome(empty)
    assert not is_ome_zarr(empty) and not is_ome_zarr(tmp_path / "missing") and not is_ome_zarr(plain)
    assert issubclass(NotOmeZarrError, NotAZarrError) and issubclass(InvalidOmeMetadata, ValueError)


def test_find_zarr_node(tmp_path, store):
    path, version = store
    meta = "zarr.json" if version == "0.5" else ".zattrs"
    assert find_zarr_node(path) == path
    assert find_zarr_node(path / meta) == path
    assert find_zarr_node(path / "0") == path / "0"
    chunk_dir = next(p for p in (path / "0").iterdir() if p.is_dir())
    assert find_zarr_node(chunk_dir) == path / "0"  # a folder inside an array opens the array
    other = tmp_path / "not-zarr"
    (other / "deep").mkdir(parents=True)
    assert find_zarr_node(other / "deep") is None and find_zarr_node(tmp_path / "nope.zarr") is None
    (tmp_path / "x.zarr" / "sub").mkdir(parents=True)
    assert find_zarr_node(tmp_path / "x.zarr" / "sub") is None  # inside a .zarr with no metadata


@pytest.mark.gpu
def test_gpu_zarr_context_example(store):
    """The seed's example, verbatim with our module names: slices are cupy inside the context."""
    import cupy

    from gpu_zarr.zarr_io import gpu_zarr_context

    path, _ = store
    cpu = zarr.open_array(str(path / "0"), mode="r")
    regions = [(0, slice(0, 4)), (1, 5, slice(8, 40), slice(None, None, 2))]
    expected = [cpu[r] for r in regions]  # inside the context zarr returns cupy
    with gpu_zarr_context():
        vol, _ = read_omezarr(path, level=0)
        for tile_region, want in zip(regions, expected):
            tile_gpu = vol[tile_region]  # already cupy
            assert isinstance(tile_gpu, cupy.ndarray)
            np.testing.assert_array_equal(cupy.asnumpy(tile_gpu), want)
    vol, _ = read_omezarr(path, level=0)
    assert isinstance(vol[0, 0], np.ndarray)
