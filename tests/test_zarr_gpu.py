"""The zarr-gpu path through zarr's own extension points (gpu_zarr.zarr_gpu).

CI has no GPU: the pipeline runs here with zarr's host buffers, where it decodes with the
engine stages' CPU twins, with the same chain recognition and size checks as on the GPU.
The GPU tests (``-m gpu``) read the same stores through ``gpu_zarr_context()``.
"""

from __future__ import annotations

import numcodecs
import numpy as np
import pytest
import zarr

from blosc_cases import write_blosc
from gpu_zarr import zarr_gpu
from gpu_zarr.errors import CorruptChunkError
from stores import write

CASES = [
    dict(fmt=2, codec="raw"), dict(fmt=2, codec="zstd"), dict(fmt=2, codec="gzip"), dict(fmt=2, codec="zlib"),
    dict(fmt=3, codec="raw"), dict(fmt=3, codec="zstd"), dict(fmt=3, codec="gzip"),
    dict(fmt=3, codec="zstd", shards=(16, 32, 14)), dict(fmt=2, codec="zstd", order="F"),
    dict(fmt=3, codec="raw", endian="big"), dict(fmt=2, codec="raw", dtype=">i4"),
]


def _ours(path, sel=Ellipsis):
    with zarr.config.set({"codec_pipeline.path": zarr_gpu.PIPELINE}):
        a = zarr.open_array(path, mode="r")
        assert type(a._async_array.codec_pipeline).__name__ == "GpuCodecPipeline"
        return np.asarray(a[sel])


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_pipeline_reads_what_zarr_reads(tmp_path, kw):
    _, want = write(tmp_path / "a.zarr", **kw)
    got = _ours(tmp_path / "a.zarr")
    np.testing.assert_array_equal(got, zarr.open_array(tmp_path / "a.zarr", mode="r")[...])
    np.testing.assert_array_equal(_ours(tmp_path / "a.zarr", (3, slice(2, 40), 5)),
                                  zarr.open_array(tmp_path / "a.zarr", mode="r")[3, 2:40, 5])


@pytest.mark.parametrize("cname,shuffle", [("lz4", "shuffle"), ("zstd", "bitshuffle"), ("zlib", "noshuffle")])
def test_pipeline_reads_blosc(tmp_path, cname, shuffle):
    write_blosc(tmp_path / "b.zarr", cname=cname, shuffle=shuffle)
    np.testing.assert_array_equal(_ours(tmp_path / "b.zarr"), zarr.open_array(tmp_path / "b.zarr", mode="r")[...])


def test_pipeline_hands_other_chains_to_zarr(tmp_path):
    a = zarr.create_array(tmp_path / "f.zarr", shape=(40, 30), chunks=(16, 16), dtype="<f8", zarr_format=2,
                          filters=[numcodecs.Delta(dtype="<f8")], compressors=numcodecs.Zstd(1))
    a[...] = np.arange(1200.0).reshape(40, 30)
    np.testing.assert_array_equal(_ours(tmp_path / "f.zarr"), a[...])


@pytest.mark.parametrize("index", [["big"], ["big", "crc32c"]], ids=["big", "big-crc32c"])
def test_pipeline_reads_big_endian_shard_indexes(tmp_path, index):
    """A big-endian shard index is parsed in its own byte order by the pipeline's index check
    (never as little-endian, then refused as corrupt) and by the engine, which serves it."""
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec

    from gpu_zarr.zarr_io import read_zarr

    idx = [BytesCodec(endian="big")] + ([Crc32cCodec()] if "crc32c" in index else [])
    sc = ShardingCodec(chunk_shape=(2, 4, 3), codecs=[BytesCodec(), ZstdCodec(level=1)], index_codecs=idx)
    a = zarr.create_array(tmp_path / "s.zarr", shape=(13, 21, 10), chunks=(4, 8, 6), dtype="<u2", zarr_format=3,
                          serializer=sc, compressors=None, fill_value=0)
    a[:7] = np.arange(7 * 21 * 10, dtype="<u2").reshape(7, 21, 10)
    want = zarr.open_array(tmp_path / "s.zarr", mode="r")[...]
    np.testing.assert_array_equal(_ours(tmp_path / "s.zarr"), want)
    res = read_zarr(tmp_path / "s.zarr", prefer="cpu", progress=False)
    assert "native host path" in res.reason, res.reason  # served by the engine, not zarr-python
    np.testing.assert_array_equal(res.data, want)


