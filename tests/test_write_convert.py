"""``convert`` and ``gpu-zarr convert``: an OME-Zarr 0.4 Blosc store (written by ome-zarr-py)
into sharded OME-Zarr 0.5 zstd; a plain v2 array into v3."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from gpu_zarr.cli import main
from gpu_zarr.write.convert import convert
from gpu_zarr.write.pyramid import downsample

pytest.importorskip("dask.array")


@pytest.fixture
def ome04(tmp_path):
    numcodecs = pytest.importorskip("numcodecs")
    writer = pytest.importorskip("ome_zarr.writer")
    rng = np.random.default_rng(0)
    a = rng.integers(0, 999, (2, 3, 64, 96)).astype("uint16")
    lab = rng.integers(0, 4, (3, 64, 96)).astype("uint8")
    root = zarr.open_group(tmp_path / "src.zarr", mode="w", zarr_format=2)
    opts = {"chunks": (1, 1, 32, 32), "compressor": numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE)}
    writer.write_image(a, root, axes="czyx", storage_options=opts)
    writer.write_labels(lab, root, name="cells", axes="zyx")
    return tmp_path / "src.zarr", a, lab


def test_convert_ome_04_blosc_to_05_sharded_zstd(ome04, tmp_path):
    src, a, lab = ome04
    res = convert(src, tmp_path / "dst.zarr", levels=3, encoder="cpu")
    assert res.arrays[:3] == ["0", "1", "2"] and "labels/cells/0" in res.arrays
    g = zarr.open_group(tmp_path / "dst.zarr", mode="r")
    ms = g.attrs.asdict()["ome"]["multiscales"][0]
    assert [ax["name"] for ax in ms["axes"]] == ["c", "z", "y", "x"]
    from gpu_zarr.omezarr import open_ome

    assert ms["datasets"][0]["coordinateTransformations"][0]["scale"] == list(open_ome(str(src)).levels[0].scale)
    assert ms["datasets"][1]["coordinateTransformations"][0]["scale"][2:] == [
        2 * v for v in open_ome(str(src)).levels[0].scale[2:]]
    assert g["0"].shards is not None and g["0"].metadata.codecs[0].codecs[1].to_dict()["name"] == "zstd"
    np.testing.assert_array_equal(g["0"][...], a)
    np.testing.assert_array_equal(g["1"][...], downsample(a, (2, 3), "mean"))
    np.testing.assert_array_equal(g["labels/cells/0"][...], lab)
    omz = pytest.importorskip("ome_zarr_models")  # the specification's models accept the result
    assert type(omz.open_ome_zarr(g)).__module__.startswith("ome_zarr_models.v05")
    assert type(omz.open_ome_zarr(g["labels/cells"])).__name__ == "ImageLabel"


def test_cli_convert_and_its_errors(ome04, tmp_path, capsys):
    src, a, _ = ome04
    assert main(["convert", str(src), str(tmp_path / "v2.zarr"), "--ome-version", "0.4", "--codec", "gzip",
                 "--chunks", "1,1,16,16", "--levels", "2", "--encoder", "cpu"]) == 0
    assert "wrote" in capsys.readouterr().out
    g = zarr.open_group(tmp_path / "v2.zarr", mode="r")
    assert g["0"].metadata.zarr_format == 2 and g["0"].chunks == (1, 1, 16, 16)
    np.testing.assert_array_equal(g["0"][...], a)
    assert main(["convert", str(src), str(tmp_path / "v2.zarr")]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "nothing"), str(tmp_path / "x.zarr")]) == 2
    with pytest.raises(SystemExit):
        main(["convert", str(src), str(tmp_path / "y.zarr"), "--shards", "a,b"])


def test_convert_plain_array(tmp_path):
    from gpu_zarr.write.api import write_zarr

    a = np.arange(50 * 70, dtype="int32").reshape(50, 70)
    write_zarr(a, tmp_path / "p", chunks=(16, 16), zarr_format=2, codec="blosc-lz4", encoder="cpu")
    res = convert(tmp_path / "p", tmp_path / "q", shards=(32, 32), encoder="cpu")
    z = zarr.open_array(tmp_path / "q", mode="r")
    assert res.arrays == [""] and z.shards == (32, 32) and z.chunks == (16, 16)
    np.testing.assert_array_equal(z[...], a)


def test_convert_reads_a_source_whole_or_in_blocks_to_the_same_store(ome04, tmp_path, monkeypatch):
    """A source that fits a quarter of the memory it goes to is read once, whole; a bigger one
    block by block through dask (here: the machine said to have no room): byte-equal stores."""
    from gpu_zarr.write import convert as convert_mod

    src, a, _ = ome04
    whole = convert_mod._source(str(src), 0, None)
    assert not hasattr(whole, "dask") and np.array_equal(whole.get() if hasattr(whole, "get") else whole, a)
    convert(src, tmp_path / "whole.zarr", levels=3, encoder="cpu")
    monkeypatch.setattr(convert_mod, "free_bytes", lambda on_gpu: 0)
    assert hasattr(convert_mod._source(str(src), 0, None), "dask")
    convert(src, tmp_path / "blocks.zarr", levels=3, encoder="cpu")
    for k in ("0", "1", "2", "labels/cells/0", "labels/cells/2"):
        one = zarr.open_array(tmp_path / "whole.zarr" / k, mode="r")
        two = zarr.open_array(tmp_path / "blocks.zarr" / k, mode="r")
        assert one.shape == two.shape and np.array_equal(one[...], two[...]), k


@pytest.mark.parametrize("ome_version", ["0.5", "0.4"])
def test_convert_a_v2_array_whose_fill_value_is_null(tmp_path, ome_version):
    """zarr v2 stores often say ``"fill_value": null``; their edge chunks are padded with zarr's
    default (it was a TypeError from the pad) and zarr-python reads the same values back."""
    a = np.arange(3 * 20 * 30, dtype="uint16").reshape(3, 20, 30)
    z = zarr.create_array(str(tmp_path / "v2.zarr"), shape=a.shape, chunks=(1, 7, 9), dtype=a.dtype,
                          zarr_format=2, fill_value=None)
    z[...] = a
    convert(tmp_path / "v2.zarr", tmp_path / "out.zarr", encoder="cpu", ome_version=ome_version)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "out.zarr"), mode="r")[...], a)
