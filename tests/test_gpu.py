"""GPU tests (H200 machine): every backend pixel-exact against zarr's CPU read.

Run with ``pytest -m gpu``; they skip cleanly without cupy and a CUDA device.
"""

from __future__ import annotations

import numpy as np
import pytest

from chains import CHAINS
from stores import DTYPES, LAYOUTS, SELECTIONS, data, write

pytestmark = pytest.mark.gpu


def _cpu(arr, sel=Ellipsis):
    return arr[...][sel]


def _eq(got, want):
    import cupy

    assert isinstance(got, cupy.ndarray)
    assert got.shape == want.shape
    assert got.dtype == want.dtype.newbyteorder("=")
    np.testing.assert_array_equal(got.get(), want)


@pytest.mark.parametrize("name,kw", LAYOUTS, ids=[n for n, _ in LAYOUTS])
@pytest.mark.parametrize("prefer", ["kvikio", "zarr-gpu", "auto"])
def test_backends_match_zarr_cpu(tmp_path, name, kw, prefer):
    from gpu_zarr.zarr_io import read_zarr_to_gpu

    arr, _ = write(tmp_path / "a.zarr", **kw)
    _eq(read_zarr_to_gpu(tmp_path / "a.zarr", prefer=prefer), _cpu(arr))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt,codec", [(2, "raw"), (2, "zstd"), (3, "raw"), (3, "zstd")])
def test_dtypes_kvikio(tmp_path, dtype, fmt, codec):
    from gpu_zarr.zarr_io import read_zarr_to_gpu

    arr, _ = write(tmp_path / "a.zarr", fmt=fmt, codec=codec, dtype=dtype,
                   fill_value=False if dtype == "|b1" else 0)
    _eq(read_zarr_to_gpu(tmp_path / "a.zarr", prefer="kvikio"), _cpu(arr))


@pytest.mark.parametrize("name,kw", LAYOUTS, ids=[n for n, _ in LAYOUTS])
@pytest.mark.parametrize("sel", SELECTIONS, ids=range(len(SELECTIONS)))
def test_regions_kvikio(tmp_path, name, kw, sel):
    from gpu_zarr.zarr_io import read_region

    arr, _ = write(tmp_path / "a.zarr", **kw)
    _eq(read_region(arr, sel, backend="kvikio"), _cpu(arr, sel))


def test_threads_reader_and_tiny_batches(tmp_path):
    from gpu_zarr.engine import EngineOptions, read

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", chunks=(4, 8, 7), shards=(8, 16, 14))
    for reader in ("threads", "kvikio"):
        res = read(arr, Ellipsis, device="gpu", options=EngineOptions(batch_bytes=1, slots=3, reader=reader))
        _eq(res.data, _cpu(arr))
        assert res.stats["reader"].startswith(reader) and res.stats["batches"] > 10


@pytest.mark.parametrize("direct", [True, False])
def test_raw_direct_to_device_and_staged(tmp_path, direct):
    from gpu_zarr.engine import EngineOptions, read

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="raw", dtype=">i2", endian="big")
    opts = EngineOptions(batch_bytes=1, slots=2, reader="kvikio", direct_raw=direct)
    res = read(arr, (slice(1, 30), slice(None, None, -2)), device="gpu", options=opts)
    _eq(res.data, _cpu(arr)[1:30, ::-2])
    assert ("device memory" in res.stats["reader"]) == direct


def test_auto_serves_every_chain_with_the_engine(tmp_path):
    import zarr
    from zarr.codecs import BloscCodec, ZstdCodec

    from gpu_zarr.zarr_io import choose_backend, last_choice, read_zarr_to_gpu

    p = tmp_path / "b.zarr"  # two compressors in a row: the codecs' own decode, then the engine's upload and place
    a = zarr.create_array(str(p), shape=(20, 20), chunks=(7, 7), dtype="u2", compressors=[BloscCodec(), ZstdCodec()])
    a[...] = np.arange(400, dtype="u2").reshape(20, 20)
    assert choose_backend(p).backend == "kvikio"
    _eq(read_zarr_to_gpu(p), a[...])
    assert last_choice().backend == "kvikio" and "blosc, zstd by the codecs' own decode" in last_choice().reason
    _eq(read_zarr_to_gpu(p, prefer="kvikio"), a[...])


