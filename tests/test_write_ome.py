"""OME-Zarr written by us, opened by every reader: zarr-python, TensorStore, ome-zarr-py,
napari-ome-zarr and our own; pyramid definitions checked against direct formulas."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from gpu_zarr.errors import UsageError
from gpu_zarr.write.omezarr import write_ome_zarr
from gpu_zarr.write.pyramid import downsample

SHAPE = (2, 3, 67, 45)  # c z y x: odd y and x


def _image() -> np.ndarray:
    rng = np.random.default_rng(2)
    return rng.integers(0, 3000, SHAPE).astype("uint16")


def _labels() -> np.ndarray:
    rng = np.random.default_rng(3)
    return rng.integers(0, 5, SHAPE[1:]).astype("uint32")


# -- pyramid definitions -----------------------------------------------------------------
def test_mean_is_the_mean_of_existing_elements_rounded_half_up():
    a = np.random.default_rng(0).integers(0, 1000, (5, 7)).astype("uint16")
    out = downsample(a, (0, 1), "mean")
    assert out.shape == (3, 4) and out.dtype == a.dtype
    for i in range(3):
        for j in range(4):
            block = a[2 * i:2 * i + 2, 2 * j:2 * j + 2].astype(np.float64)
            assert out[i, j] == np.floor(block.mean() + 0.5), (i, j)
    f = a.astype("float32")
    np.testing.assert_allclose(downsample(f, (1,), "mean")[:, -1], f[:, -1])  # odd end: the last column alone
    neg = np.array([-3, -2], "int16")
    assert downsample(neg, (0,), "mean")[0] == -2  # floor(-2.5 + 0.5)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16", "uint32", "int32", "int64", "uint64",
                                   "float16", "float32", "float64"])
@pytest.mark.parametrize("shape,axes", [((5, 7), (0, 1)), ((3, 9, 6), (1, 2)), ((4, 5, 3), (0, 1, 2)),
                                        ((2, 3, 5, 7), (2, 3)), ((9,), (0,))])
def test_mean_is_the_mean_of_each_block_for_every_dtype(dtype, shape, axes):
    """Every output element against the definition, element by element: the mean of the existing
    elements of its block in float64, ties up for integers, cast back."""
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    if info is not None:
        lo, hi = max(int(info.min), -(2**62)), min(int(info.max), 2**62)
        a = rng.integers(lo, hi, shape, dtype=np.int64 if lo < 0 else np.uint64, endpoint=True).astype(dtype)
    else:
        a = rng.normal(0, 1000, shape).astype(dtype)
    out = downsample(a, axes, "mean")
    want = np.empty(out.shape, dtype)
    for idx in np.ndindex(*out.shape):
        block = a[tuple(slice(2 * i, 2 * i + 2) if ax in axes else slice(i, i + 1) for ax, i in enumerate(idx))]
        m = block.astype(np.float64).mean()
        want[idx] = np.floor(m + 0.5) if info is not None else m
    if dtype in ("int64", "uint64"):  # through float64: large values round there, as the definition says
        np.testing.assert_allclose(out.astype(np.float64), want.astype(np.float64), rtol=1e-15)
    elif dtype == "float64":
        np.testing.assert_allclose(out, want, rtol=1e-15)
    else:
        np.testing.assert_array_equal(out, want)


def test_mode_and_nearest():
    a = np.array([[1, 2, 3, 3, 7], [2, 1, 4, 3, 7]], "uint32")
    assert downsample(a, (0, 1), "mode").tolist() == [[1, 3, 7]]  # tie 1/2 -> first in block order
    assert downsample(a, (0, 1), "nearest").tolist() == [[1, 3, 7]]
    b = np.array([[5, 9, 9], [9, 5, 0]], "uint8")
    # blocks 5,9,9,5 (tie: 5 comes first) and the odd end 9,0 (tie: 9 comes first)
    assert downsample(b, (0, 1), "mode").tolist() == [[5, 9]]


# -- written stores, read by every reader ------------------------------------------------------
@pytest.fixture(params=["0.5", "0.4"])
def store(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("ome") / f"img{request.param}.zarr"
    res = write_ome_zarr(_image(), path, axes="czyx", scale=[1.0, 2.0, 0.5, 0.5],
                         units={"z": "micrometer", "y": "micrometer", "x": "micrometer"}, levels=3,
                         chunks=(1, 1, 32, 32), codec="blosc-zstd" if request.param == "0.4" else "zstd",
                         channel_names=["dna", "actin"], labels={"cells": _labels()}, ome_version=request.param,
                         encoder="cpu")
    return request.param, path, res


def _expected_levels(a: np.ndarray, method: str, axes: tuple[int, ...]) -> list[np.ndarray]:
    out = [a]
    for _ in range(2):
        out.append(downsample(out[-1], axes, method))
    return out


def test_metadata_and_pixels_with_zarr_python(store):
    version, path, res = store
    assert res.arrays == ["0", "1", "2", "labels/cells/0", "labels/cells/1", "labels/cells/2"]
    g = zarr.open_group(path, mode="r")
    attrs = g.attrs.asdict()
    body = attrs["ome"] if version == "0.5" else attrs
    if version == "0.5":
        assert body["version"] == "0.5"
    ms = body["multiscales"][0]
    assert [a["name"] for a in ms["axes"]] == ["c", "z", "y", "x"]
    assert ms["axes"][3] == {"name": "x", "type": "space", "unit": "micrometer"}
    assert ms["datasets"][2]["coordinateTransformations"] == [
        {"type": "scale", "scale": [1.0, 2.0, 2.0, 2.0]}, {"type": "translation", "translation": [0.0, 0.0, 0.75, 0.75]}]
    assert [c["label"] for c in body["omero"]["channels"]] == ["dna", "actin"]
    for k, want in enumerate(_expected_levels(_image(), "mean", (2, 3))):
        np.testing.assert_array_equal(g[str(k)][...], want)
    for k, want in enumerate(_expected_levels(_labels(), "mode", (1, 2))):
        np.testing.assert_array_equal(g[f"labels/cells/{k}"][...], want)
    lab = g["labels/cells"].attrs.asdict()
    lab = lab["ome"] if version == "0.5" else lab
    assert lab["image-label"]["source"] == {"image": "../../"}
    assert (g["labels"].attrs.asdict()["ome"] if version == "0.5" else g["labels"].attrs.asdict())["labels"] == ["cells"]
    if version == "0.5":
        assert g["0"].metadata.dimension_names == ("c", "z", "y", "x")
        assert g["0"].shards is not None
    else:
        assert json.loads((path / "0" / ".zarray").read_text())["dimension_separator"] == "/"


def test_our_reader(store):
    from gpu_zarr import read_zarr
    from gpu_zarr.omezarr import read_omezarr

    version, path, _ = store
    arr, res = read_omezarr(str(path), level=1)
    assert tuple(arr.shape) == (2, 3, 34, 23) and list(res) == [1.0, 2.0, 1.0, 1.0]
    got = read_zarr(str(path / "1"), prefer="cpu", progress=None)
    np.testing.assert_array_equal(np.asarray(got.data), _expected_levels(_image(), "mean", (2, 3))[1])


def test_tensorstore(store):
    ts = pytest.importorskip("tensorstore")
    version, path, _ = store
    driver = "zarr3" if version == "0.5" else "zarr"
    for k, want in enumerate(_expected_levels(_image(), "mean", (2, 3))):
        t = ts.open({"driver": driver, "kvstore": {"driver": "file", "path": str(path / str(k))}}, read=True).result()
        np.testing.assert_array_equal(t.read().result(), want)


def test_ome_zarr_py(store):
    pytest.importorskip("ome_zarr")
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Reader

    version, path, _ = store
    nodes = list(Reader(parse_url(str(path)))())
    image = nodes[0]
    assert len(image.data) == 3
    np.testing.assert_array_equal(np.asarray(image.data[0]), _image())
    np.testing.assert_array_equal(np.asarray(image.data[2]), _expected_levels(_image(), "mean", (2, 3))[2])
    assert [n.metadata.get("name") for n in nodes[1:]][-1] == "cells" or len(nodes) > 1


def test_ome_zarr_models_validate_it(store):
    """The OME-Zarr specification's models (ome-zarr-models, pydantic) accept the image, its
    labels group and the label image, for each version, and read back what was written."""
    omz = pytest.importorskip("ome_zarr_models")
    version, path, _ = store
    image = omz.open_ome_zarr(zarr.open_group(str(path), mode="r"))
    assert type(image).__name__ == "Image" and type(image).__module__.startswith(f"ome_zarr_models.v0{version[-1]}")
    ms = image.attributes.multiscales if version == "0.4" else image.ome_attributes.multiscales
    assert [a.name for a in ms[0].axes] == ["c", "z", "y", "x"] and len(ms[0].datasets) == 3
    assert type(omz.open_ome_zarr(zarr.open_group(str(path / "labels"), mode="r"))).__name__ == "Labels"
    assert type(omz.open_ome_zarr(zarr.open_group(str(path / "labels" / "cells"), mode="r"))).__name__ == "ImageLabel"


def test_napari_ome_zarr(store):
    reader_mod = pytest.importorskip("napari_ome_zarr._reader")
    version, path, _ = store
    layers = reader_mod.napari_get_reader(str(path))(str(path))
    images = [ly for ly in layers if ly[2] == "image"]  # napari-ome-zarr: one layer per omero channel
    assert [ly[1]["name"].rsplit(": ", 1)[-1] for ly in images] == ["dna", "actin"]
    want = _expected_levels(_image(), "mean", (2, 3))
    for c, (data, meta, _) in enumerate(images):
        assert len(data) == 3 and meta["scale"][-2:] == [0.5, 0.5]
        np.testing.assert_array_equal(np.asarray(data[1]), want[1][c])
    labels = [ly for ly in layers if ly[2] == "labels"]
    assert len(labels) == 1 and labels[0][1]["name"] == "cells"
    np.testing.assert_array_equal(np.asarray(labels[0][0][0]), _labels())


def test_dask_input_with_lazy_pyramid(tmp_path):
    da = pytest.importorskip("dask.array")
    a = _image()
    write_ome_zarr(da.from_array(a, chunks=(1, 2, 21, 17)), tmp_path / "d.zarr", axes="czyx", levels=3,
                   chunks=(1, 1, 16, 16), encoder="cpu")
    g = zarr.open_group(tmp_path / "d.zarr", mode="r")
    for k, want in enumerate(_expected_levels(a, "mean", (2, 3))):
        np.testing.assert_array_equal(g[str(k)][...], want)


def test_bad_ome_arguments(tmp_path):
    a = _image()
    for kw, match in [({"axes": "zyx"}, "4 dimensions"), ({"axes": "czyx", "units": {"x": "parsec-ish"}}, "space unit"),
                      ({"axes": "czyx", "ome_version": "0.3"}, "ome_version"),
                      ({"axes": "czyx", "channel_names": ["a"]}, "1 names"),
                      ({"axes": "czyx", "labels": {"x": np.zeros((3, 3), "uint8")}}, "label image 'x'"),
                      ({"axes": "czyx", "downsample": "max"}, "downsample")]:
        with pytest.raises(UsageError, match=match):
            write_ome_zarr(a, tmp_path / "b.zarr", encoder="cpu", **kw)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("shape,axes", [((37, 150, 203), (1, 2)), ((37, 150, 203), (0, 1, 2)), ((41, 33), (0, 1))])
@pytest.mark.parametrize("dtype,method", [("uint16", "mean"), ("float32", "mean"), ("int8", "mode"), ("bool", "mode")])
def test_a_level_halved_in_slabs_is_the_level_halved_at_once(monkeypatch, shape, axes, dtype, method):
    """Big levels are halved slab by slab along axis 0 (bounded temporaries): the same result,
    odd lengths and a halved axis 0 included."""
    from gpu_zarr.write import pyramid

    rng = np.random.default_rng(3)
    a = (rng.random(shape) if dtype == "float32" else rng.integers(0, 7, shape)).astype(dtype)
    whole = pyramid._reduce(a, axes, method, np)
    monkeypatch.setattr(pyramid, "_SLAB_BYTES", a.nbytes // 7 + 1)  # 7-8 slabs
    got = pyramid.downsample(a, axes, method)
    assert got.dtype == whole.dtype and np.array_equal(got, whole)


def test_a_pyramid_stays_on_the_host_when_the_gpu_has_no_room_for_it():
    """The GPU encoder's pyramid is computed on the GPU only when the image and its levels take
    at most half the free device memory; without a device to ask (here) it is computed on the
    host, and the writer uploads batch by batch."""
    from gpu_zarr.capabilities import probe
    from gpu_zarr.write.omezarr import _pyramid
    from gpu_zarr.write.writer import Stages

    if probe().gpu:
        pytest.skip("a GPU with room: the pyramid goes there")
    img = np.arange(4 * 64 * 64, dtype=np.uint16).reshape(4, 64, 64)
    levels = _pyramid(img, 3, (1, 2), "mean", True, Stages())
    assert [type(lv) for lv in levels] == [np.ndarray] * 3
    assert [lv.shape for lv in levels] == [(4, 64, 64), (4, 32, 32), (4, 16, 16)]
    np.testing.assert_array_equal(levels[1], downsample(img, (1, 2), "mean"))


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_image_pyramid_keeps_the_imaginary_part(tmp_path, dtype):
    """A complex image's mean levels, read by zarr-python, are the complex means of their blocks
    (summed in complex128, not float64, which dropped the imaginary part)."""
    rng = np.random.default_rng(4)
    a = (rng.normal(0, 100, (9, 6)) + 1j * rng.normal(0, 100, (9, 6))).astype(dtype)
    write_ome_zarr(a, tmp_path / "c.zarr", axes="yx", levels=2, chunks=4, encoder="cpu")
    got = zarr.open_array(str(tmp_path / "c.zarr" / "1"), mode="r")[...]
    padded = np.pad(a.astype(np.complex128), [(0, 1), (0, 0)], mode="edge")
    want = padded.reshape(5, 2, 3, 2).mean(axis=(1, 3)).astype(dtype)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.abs(got.imag).max() > 1
