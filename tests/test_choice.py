"""Where a read decodes (:mod:`gpu_zarr.engine.choice`): CPU threads or nvCOMP batches on the
GPU, chosen from estimated times that use this process's measured host decode rates."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from gpu_zarr import capabilities, settings, zarr_io
from gpu_zarr.capabilities import Capabilities
from gpu_zarr.engine import choice
from gpu_zarr.engine.choice import DecodeRates, GiB, choose
from gpu_zarr.engine.plan import normalize_selection

MiB = 1 << 20


@pytest.fixture
def fake_gpu(monkeypatch):
    """A probe that reports a GPU with kvikio and nvCOMP: the choice runs, reads stay on the host."""
    caps = Capabilities(cupy=True, gpu=True, device_name="Test GPU", kvikio=True, kvikio_compat=True, nvcomp=True)
    monkeypatch.setattr(capabilities, "probe", lambda: caps)
    return caps


def test_few_chunks_go_to_the_cpu_many_to_the_gpu():
    rates = DecodeRates()
    small = choose(rates, "zstd", 8, 8 * MiB, 16, to_device=True, batch_bytes=192 * MiB)
    assert small.executor == "cpu" and small.cpu_s < small.gpu_s and not small.measured
    # the same bytes of a codec this machine decodes slowly: the GPU's latency is worth paying
    rates.record("gzip", 64 * MiB, 64 * MiB / (0.1 * GiB) / 16, 16)
    slow = choose(rates, "gzip", 64, 64 * MiB, 16, to_device=True, batch_bytes=192 * MiB)
    assert slow.executor == "gpu" and slow.measured and slow.host_rate == pytest.approx(0.1 * GiB)
    # a chain decoded by its codecs' own decode runs on the host either way: the GPU adds copies
    assert choose(rates, "host", 64, 64 * MiB, 16, to_device=True, batch_bytes=192 * MiB).executor == "cpu"


def test_one_chunk_is_decoded_by_one_thread():
    rates = DecodeRates()
    one = choose(rates, "zstd", 1, 32 * MiB, 16, to_device=False, batch_bytes=192 * MiB)
    many = choose(rates, "zstd", 16, 32 * MiB, 16, to_device=False, batch_bytes=192 * MiB)
    assert one.cpu_s == pytest.approx(16 * (many.cpu_s))


def test_rates_are_a_moving_average_and_ignore_tiny_reads():
    rates = DecodeRates()
    rates.record("zstd", 100, 1e-6, 1)  # too small to say anything
    assert rates.host_rate("zstd") == (choice.SEED_HOST_RATE["zstd"], False)
    rates.record("zstd", GiB, 1.0, 1)
    assert rates.host_rate("zstd") == (GiB, True)
    rates.record("zstd", 2 * GiB, 1.0, 1)
    rate, _ = rates.host_rate("zstd")
    assert GiB < rate < 2 * GiB
    assert rates.report()["zstd"]["reads"] == 2
    rates.record("zstd", 8 * MiB, 1.0, 16)  # 512 KiB a thread in a second: held at a quarter of the seed
    assert rates.host_rate("zstd")[0] > 0.7 * rate + 0.3 * 0.25 * choice.SEED_HOST_RATE["zstd"] - 1
    rates.record("lz4", 2 * MiB, 1.0, 16)  # 128 KiB a thread: too little to say anything
    assert not rates.host_rate("lz4")[1]


def test_tiny_reads_stay_on_the_cpu_at_the_slowest_rate_held():
    """A damaged store's few chunks never reach nvCOMP through the choice (undefined on corrupt
    input): at the lowest rate a measurement can set, 64 KiB decode on the host."""
    rates = DecodeRates()
    for key, seed in choice.SEED_HOST_RATE.items():
        rates.record(key, 64 * MiB, 1e3, 1)
        assert rates.host_rate(key)[0] == pytest.approx(0.25 * seed)
        assert choose(rates, key, 1, 64 << 10, 16, to_device=True, batch_bytes=192 * MiB).executor == "cpu"


def _store(path, codec):
    compressors = {"zstd": zarr.codecs.ZstdCodec(level=1), "gzip": zarr.codecs.GzipCodec(level=1)}[codec]
    a = zarr.create_array(str(path), shape=(8, 512, 512), chunks=(1, 128, 128), dtype="<u2", compressors=compressors)
    a[...] = (np.random.default_rng(3).normal(1000, 40, a.shape)).astype("<u2")
    return a


def test_a_read_shows_its_estimate_and_records_its_rate(tmp_path, fake_gpu):
    from gpu_zarr.engine import get_runtime, native

    arr = _store(tmp_path / "a.zarr", "zstd")
    rt = get_runtime()
    rt.drop("decode-rates")
    with settings.set(small_read=64 * MiB, threads=2):  # 2 MiB a thread: enough to time
        res = zarr_io.prepare(arr).read(slice(0, 8), where="host")
        np.testing.assert_array_equal(res.data, arr[0:8])
    assert res.stats["executor"] == "cpu" and res.stats["estimate_cpu_ms"] < res.stats["estimate_gpu_ms"]
    assert "est." in res.reason and "on the GPU" in res.reason and "seed" in res.reason
    measured = choice.decode_rates(rt).report()
    assert ("zstd" in measured) == native.available()  # the fused executor's reads are timed
    if native.available():
        again = zarr_io.prepare(arr).read((3,), where="host")
        assert again.stats["host_rate_measured"] and "measured" in again.reason
        np.testing.assert_array_equal(again.data, arr[3])


def test_a_slow_host_rate_sends_a_small_read_to_the_gpu(tmp_path, fake_gpu):
    from gpu_zarr.engine import get_runtime

    arr = _store(tmp_path / "g.zarr", "gzip")
    rt = get_runtime()
    rt.drop("decode-rates")
    prep = zarr_io.prepare(arr)
    plane = normalize_selection(arr.shape, (slice(0, 8),))  # 4 MiB of chunks
    with settings.set(small_read=64 * MiB, threads=2):
        assert prep.small_read_bytes(plane) == 4 * MiB
        choice.decode_rates(rt).record("gzip", 4 * MiB, 1.0, 1)  # held at a quarter of the seed: slower than nvCOMP
        assert prep.small_read_bytes(plane) is None
        touched, est = prep.backend_impl.host_choice(plane)
        assert touched == 4 * MiB and est.executor == "gpu" and est.measured
    with settings.set(small_read=0):  # 0 still turns the CPU path off, whatever the estimate
        rt.drop("decode-rates")
        assert prep.small_read_bytes(plane) is None
    rt.drop("decode-rates")