@pytest.mark.parametrize("name,make", CHAINS, ids=[n for n, _ in CHAINS])
@pytest.mark.parametrize("sel", [Ellipsis, SELECTIONS[2], SELECTIONS[4]], ids=range(3))
def test_chains_gpu(tmp_path, name, make, sel):
    """Every chain of tests/chains.py through the engine on the GPU, whole and in regions."""
    from gpu_zarr.zarr_io import read_region

    arr, _ = make(tmp_path / "a.zarr")
    _eq(read_region(arr, sel, backend="kvikio"), _cpu(arr, sel))


def test_auto_reads_blosc_with_the_engine(tmp_path):
    import zarr
    from zarr.codecs import BloscCodec

    from gpu_zarr.zarr_io import choose_backend, read_zarr_to_gpu

    p = tmp_path / "b.zarr"
    a = zarr.create_array(str(p), shape=(20, 20), chunks=(7, 7), dtype="u2", compressors=BloscCodec())
    a[...] = np.arange(400, dtype="u2").reshape(20, 20)
    assert choose_backend(p).backend == "kvikio"
    _eq(read_zarr_to_gpu(p), a[...])


def test_auto_chooses_direct_engine(tmp_path):
    from gpu_zarr.zarr_io import choose_backend

    write(tmp_path / "a.zarr", fmt=3, codec="zstd")
    c = choose_backend(tmp_path / "a.zarr")
    assert c.backend == "kvikio" and "zstd" in c.reason


def test_corrupt_frame_never_reaches_nvcomp(tmp_path):
    from gpu_zarr.errors import CorruptChunkError
    from gpu_zarr.zarr_io import read_zarr_to_gpu

    write(tmp_path / "a.zarr", fmt=3, codec="zstd")
    f = tmp_path / "a.zarr" / "c" / "0" / "1" / "2"
    f.write_bytes(f.read_bytes()[:-7])
    with pytest.raises(CorruptChunkError, match="c/0/1/2"):
        read_zarr_to_gpu(tmp_path / "a.zarr", prefer="kvikio")
    # the device is still healthy afterwards
    write(tmp_path / "b.zarr", fmt=3, codec="zstd")
    read_zarr_to_gpu(tmp_path / "b.zarr", prefer="kvikio")


def test_out_of_gpu_memory_raises_before_allocating(tmp_path, monkeypatch):
    from gpu_zarr.engine import fit
    from gpu_zarr.errors import OutOfGPUMemory
    from gpu_zarr.zarr_io import read_zarr_to_gpu

    write(tmp_path / "a.zarr", fmt=3, codec="raw")
    monkeypatch.setattr(fit, "device_memory", lambda: (1000, 80 << 30))
    for backend in ("kvikio", "zarr-gpu"):
        with pytest.raises(OutOfGPUMemory, match="read_region"):
            read_zarr_to_gpu(tmp_path / "a.zarr", prefer=backend)


@pytest.mark.parametrize("backend", ["auto", "kvikio", "zarr-gpu"])
def test_absurd_shape_is_a_clear_error(tmp_path, backend):
    """A store whose metadata asks for exabytes: a clear error at once, the process stays small."""
    import resource

    import zarr

    from gpu_zarr.errors import OutOfGPUMemory
    from gpu_zarr.zarr_io import read_zarr_to_gpu

    zarr.create_array(str(tmp_path / "huge.zarr"), shape=(2**40, 2**20), chunks=(64, 1024), dtype="u2",
                      compressors=None)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(OutOfGPUMemory, match="GiB"):
        read_zarr_to_gpu(tmp_path / "huge.zarr", prefer=backend)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: < 200 MiB


# --- the nvCOMP codec ------------------------------------------------------------------


def _frame_without_content_size(frame: bytes) -> bytes:
    """Rewrite a zstd frame header to omit the content size (as streaming writers do)."""
    fhd = frame[4]
    fcs_flag, single, ck = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1
    fcs_size = {0: single, 1: 2, 2: 4, 3: 8}[fcs_flag]
    pos = 5 + (1 - single)
    size = int.from_bytes(frame[pos:pos + fcs_size], "little") + (256 if fcs_size == 2 else 0)
    e = 0
    while (1 << (10 + e)) < size:
        e += 1
    return frame[:4] + bytes([ck << 2, e << 3]) + frame[pos + fcs_size:]


