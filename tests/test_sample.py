"""Synthetic OME-Zarr writer and the cached sample."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from gpu_zarr import settings
from gpu_zarr.omezarr import open_ome
from gpu_zarr.sample import SAMPLE_NAME, default_cache_dir, make_volume, sample_path, write_sample_omezarr


def test_make_volume_is_deterministic_and_structured():
    a, la = make_volume((2, 8, 64, 64), seed=3)
    b, lb = make_volume((2, 8, 64, 64), seed=3)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)
    assert a.dtype == np.uint16 and la.dtype == np.uint32 and la.shape == (8, 64, 64)
    assert la.max() > 1 and 0 in la  # several labelled blobs on a background
    # blobs are brighter than background in channel 0
    assert a[0][la > 0].mean() > 2 * a[0][la == 0].mean()
    assert not np.array_equal(a, make_volume((2, 8, 64, 64), seed=4)[0])
    with pytest.raises(ValueError, match=r"\(c, z, y, x\)"):
        make_volume((8, 64, 64))


@pytest.mark.parametrize(("version", "fmt"), [("0.5", 3), ("0.4", 2)])
@pytest.mark.parametrize("compressor", ["zstd", None, "blosc"])
def test_write_sample(tmp_path, version, fmt, compressor):
    path = write_sample_omezarr(tmp_path / "s.ome.zarr", version=version, shape=(2, 6, 40, 36),
                                levels=3, chunks=(1, 3, 16, 16), compressor=compressor)
    root = zarr.open_group(str(path), mode="r")
    assert root.metadata.zarr_format == fmt
    img, lab = make_volume((2, 6, 40, 36))
    a0 = root["0"]
    assert a0.chunks == (1, 3, 16, 16)
    np.testing.assert_array_equal(a0[...], img)
    assert root["1"].shape == (2, 6, 20, 18) and root["2"].shape == (2, 6, 10, 9)
    # level 1 is the 2x2 mean of level 0
    want = np.rint(img.reshape(2, 6, 20, 2, 18, 2).mean(axis=(3, 5))).astype(np.uint16)
    np.testing.assert_array_equal(root["1"][...], want)
    np.testing.assert_array_equal(root["labels/blobs/0"][...], lab)
    np.testing.assert_array_equal(root["labels/blobs/1"][...], lab[:, ::2, ::2])
    codecs = json.dumps(a0.metadata.to_dict())
    if compressor is None:
        assert "zstd" not in codecs and "blosc" not in codecs
    else:
        assert compressor in codecs
    if fmt == 2:
        assert a0.metadata.dimension_separator == "/"  # OME-NGFF 0.4 requires nested chunk keys
        assert (path / "0" / "0" / "0" / "0" / "0").is_file()
    else:
        assert a0.metadata.dimension_names == ("c", "z", "y", "x")
    ome = open_ome(path)
    assert ome.version == version and [c.name for c in ome.channels] == ["nuclei", "membranes"]
    assert list(ome.labels) == ["blobs"] and ome.labels["blobs"].is_label


def test_write_sample_refuses_to_overwrite(tmp_path):
    path = write_sample_omezarr(tmp_path / "s.zarr", shape=(1, 2, 16, 16), levels=1, labels=False)
    assert not (path / "labels").exists()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_sample_omezarr(path, shape=(1, 2, 16, 16), levels=1)
    write_sample_omezarr(path, shape=(1, 2, 8, 8), levels=1, overwrite=True)
    assert zarr.open_array(str(path / "0"), mode="r").shape == (1, 2, 8, 8)
    with pytest.raises(ValueError, match="version"):
        write_sample_omezarr(tmp_path / "v.zarr", version="0.6")
    with pytest.raises(ValueError, match="compressor"):
        write_sample_omezarr(tmp_path / "c.zarr", shape=(1, 2, 8, 8), compressor="lz5")


@pytest.fixture
def cache_setting(tmp_path):
    """The ``cache_dir`` setting (``GPU_ZARR_CACHE``) at ``tmp_path / "cache"`` for one test."""
    with settings.set(cache_dir=str(tmp_path / "cache")):
        yield tmp_path / "cache"


def test_sample_path_writes_once_and_reuses(tmp_path, cache_setting):
    assert default_cache_dir() == tmp_path / "cache"
    p = sample_path()
    assert p == tmp_path / "cache" / SAMPLE_NAME and (p / "zarr.json").is_file()
    marker = (p / "zarr.json").stat().st_mtime_ns
    assert sample_path() == p and (p / "zarr.json").stat().st_mtime_ns == marker
    assert [q.name for q in (tmp_path / "cache").iterdir()] == [SAMPLE_NAME]  # no temp leftovers
    ome = open_ome(p)
    assert ome.levels[0].shape == (2, 64, 512, 512) and ome.levels[0].nbytes == 64 * 2**20
    size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    assert size < 200 * 2**20
    other = sample_path(tmp_path / "elsewhere")
    assert other.parent == tmp_path / "elsewhere"


def test_default_cache_dir_without_env(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with settings.set(cache_dir=""):
        assert default_cache_dir() == tmp_path / "napari-gpu-zarr"
