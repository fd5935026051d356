"""Backend choice, its reasons and errors; config switching; reads on a machine without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from gpu_zarr import capabilities, zarr_io
from gpu_zarr.capabilities import Capabilities
from gpu_zarr.errors import BackendUnavailable, GPUUnavailable, NotAZarrError, ReadCancelled
from stores import write


@pytest.fixture
def no_gpu(monkeypatch):
    caps = Capabilities(notes=["cupy is not installed; for GPU reads: pip install ..."])
    monkeypatch.setattr(capabilities, "probe", lambda: caps)
    return caps


@pytest.fixture
def fake_gpu(monkeypatch):
    """A probe that reports a GPU with kvikio and nvCOMP: exercises the decision logic only."""
    caps = Capabilities(cupy=True, gpu=True, device_name="Test GPU", kvikio=True, kvikio_compat=True,
                        nvcomp=True)
    monkeypatch.setattr(capabilities, "probe", lambda: caps)
    return caps


def test_no_gpu_auto_uses_cpu_and_says_why(tmp_path, no_gpu):
    write(tmp_path / "a.zarr")
    c = zarr_io.choose_backend(tmp_path / "a.zarr")
    assert c.backend == "cpu" and "no usable GPU" in c.reason


@pytest.mark.parametrize("prefer", ["kvikio", "zarr-gpu"])
def test_no_gpu_forced_backend_raises_with_fix(tmp_path, no_gpu, prefer):
    write(tmp_path / "a.zarr")
    with pytest.raises(GPUUnavailable, match=r"pip install"):
        zarr_io.choose_backend(tmp_path / "a.zarr", prefer)


def test_read_zarr_to_gpu_without_gpu(tmp_path, no_gpu):
    write(tmp_path / "a.zarr")
    with pytest.raises(GPUUnavailable, match=r"\[cuda13\].*prefer=.cpu."):  # the hint for this install
        zarr_io.read_zarr_to_gpu(tmp_path / "a.zarr")
    with pytest.raises(BackendUnavailable, match="numpy"):
        zarr_io.read_zarr_to_gpu(tmp_path / "a.zarr", prefer="cpu")


def test_read_zarr_cpu_measures(tmp_path, no_gpu):
    arr, _ = write(tmp_path / "a.zarr", codec="zstd")
    seen = []
    res = zarr_io.read_zarr(tmp_path / "a.zarr", progress=lambda d, t: seen.append((d, t)))
    np.testing.assert_array_equal(res.data, arr[...])
    assert res.backend == "cpu" and res.nbytes == arr.nbytes and res.gib_per_s > 0 and res.gpu_bytes == 0
    assert seen[-1] == (arr.nbytes, arr.nbytes)
    assert zarr_io.last_choice().backend == "cpu"


def test_big_endian_cpu_result_is_native(tmp_path, no_gpu):
    arr, values = write(tmp_path / "a.zarr", fmt=2, dtype=">u2", partial=False)
    res = zarr_io.read_zarr(tmp_path / "a.zarr", prefer="cpu")
    assert res.data.dtype.isnative
    np.testing.assert_array_equal(res.data, values)


@pytest.mark.parametrize("sel", [Ellipsis, (slice(3, 30, 4), slice(None, None, -2), 5), (7,), (slice(5, 5),)])
def test_cpu_reads_report_progress_in_slabs(tmp_path, no_gpu, sel):
    arr, _ = write(tmp_path / "a.zarr", codec="zstd", chunks=(2, 16, 7))
    seen = []
    res = zarr_io.read_selection(tmp_path / "a.zarr", sel, progress=lambda d, t: seen.append((d, t)))
    want = arr[...][sel]
    np.testing.assert_array_equal(res.data, want)
    assert res.data.shape == want.shape
    if want.size and (sel is Ellipsis or not isinstance(sel[0], int)):
        assert len(seen) > 3
        assert [d for d, _ in seen] == sorted(d for d, _ in seen)
        assert seen[-1] == (want.nbytes, want.nbytes)


@pytest.mark.parametrize("sel", [(slice(None, None, -2),), (slice(None, None, -1), 3, slice(8, 1, -3)),
                                 (slice(5, 5, -1),)])
def test_negative_steps_through_zarr_python(tmp_path, no_gpu, sel):
    """An array the engine declines (strings) is read by zarr-python, which takes steps >= 1
    only: a negative step is numpy's step on the bounding box, never a 'corrupt chunk' error."""
    a = zarr.create_array(tmp_path / "s.zarr", shape=(13, 21, 10), chunks=(4, 8, 3), dtype="<U4", zarr_format=2)
    a[...] = np.arange(13 * 21 * 10).astype("<U4").reshape(13, 21, 10)
    want = zarr.open_array(tmp_path / "s.zarr", mode="r")[...][sel]
    got = zarr_io.read_region(tmp_path / "s.zarr", sel, backend="cpu")
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_cancel_during_cpu_read(tmp_path, no_gpu):
    import threading

    write(tmp_path / "a.zarr", chunks=(2, 16, 7))
    ev = threading.Event()
    calls = []

    def progress(done, total):
        calls.append(done)
        if len(calls) == 2:
            ev.set()

    with pytest.raises(ReadCancelled, match="discarded"):
        zarr_io.read_zarr(tmp_path / "a.zarr", progress=progress, cancel=ev)
    assert len(calls) == 2