@pytest.mark.parametrize("checksum", [False, True])
@pytest.mark.parametrize("no_content_size", [False, True])
def test_codec_reads_cpu_written_chunks(tmp_path, checksum, no_content_size):
    import zarr

    from gpu_zarr.zarr_io import gpu_zarr_context

    arr, values = write(tmp_path / "a.zarr", fmt=3, codec="zstd", checksum=checksum, partial=False)
    if no_content_size:
        for f in (tmp_path / "a.zarr" / "c").rglob("*"):
            if f.is_file():
                f.write_bytes(_frame_without_content_size(f.read_bytes()))
        np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...], values)
    with gpu_zarr_context():
        got = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...]
    _eq(got, values)
    if no_content_size:
        from gpu_zarr.zarr_io import read_zarr_to_gpu

        _eq(read_zarr_to_gpu(tmp_path / "a.zarr", prefer="kvikio"), values)


@pytest.mark.parametrize("checksum", [False, True])
def test_codec_writes_chunks_cpu_reads(tmp_path, checksum):
    import cupy
    import zarr

    from gpu_zarr.nvcomp_zstd import NvcompZstdCodec
    from gpu_zarr.zarr_io import gpu_zarr_context

    values = data((40, 30, 20), "<u2", seed=3)
    with gpu_zarr_context():
        a = zarr.create_array(str(tmp_path / "w.zarr"), shape=values.shape, chunks=(16, 16, 16), dtype="u2",
                              compressors=NvcompZstdCodec(level=1, checksum=checksum))
        a[...] = cupy.asarray(values)
    meta = zarr.open_array(str(tmp_path / "w.zarr"), mode="r").metadata.to_dict()
    assert {"name": "zstd", "configuration": {"level": 1, "checksum": checksum}} in meta["codecs"]
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "w.zarr"), mode="r")[...], values)


def test_codec_batches_one_nvcomp_call(tmp_path, monkeypatch):
    import zarr

    from gpu_zarr.engine import decode, ops
    from gpu_zarr.zarr_io import gpu_zarr_context

    write(tmp_path / "a.zarr", fmt=3, codec="zstd", partial=False)
    calls = []
    real = decode.decode_batch_gpu

    def spy(algo, src, offs, *a, **k):
        calls.append(len(offs))
        return real(algo, src, offs, *a, **k)

    monkeypatch.setattr(decode, "decode_batch_gpu", spy)  # the nvCOMP codec's call
    monkeypatch.setattr(ops, "decode_batch_gpu", spy)  # the engine stages' call (the codec pipeline)
    from gpu_zarr import settings

    with settings.set(small_read=0), gpu_zarr_context():  # every batch to nvCOMP, however small
        zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[...]
    n_chunks = 5 * 4 * 4
    assert sum(calls) == n_chunks and len(calls) < n_chunks / 8


def test_seed_example_runs_with_our_names(tmp_path):
    import cupy

    from gpu_zarr.omezarr import read_omezarr
    from gpu_zarr.sample import write_sample_omezarr
    from gpu_zarr.zarr_io import gpu_zarr_context

    path = write_sample_omezarr(tmp_path / "s.ome.zarr")
    cpu, _ = read_omezarr(path, level=0)
    regions = [(0, slice(0, 8)), (1, 3, slice(10, 40))]
    expected = [cpu[r] for r in regions]  # read before: inside the context zarr returns cupy
    with gpu_zarr_context():
        vol, _ = read_omezarr(path, level=0)
        for tile_region, want in zip(regions, expected):
            tile_gpu = vol[tile_region]  # already cupy
            assert isinstance(tile_gpu, cupy.ndarray)
            np.testing.assert_array_equal(tile_gpu.get(), want)


def test_context_restores_config():
    import zarr

    from gpu_zarr.zarr_io import gpu_zarr_context

    before = (zarr.config.get("buffer"), zarr.config.get("codecs.zstd"))
    with gpu_zarr_context():
        assert zarr.config.get("codecs.zstd") == "gpu_zarr.nvcomp_zstd.NvcompZstdCodec"
        with gpu_zarr_context():
            pass
        assert zarr.config.get("buffer") == "zarr.buffer.gpu.Buffer"
    assert (zarr.config.get("buffer"), zarr.config.get("codecs.zstd")) == before


def test_kvikio_thread_setting_is_restored_after_a_read(tmp_path):
    pytest.importorskip("kvikio")
    import kvikio.defaults

    from gpu_zarr.engine import EngineOptions
    from gpu_zarr.zarr_io import read_zarr

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="raw", partial=False)
    before = kvikio.defaults.get("num_threads")
    res = read_zarr(tmp_path / "a.zarr", prefer="kvikio", options=EngineOptions(reader="kvikio", threads=before + 3),
                    progress=False)
    assert res.stats["reader"].startswith("kvikio")
    assert kvikio.defaults.get("num_threads") == before