def _chunk_file(root, fmt):
    return root / ("0.0.0" if fmt == 2 else "c/0/0/0")


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("damage", ["truncated", "empty", "longer", "other-array"])
def test_wrong_size_raw_chunks_are_named_never_data(tmp_path, fmt, damage):
    write(tmp_path / "a.zarr", fmt=fmt, codec="raw")
    f = _chunk_file(tmp_path / "a.zarr", fmt)
    raw = f.read_bytes()
    f.write_bytes({"truncated": raw[:-10], "empty": b"", "longer": raw + raw[:64],
                   "other-array": raw[: len(raw) // 2]}[damage])
    with pytest.raises(CorruptChunkError, match=r"chunk .*0.0.0|chunk c/0/0/0"):
        _ours(tmp_path / "a.zarr")


@pytest.mark.parametrize("kw", [dict(fmt=2, codec="zstd"), dict(fmt=3, codec="gzip"), dict(fmt=2, codec="zlib")])
def test_damaged_compressed_chunk_is_an_error(tmp_path, kw):
    write(tmp_path / "a.zarr", **kw)
    f = _chunk_file(tmp_path / "a.zarr", kw["fmt"])
    f.write_bytes(f.read_bytes()[:-7])  # truncated: zarr's own read raises too
    with pytest.raises(Exception):  # noqa: B017 - zarr raises something
        zarr.open_array(tmp_path / "a.zarr", mode="r")[...]
    with pytest.raises(CorruptChunkError, match=r"0\.0\.0|c/0/0/0"):
        _ours(tmp_path / "a.zarr")


@pytest.mark.parametrize("where", [-9, -3, 2])  # in the index, in its crc32c, in the first frame's header
def test_flipped_bit_in_a_shard_is_an_error_where_zarr_finds_one(tmp_path, where):
    write(tmp_path / "s.zarr", codec="zstd", shards=(16, 32, 14))
    f = tmp_path / "s.zarr" / "c" / "0" / "0" / "0"
    raw = bytearray(f.read_bytes())
    raw[where] ^= 0x40
    f.write_bytes(bytes(raw))
    with pytest.raises(Exception):  # noqa: B017 - zarr's own read finds it
        zarr.open_array(tmp_path / "s.zarr", mode="r")[...]
    with pytest.raises((CorruptChunkError, ValueError)):
        _ours(tmp_path / "s.zarr")


def test_corrupt_inner_chunk_is_named_by_its_shard(tmp_path):
    """An inner chunk has no key of its own in zarr's sharding codec: the error names the shard."""
    write(tmp_path / "s.zarr", codec="zstd", shards=(16, 32, 14))
    f = tmp_path / "s.zarr" / "c" / "0" / "0" / "1"
    raw = bytearray(f.read_bytes())
    raw[4:40] = b"\x5a" * 36  # the first inner chunk's frame header and first block: garbage
    f.write_bytes(bytes(raw))
    with pytest.raises(Exception):  # noqa: B017 - zarr's own read finds it
        zarr.open_array(tmp_path / "s.zarr", mode="r")[...]
    # by its position in the shard where zarr says it, else by its place in the shard's batch
    with pytest.raises(CorruptChunkError, match=r"c/0/0/1 inner chunk (\(0, 0, 0\)|#0 of \d+ read) of file://"):
        _ours(tmp_path / "s.zarr")


def test_pickle_is_refused_in_the_host_round_trip(tmp_path):
    codec = zarr_gpu.GpuCodecPipeline
    assert codec is not None
    with pytest.raises(Exception, match="pickle"):
        zarr_gpu._refuse_pickle([numcodecs.Pickle()])


@pytest.mark.parametrize("user_pipeline", ["zarr.core.codec_pipeline.BatchedCodecPipeline",
                                           "zarr.core.codec_pipeline.FusedCodecPipeline"])
def test_gpu_decoding_is_scoped_and_restores_the_users_pipeline(user_pipeline):
    from zarr.registry import get_pipeline_class

    try:
        get_pipeline_class_ok = True
        with zarr.config.set({"codec_pipeline.path": user_pipeline}):
            get_pipeline_class()
    except Exception:  # noqa: BLE001 - zarr 3.1 has no fused pipeline
        get_pipeline_class_ok = False
    if not get_pipeline_class_ok:
        pytest.skip(f"{user_pipeline} does not exist in zarr {zarr.__version__}")
    with zarr.config.set({"codec_pipeline.path": user_pipeline}):
        before = dict(zarr.config.get("codecs"))
        with zarr_gpu.gpu_decoding():
            assert zarr.config.get("codec_pipeline.path") == zarr_gpu.PIPELINE
            assert get_pipeline_class() is zarr_gpu.GpuCodecPipeline
            assert zarr.config.get("buffer").endswith("gpu.Buffer")
        assert zarr.config.get("codec_pipeline.path") == user_pipeline
        assert dict(zarr.config.get("codecs")) == before
        assert not zarr.config.get("buffer").endswith("gpu.Buffer")


def test_nothing_of_zarr_is_patched():
    from zarr.codecs._v2 import V2Codec
    from zarr.core.codec_pipeline import BatchedCodecPipeline

    before = (V2Codec.decode, V2Codec._decode_single, BatchedCodecPipeline.decode_batch)
    with zarr_gpu.gpu_decoding():
        assert (V2Codec.decode, V2Codec._decode_single, BatchedCodecPipeline.decode_batch) == before


# -- on the GPU -------------------------------------------------------------------------------------
NATIVE_ORDER = [kw for kw in CASES if kw.get("endian") != "big" and not str(kw.get("dtype", "")).startswith(">")]


@pytest.mark.gpu
@pytest.mark.parametrize("kw", NATIVE_ORDER, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_context_reads_on_the_gpu(tmp_path, kw):
    import cupy

    from gpu_zarr.zarr_io import gpu_zarr_context

    write(tmp_path / "a.zarr", **kw)
    want = zarr.open_array(tmp_path / "a.zarr", mode="r")[...]
    with gpu_zarr_context():
        got = zarr.open_array(tmp_path / "a.zarr", mode="r")[...]
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(got).astype(want.dtype.newbyteorder("=")), want)


@pytest.mark.gpu
@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_zarr_gpu_backend_reads_what_zarr_reads(tmp_path, kw):
    """Big-endian arrays too: cupy has no big-endian dtypes, so the backend reads them on the host."""
    from gpu_zarr.zarr_io import read_zarr

    write(tmp_path / "a.zarr", **kw)
    want = zarr.open_array(tmp_path / "a.zarr", mode="r")[...]
    res = read_zarr(tmp_path / "a.zarr", prefer="zarr-gpu", progress=False)
    assert res.backend == "zarr-gpu"
    np.testing.assert_array_equal(res.data.get(), want.astype(want.dtype.newbyteorder("=")))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("damage", ["truncated", "empty", "longer"])
def test_zarr_gpu_backend_names_wrong_size_chunks(tmp_path, fmt, damage):
    from gpu_zarr.zarr_io import read_zarr

    write(tmp_path / "a.zarr", fmt=fmt, codec="raw")
    f = _chunk_file(tmp_path / "a.zarr", fmt)
    raw = f.read_bytes()
    f.write_bytes({"truncated": raw[:-10], "empty": b"", "longer": raw + raw[:64]}[damage])
    with pytest.raises(CorruptChunkError, match=r"0.0.0|c/0/0/0"):
        read_zarr(tmp_path / "a.zarr", prefer="zarr-gpu", progress=False)


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_pipeline_reads_shards_one_task_each_on_host_buffers(tmp_path, codec):
    """The pipeline's per-shard tasks (an inner chunk's error names its shard) hand zarr back every
    chunk's result: a sharded read through it, on host buffers, equals zarr's own."""
    import zarr

    from gpu_zarr import zarr_gpu
    from stores import write

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec=codec, chunks=(4, 8, 7), shards=(8, 16, 14))
    # several shards per batch, as the GPU configuration reads them
    with zarr.config.set({"codec_pipeline.path": zarr_gpu.PIPELINE, "codec_pipeline.batch_size": 8}):
        a = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
        assert type(a._async_array.codec_pipeline).__name__ == "GpuCodecPipeline"
        np.testing.assert_array_equal(a[...], arr[...])
        np.testing.assert_array_equal(a[3:30, 5], arr[3:30, 5])