def test_cancel_before_start(tmp_path, no_gpu):
    import threading

    write(tmp_path / "a.zarr")
    ev = threading.Event()
    ev.set()
    with pytest.raises(ReadCancelled):
        zarr_io.read_zarr(tmp_path / "a.zarr", cancel=ev)


@pytest.mark.parametrize("kw,backend,words", [
    (dict(codec="zstd"), "kvikio", ["fastest path", "zstd zarr v3", "compat"]),
    (dict(codec="raw", fmt=2), "kvikio", ["uncompressed zarr v2"]),
    (dict(codec="zstd", chunks=(4, 8, 7), shards=(8, 16, 14)), "kvikio", ["sharded"]),
])
def test_auto_reasons(tmp_path, fake_gpu, kw, backend, words):
    write(tmp_path / "a.zarr", **kw)
    c = zarr_io.choose_backend(tmp_path / "a.zarr")
    assert c.backend == backend
    for w in words:
        assert w in c.reason


def test_auto_zstd_without_nvcomp_goes_zarr_gpu(tmp_path, monkeypatch):
    caps = Capabilities(cupy=True, gpu=True, kvikio=True, nvcomp=False)
    monkeypatch.setattr(capabilities, "probe", lambda: caps)
    write(tmp_path / "a.zarr", codec="zstd")
    c = zarr_io.choose_backend(tmp_path / "a.zarr")
    assert c.backend == "zarr-gpu" and "nvCOMP is not installed" in c.reason
    with pytest.raises(BackendUnavailable, match="nvCOMP"):
        zarr_io.choose_backend(tmp_path / "a.zarr", "kvikio")


def test_auto_blosc_goes_direct(tmp_path, fake_gpu):
    """Blosc is decoded by the direct engine; blosclz (no GPU decoder) says it decodes on the host."""
    import numcodecs
    from zarr.codecs import BloscCodec

    zarr.create_array(str(tmp_path / "b.zarr"), shape=(4,), chunks=(2,), dtype="u1", compressors=BloscCodec())
    c = zarr_io.choose_backend(tmp_path / "b.zarr")
    assert c.backend == "kvikio" and "Blosc zstd" in c.reason
    zarr.create_array(str(tmp_path / "l.zarr"), shape=(4,), chunks=(2,), dtype="u2", zarr_format=2,
                      compressors=numcodecs.Blosc(cname="blosclz"))
    c = zarr_io.choose_backend(tmp_path / "l.zarr")
    assert c.backend == "kvikio" and "Blosc blosclz (decoded on the host" in c.reason
    zarr.create_array(str(tmp_path / "z.zarr"), shape=(4,), chunks=(2,), dtype="u2",
                      compressors=[BloscCodec(), zarr.codecs.ZstdCodec()])
    c = zarr_io.choose_backend(tmp_path / "z.zarr", "kvikio")  # two compressors: the codecs' own decode
    assert c.backend == "kvikio" and "blosc, zstd by the codecs' own decode" in c.reason


def test_bad_backend_name(tmp_path):
    write(tmp_path / "a.zarr")
    with pytest.raises(ValueError, match="one of auto, kvikio, zarr-gpu, cpu"):
        zarr_io.choose_backend(tmp_path / "a.zarr", "gds")


