"""gpu_zarr_context() on zarr v2 compressed arrays: decoded through the engine's codec stages."""

from __future__ import annotations

import warnings

import numcodecs
import numpy as np
import pytest
import zarr

from gpu_zarr.engine import decode_chunks
from gpu_zarr.engine.layout import chunk_layout
from gpu_zarr.engine.metadata import codec_of_v2_compressor

V2_COMPRESSORS = {
    "zstd": numcodecs.Zstd(level=3),
    "gzip": numcodecs.GZip(level=5),
    "zlib": numcodecs.Zlib(level=1),
    # OME-Zarr 0.4 as bioformats2raw / zarr-python 2 / ome-zarr-py write it (engine/blosc.py)
    "blosc-lz4-shuffle": numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE),
    "blosc-zstd-bitshuffle": numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.BITSHUFFLE),
    "blosc-blosclz": numcodecs.Blosc(cname="blosclz", clevel=5),  # decoded on the host inside the stage
}


def _values(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(1000, 50, shape)).astype(dtype)


@pytest.mark.parametrize("name", sorted(V2_COMPRESSORS))
@pytest.mark.parametrize("order", ["C", "F"])
def test_decode_chunks_cpu_twin_matches_numcodecs(name, order):
    comp = V2_COMPRESSORS[name]
    dtype = np.dtype("<u2")
    stage, params = codec_of_v2_compressor(comp, dtype)
    chunks = [_values((6, 10), dtype, seed) for seed in range(5)]
    encoded = [np.frombuffer(comp.encode(np.asfortranarray(c) if order == "F" else c), np.uint8) for c in chunks]
    lay = chunk_layout((6, 10), dtype, stage, params)
    buf, offsets = decode_chunks(lay, encoded, device="cpu")
    for c, off in zip(chunks, offsets.tolist()):
        got = buf[off:off + lay.inner_nbytes].view(dtype).reshape((6, 10), order=order)
        np.testing.assert_array_equal(got, c)


def _v2_store(path, compressor, dtype="<u2", order="C", filters=None):
    a = zarr.create_array(str(path), shape=(20, 30, 17), chunks=(4, 8, 7), dtype=dtype, zarr_format=2,
                          compressors=compressor, order=order, filters=filters, fill_value=0)
    values = _values((20, 30, 17), dtype)
    a[:12] = values[:12]
    return zarr.open_array(str(path), mode="r")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(V2_COMPRESSORS))
@pytest.mark.parametrize("order", ["C", "F"])
def test_context_reads_v2_compressed_on_the_gpu(tmp_path, name, order):
    import cupy

    from gpu_zarr.zarr_io import gpu_zarr_context

    cpu = _v2_store(tmp_path / "a.zarr", V2_COMPRESSORS[name], order=order)
    sel = (slice(2, 15), slice(None, None, 3), 5)
    want = cpu[sel]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no host round trip for these
        with gpu_zarr_context():
            got = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[sel]
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(got.get(), want)


@pytest.mark.gpu
def test_context_other_codecs_round_trip_through_the_host_with_one_warning(tmp_path):
    import cupy

    from gpu_zarr.zarr_io import gpu_zarr_context

    cpu = _v2_store(tmp_path / "a.zarr", numcodecs.BZ2(level=1))
    want = cpu[...]
    with pytest.warns(UserWarning, match="'bz2' has no GPU decoder"):
        with gpu_zarr_context():
            got = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...]
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(got.get(), want)


@pytest.mark.gpu
def test_context_corrupt_v2_chunk_names_the_problem(tmp_path):
    from gpu_zarr.errors import CorruptChunkError
    from gpu_zarr.zarr_io import gpu_zarr_context

    _v2_store(tmp_path / "a.zarr", numcodecs.Zstd(level=1))
    f = tmp_path / "a.zarr" / "0.0.0"
    f.write_bytes(f.read_bytes()[:-5])
    with pytest.raises(CorruptChunkError):
        with gpu_zarr_context():
            zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...]