def test_not_a_zarr(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(NotAZarrError, match="zarr.json"):
        zarr_io.open_array(tmp_path / "plain")
    with pytest.raises(NotAZarrError, match="does not exist"):
        zarr_io.open_array(tmp_path / "missing")
    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    g.create_array("img", shape=(2,), dtype="u1")
    with pytest.raises(NotAZarrError, match="group.*img.*read_omezarr"):
        zarr_io.open_array(tmp_path / "g.zarr")


def test_context_switches_and_restores(fake_gpu, monkeypatch):
    """Config switching logic (no GPU needed to set config): restored on exit, error, nesting."""
    from gpu_zarr import nvcomp_zstd

    monkeypatch.setattr(nvcomp_zstd, "register_nvcomp_zstd", lambda: True)
    before = dict(zarr.config.get("codecs")), zarr.config.get("buffer"), zarr.config.get("ndbuffer")
    with zarr_io.gpu_zarr_context():
        assert zarr.config.get("buffer") == "zarr.buffer.gpu.Buffer"
        assert zarr.config.get("codecs.zstd") == nvcomp_zstd.QUALNAME
        with zarr_io.gpu_zarr_context():
            assert zarr.config.get("ndbuffer") == "zarr.buffer.gpu.NDBuffer"
        assert zarr.config.get("codecs.zstd") == nvcomp_zstd.QUALNAME
    assert (dict(zarr.config.get("codecs")), zarr.config.get("buffer"), zarr.config.get("ndbuffer")) == before
    with pytest.raises(KeyError):
        with zarr_io.gpu_zarr_context():
            raise KeyError("boom")
    assert (dict(zarr.config.get("codecs")), zarr.config.get("buffer"), zarr.config.get("ndbuffer")) == before


def test_context_without_gpu_raises(no_gpu):
    with pytest.raises(GPUUnavailable, match="pip install"):
        with zarr_io.gpu_zarr_context():
            pass


def test_capabilities_report_without_gpu():
    caps = capabilities.probe()
    text = caps.report()
    assert "GPU:" in text and "nvCOMP:" in text and "backends:" in text
    assert caps.backend_status("cpu")[0]
    if not caps.gpu:
        ok, why = caps.backend_status("kvikio")
        assert not ok and ("cupy" in why or "CUDA" in why)


@pytest.mark.parametrize("sel", [(3,), (slice(2, 9), 5), (slice(None, None, -3), slice(1, 20), 4)])
def test_small_reads_decode_on_cpu_threads(tmp_path, fake_gpu, sel):
    """Reads of a few compressed chunks skip nvCOMP's latency: CPU threads, same planning."""
    from gpu_zarr import settings

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", chunks=(4, 8, 7), shards=(8, 16, 14))
    with settings.set(small_read=64 << 20):
        prep = zarr_io.prepare(arr)
        assert prep.backend == "kvikio"
        res = prep.read(sel, where="host")
    np.testing.assert_array_equal(res.data, arr[...][sel])
    assert "small read" in res.reason and "CPU threads" in res.reason and res.stats["small_read"]
    assert res.gpu_bytes == 0


def test_small_read_threshold_counts_touched_chunks(tmp_path, fake_gpu):
    from gpu_zarr import settings
    from gpu_zarr.engine.plan import normalize_selection

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", shape=(40, 32, 28), chunks=(4, 8, 7))
    prep = zarr_io.prepare(arr)
    chunk = 4 * 8 * 7 * arr.dtype.itemsize
    one_plane = normalize_selection(arr.shape, (5,))  # 4 x 4 chunks of the plane
    with settings.set(small_read=16 * chunk):
        assert prep.small_read_bytes(one_plane) == 16 * chunk
    with settings.set(small_read=16 * chunk - 1):
        assert prep.small_read_bytes(one_plane) is None
    with settings.set(small_read=0):
        assert prep.small_read_bytes(one_plane) is None
    raw, _ = write(tmp_path / "r.zarr", fmt=3, codec="raw")
    assert zarr_io.prepare(raw).small_read_bytes(one_plane) is None  # raw: kvikio straight to the GPU


@pytest.mark.parametrize("fmt", [2, 3])
def test_cpu_backend_names_the_corrupt_chunk(tmp_path, no_gpu, fmt):
    from gpu_zarr.errors import CorruptChunkError

    write(tmp_path / "a.zarr", fmt=fmt, codec="zstd")
    key = "0.1.2" if fmt == 2 else "c/0/1/2"
    f = tmp_path / "a.zarr" / key
    f.write_bytes(f.read_bytes()[:-9])
    before = {p: p.read_bytes() for p in (tmp_path / "a.zarr").rglob("*") if p.is_file()}
    with pytest.raises(CorruptChunkError, match=key.replace(".", r"\.")):
        zarr_io.read_zarr(tmp_path / "a.zarr", prefer="cpu")
    assert before == {p: p.read_bytes() for p in (tmp_path / "a.zarr").rglob("*") if p.is_file()}


@pytest.mark.parametrize("cname,shuffle", [("lz4", 1), ("zstd", 2), ("blosclz", 0)])
def test_small_blosc_reads_use_c_blosc_on_cpu_threads(tmp_path, fake_gpu, cname, shuffle):
    import numcodecs

    from gpu_zarr import settings

    a = zarr.create_array(str(tmp_path / "b.zarr"), shape=(12, 40, 30), chunks=(3, 16, 16), dtype="<u2",
                          zarr_format=2, compressors=numcodecs.Blosc(cname=cname, clevel=5, shuffle=shuffle))
    values = (np.random.default_rng(1).normal(1000, 40, (12, 40, 30))).astype("<u2")
    a[...] = values
    with settings.set(small_read=64 << 20):
        res = zarr_io.prepare(str(tmp_path / "b.zarr")).read((slice(2, 9), slice(None, None, 2)), where="host")
    np.testing.assert_array_equal(res.data, values[2:9, ::2])
    assert "small read" in res.reason


def test_small_reads_from_lazy_arrays_take_the_fused_executor(tmp_path, fake_gpu):
    """A viewer's small read (the lazy array asks with cache=True) takes the scheduler's fused
    executor (read, decode, place per chunk on native threads) where the native library is loaded."""
    from gpu_zarr import settings
    from gpu_zarr.engine import EngineOptions, get_runtime, native

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", chunks=(4, 8, 7))
    get_runtime().clear_caches()
    with settings.set(small_read=64 << 20):
        prep = zarr_io.prepare(arr)
        res = prep.read((3,), where="host", options=EngineOptions(cache=True))
        np.testing.assert_array_equal(res.data, arr[3])
        assert ("fused_s" in res.stats) == native.available() and res.stats["cache_hits"] == 0
        # the next plane of the same chunk layer: every chunk from the host chunk cache
        nxt = prep.read((2,), where="host", options=EngineOptions(cache=True))
        np.testing.assert_array_equal(nxt.data, arr[2])
        assert nxt.stats["cache_hits"] == nxt.stats["pieces"] > 0
        # without cache=True (a notebook's one-off read) nothing is looked up or kept
        plain = prep.read((1,), where="host")
        np.testing.assert_array_equal(plain.data, arr[1])
        assert "cache_hits" not in plain.stats


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_small_zstd_reads_name_a_corrupt_chunk(tmp_path, fake_gpu, damage):
    """The chunkwise path leaves zstd's checks to libzstd: a damaged chunk is still named."""
    from gpu_zarr import settings
    from gpu_zarr.errors import CorruptChunkError

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", chunks=(4, 8, 7))
    f = tmp_path / "a.zarr" / "c" / "0" / "1" / "2"
    data = bytearray(f.read_bytes())
    if damage == "truncate":
        data = data[:-9]
    elif damage == "flip":
        data[len(data) // 2] ^= 0xFF
        data[4] ^= 0x40  # and the frame header's descriptor
    else:
        data = bytearray(b"not a zstd frame at all" * 3)
    f.write_bytes(bytes(data))
    with settings.set(small_read=64 << 20), pytest.raises(CorruptChunkError, match="c/0/1/2"):
        zarr_io.prepare(str(tmp_path / "a.zarr")).read((slice(0, 4), slice(8, 16)), where="host")


def test_back_to_back_small_reads_do_not_prefetch(tmp_path, fake_gpu):
    """Planes asked for back to back (a slider dragged, a benchmark) get no CPU prefetch: it
    would take the request's threads. Given a pause, the next plane is prefetched."""
    import time

    from gpu_zarr import settings
    from gpu_zarr.lazy import GpuLazyArray

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", shape=(12, 32, 28), chunks=(1, 8, 7))
    with settings.set(small_read=64 << 20):
        lazy = GpuLazyArray(zarr.open_array(str(tmp_path / "a.zarr"), mode="r"), backend="kvikio")
        planes = [lazy[z] for z in (3, 4, 5)]  # back to back: nothing between the reads
        assert lazy._src.prefetch_key is None
        for z, plane in zip((3, 4, 5), planes):
            np.testing.assert_array_equal(plane, arr[z])
        time.sleep(max(0.05, 3 * lazy._src.last_cost))
        np.testing.assert_array_equal(lazy[6], arr[6])
        assert lazy._src.prefetch_key is not None and lazy._src.prefetch_key[0] == 7
        lazy._src.prefetching.result(timeout=10)
        np.testing.assert_array_equal(lazy[7], arr[7])


# -- the documented read_region warns about nothing (it once raised a DeprecationWarning) --------
@pytest.mark.parametrize("fmt", [3, 2])
def test_read_region_emits_no_warning_in_a_fresh_process(tmp_path, fmt):
    """``gpu_zarr.read_region`` and ``gpu_zarr.zarr_io.read_region``, first touched in a fresh
    interpreter with every warning an error: importing them and a plain read warn about nothing."""
    import subprocess
    import sys
    from pathlib import Path

    write(tmp_path / f"v{fmt}.zarr", fmt=fmt, codec="zstd")
    code = f"""if True:
        import warnings
        import numpy, zarr, numcodecs  # third-party imports before the filter: only gpu_zarr is judged
        warnings.simplefilter("error")
        import gpu_zarr
        from gpu_zarr import zarr_io
        for name in ("v{fmt}.zarr",):
            path = {str(tmp_path)!r} + "/" + name
            ref = zarr.open_array(path, mode="r")[1:5, 2:9]
            for fn in (gpu_zarr.read_region, zarr_io.read_region):
                for backend in ("auto", "cpu"):
                    got = fn(path, (slice(1, 5), slice(2, 9)), backend=backend)
                    got = got.get() if hasattr(got, "get") else got
                    assert numpy.array_equal(got, ref), (name, fn, backend)
                got = fn(zarr.open_array(path, mode="r"), (slice(1, 5), slice(2, 9)))
        print("OK")
    """
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": src})
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("backend", ["auto", "cpu"])
def test_read_region_emits_no_warning(tmp_path, backend):
    import warnings

    import gpu_zarr

    _, vals = write(tmp_path / "a.zarr", codec="zstd")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn in (gpu_zarr.read_region, zarr_io.read_region):
            got = fn(str(tmp_path / "a.zarr"), (slice(0, 3), Ellipsis), backend=backend)
            got = got.get() if hasattr(got, "get") else got
            np.testing.assert_array_equal(got, vals[0:3])


def test_remote_reads_decode_on_the_host_up_to_their_own_bound(tmp_path, fake_gpu):
    """A remote store's reads touching up to ``remote_host_read`` take the host path (decoded
    as the answers arrive, one copy to the GPU); local stores keep ``small_read``; 0 leaves
    remote stores at ``small_read``."""
    pytest.importorskip("obstore")  # (a remote store: the remote extra)
    from gpu_zarr import settings
    from gpu_zarr.bench.remote_server import RangeServer
    from gpu_zarr.engine.plan import normalize_selection
    from gpu_zarr.store import open_array

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", shape=(40, 32, 28), chunks=(4, 8, 7))
    chunk = 4 * 8 * 7 * arr.dtype.itemsize
    whole = normalize_selection(arr.shape, Ellipsis)  # 10 x 4 x 4 chunks
    with RangeServer(tmp_path) as srv:
        remote = zarr_io.prepare(open_array(f"{srv.url}/a.zarr"))
        local = zarr_io.prepare(arr)
        with settings.set(small_read=16 * chunk, remote_host_read=160 * chunk):
            assert remote.small_read_bytes(whole) == 160 * chunk
            assert local.small_read_bytes(whole) is None
        with settings.set(small_read=16 * chunk, remote_host_read=160 * chunk - 1):
            assert remote.small_read_bytes(whole) is None
        with settings.set(small_read=160 * chunk, remote_host_read=0):
            assert remote.small_read_bytes(whole) == local.small_read_bytes(whole) == 160 * chunk
