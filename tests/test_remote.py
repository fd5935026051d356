"""Remote stores (http on 127.0.0.1, S3 through moto's server): every reader equals zarr's read
of the same store on disk; injected failures give exact pixels or a clear error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

pytest.importorskip("obstore")

from gpu_zarr.bench.remote_server import RangeServer  # noqa: E402
from gpu_zarr.engine import read as engine_read  # noqa: E402
from gpu_zarr.engine.runtime import get_runtime  # noqa: E402
from gpu_zarr.engine.sources.remote import byte_cache  # noqa: E402
from gpu_zarr.errors import CorruptChunkError, NotAZarrError  # noqa: E402
from gpu_zarr.location import RemoteError, resolve  # noqa: E402
from gpu_zarr.store import open_array, open_node  # noqa: E402
from s3 import moto_server  # noqa: E402


def _sharded_ome(src: Path, dst: Path) -> None:
    """An OME-Zarr 0.5 image with the pyramid of ``src`` (0.5), written sharded."""
    g = zarr.open_group(src, mode="r")
    out = zarr.open_group(dst, mode="w", zarr_format=3)
    out.attrs.update(dict(g.attrs))
    for key, arr in sorted(g.arrays()):
        ch = tuple(max(1, c // 2) for c in arr.chunks)
        a = out.create_array(key, shape=arr.shape, dtype=arr.dtype, chunks=ch, shards=arr.chunks,
                             compressors=zarr.codecs.ZstdCodec(level=1), fill_value=0,
                             dimension_names=arr.metadata.dimension_names)
        a[...] = arr[...]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    from gpu_zarr.sample import write_sample_omezarr

    root = tmp_path_factory.mktemp("remote")
    write_sample_omezarr(root / "v04.ome.zarr", version="0.4", shape=(2, 8, 96, 96), levels=3,
                         compressor="blosc", chunks=(1, 4, 32, 32))
    write_sample_omezarr(root / "v05.ome.zarr", version="0.5", shape=(2, 8, 96, 96), levels=3,
                         compressor="zstd", chunks=(1, 4, 48, 48))
    _sharded_ome(root / "v05.ome.zarr", root / "v05s.ome.zarr")
    a = zarr.create_array(root / "plain.zarr", shape=(40, 70, 50), chunks=(8, 16, 16), dtype="<u2",
                          compressors=zarr.codecs.ZstdCodec(), fill_value=7)
    a[:24] = np.arange(24 * 70 * 50, dtype="<u2").reshape(24, 70, 50)  # the rest is never written
    s = zarr.create_array(root / "sharded.zarr", shape=(40, 70, 50), chunks=(4, 16, 16), shards=(8, 32, 32),
                          dtype="<u2", compressors=zarr.codecs.ZstdCodec(), fill_value=3)
    s[:24] = np.arange(24 * 70 * 50, dtype="<u2").reshape(24, 70, 50)
    v2 = zarr.create_array(root / "v2.zarr", shape=(30, 64), chunks=(8, 16), dtype="<f4", zarr_format=2,
                           compressors=None, fill_value=0)
    v2[:] = np.random.default_rng(0).random((30, 64), dtype="f4")
    return root


@pytest.fixture
def server(stores):
    byte_cache(get_runtime()).clear()
    with RangeServer(stores, latency=0.002) as srv:
        yield srv
    byte_cache(get_runtime()).clear()


def _disk(stores, rel):
    return zarr.open_array(stores / rel, mode="r")[...]


PLAIN = ["plain.zarr", "sharded.zarr", "v2.zarr", "v04.ome.zarr/0", "v04.ome.zarr/2", "v05.ome.zarr/1",
         "v05s.ome.zarr/0", "v05.ome.zarr/labels/blobs/0"]


def test_location_names_stores():
    assert not resolve("/tmp/x.zarr").is_remote
    assert resolve("file:///tmp/x.zarr").url == "/tmp/x.zarr"
    loc = resolve("https://example.org/data/img.zarr/")
    assert loc.is_remote and loc.url == "https://example.org/data/img.zarr" and loc.name == "img.zarr"
    assert resolve("s3a://bucket/key").scheme == "s3"
    with pytest.raises(ValueError, match="scheme"):
        resolve("ftp://host/x")
    with pytest.raises(ValueError, match="local path"):
        resolve("/tmp/x", {"anon": True})
    # options travel explicitly (Location.join keeps them); nothing is remembered between calls
    loc = resolve("s3://opts-bucket/img.zarr", {"anon": True, "requests": 17, "secret": "s3cr3t"})
    sub = loc.join("0")
    assert sub.storage_options["anon"] and sub.requests() == 17
    assert resolve("s3://opts-bucket/img.zarr/0").storage_options == {}
    assert "s3cr3t" not in repr(loc) and "s3cr3t" not in str(loc)


@pytest.mark.parametrize("rel", PLAIN)
def test_engine_cpu_twin_equals_zarr(server, stores, rel):
    arr = open_array(f"{server.url}/{rel}")
    ref = _disk(stores, rel)
    res = engine_read(arr, device="cpu")
    np.testing.assert_array_equal(res.data, ref)
    assert res.stats["reader"].startswith("remote")
    sel = (slice(1, None, 2),) + (slice(3, 40),) * (ref.ndim - 1)
    np.testing.assert_array_equal(engine_read(arr, sel, device="cpu").data, ref[sel])


@pytest.mark.parametrize("rel", ["plain.zarr", "sharded.zarr", "v04.ome.zarr/0"])
def test_cpu_small_read_path_equals_zarr(server, stores, rel):
    """The CPU's chunkwise path (native decoders, what small reads and viewers use)."""
    from gpu_zarr.engine.ops import CpuOps
    from gpu_zarr.engine.runtime import get_runtime

    ops = CpuOps(get_runtime().pool("cpu-decode", 4), 4, fast=True)
    arr = open_array(f"{server.url}/{rel}")
    ref = _disk(stores, rel)
    np.testing.assert_array_equal(engine_read(arr, device="cpu", ops=ops).data, ref)
    np.testing.assert_array_equal(engine_read(arr, (1,), device="cpu", ops=ops).data, ref[1])


@pytest.mark.parametrize("rel", ["plain.zarr", "sharded.zarr", "v04.ome.zarr/0"])
def test_remote_small_read_places_into_the_box_it_is_given(server, stores, rel):
    """``out=`` on the remote stream path (chunks decoded on arrival straight into it)."""
    from gpu_zarr.engine.ops import CpuOps
    from gpu_zarr.engine.runtime import get_runtime

    ops = CpuOps(get_runtime().pool("cpu-decode", 4), 4, fast=True)
    arr = open_array(f"{server.url}/{rel}")
    ref = _disk(stores, rel)
    byte_cache(get_runtime()).clear()
    out = np.full((1,) + ref.shape[1:], 3, ref.dtype)
    got = engine_read(arr, (1,), device="cpu", ops=ops, out=out).data
    np.testing.assert_array_equal(got, ref[1])
    assert np.shares_memory(got, out)


@pytest.mark.parametrize("client", ["native", "obstore"])
@pytest.mark.parametrize("rel", ["plain.zarr", "sharded.zarr", "v04.ome.zarr/0"])
def test_small_remote_reads_decode_on_arrival_either_way(server, stores, rel, client, monkeypatch):
    """A small read's native decode set is opened while its requests travel (the native
    client's ``on_sent``), or before obstore's requests are made: the same pixels, a plane of
    missing chunks too, and nothing left open."""
    import gpu_zarr.engine.native as native
    import gpu_zarr.engine.sources.http as nh
    from gpu_zarr.engine.ops import CpuOps
    from gpu_zarr.engine.runtime import get_runtime
    from gpu_zarr.engine.sources.remote import source_of

    ops = CpuOps(get_runtime().pool("cpu-decode", 4), 4, fast=True)
    arr = open_array(f"{server.url}/{rel}")
    if client == "obstore":
        pytest.importorskip("obstore")
        src = source_of(arr, get_runtime())
        assert src is not None
        monkeypatch.setattr(src, "http", None)
    ref = _disk(stores, rel)
    for z in (1, ref.shape[0] - 1, 1):  # (the last plane of plain.zarr and sharded.zarr: never written)
        sel = (z,) + (slice(None),) * (ref.ndim - 3) + (slice(0, 32), slice(5, 37))  # a tile: 2-4 chunks
        byte_cache(get_runtime()).clear()
        get_runtime().clear_caches()
        res = engine_read(arr, sel, device="cpu", ops=ops)
        np.testing.assert_array_equal(res.data, ref[sel])
        written = z < 24 or rel.startswith("v04")
        on_arrival = native.available()  # (GPU_ZARR_NATIVE=0: decoded when all are in, in Python)
        assert (res.stats.get("decoded_on_arrival", 0) > 0) == (written and on_arrival), res.stats
        # the native HTTP client hands whole chunks to the set itself, every one (the set is
        # open before the first answer is taken); a shard's inner chunks only once its index,
        # asked for beside it, has arrived and published their parts (a race: either way is
        # right); obstore's answers: never
        handed = res.stats.get("handed_natively", 0)
        if "sharded" in rel:
            assert 0 <= handed <= res.stats.get("decoded_on_arrival", 0), res.stats
            assert client == "native" or handed == 0, res.stats
        elif client == "obstore" or not nh.available():
            assert handed == 0, res.stats
        elif written and on_arrival:
            assert handed == res.stats["decoded_on_arrival"] == res.stats["requests"] > 0, res.stats


def test_many_requests_in_flight(stores):
    byte_cache(get_runtime()).clear()
    with RangeServer(stores, latency=0.05) as srv:
        arr = open_array(f"{srv.url}/plain.zarr")
        engine_read(arr, device="cpu")
        # 3 * 5 * 4 = 60 chunks, all requested at once: the server saw them together
        assert srv.max_in_flight >= 32


def test_missing_chunks_are_the_fill_value(server, stores):
    arr = open_array(f"{server.url}/plain.zarr")
    out = engine_read(arr, (slice(30, 40),), device="cpu").data
    assert (out == 7).all()
    out = engine_read(open_array(f"{server.url}/sharded.zarr"), (slice(30, 40),), device="cpu").data
    assert (out == 3).all()


def test_read_zarr_omezarr_dask(server, stores):
    from gpu_zarr.dask_array import to_dask
    from gpu_zarr.omezarr import open_ome, read_omezarr
    from gpu_zarr.zarr_io import read_zarr

    for img in ("v04.ome.zarr", "v05.ome.zarr", "v05s.ome.zarr"):
        url = f"{server.url}/{img}"
        arr, res = read_omezarr(url, level=1)
        np.testing.assert_array_equal(np.asarray(arr[...]), _disk(stores, f"{img}/1"))
        assert len(res) == 4
        assert len(open_ome(url).levels) == 3
        r = read_zarr(f"{url}/0", prefer="cpu", progress=False)
        np.testing.assert_array_equal(r.data, _disk(stores, f"{img}/0"))
        d = to_dask(url, level=2)  # GPU blocks where a GPU is usable
        got = d.compute()
        np.testing.assert_array_equal(got.get() if hasattr(got, "get") else got, _disk(stores, f"{img}/2"))


def test_lazy_array_reads_only_the_plane(server, stores):
    from gpu_zarr.lazy import GpuLazyArray

    arr = open_array(f"{server.url}/sharded.zarr")
    lazy = GpuLazyArray(arr, backend="cpu")
    server.reset_counters()
    np.testing.assert_array_equal(lazy[5], _disk(stores, "sharded.zarr")[5])
    first = server.bytes_sent
    total = sum(f.stat().st_size for f in (stores / "sharded.zarr").rglob("*") if f.is_file())
    assert 0 < first < total / 2


def test_engine_plane_is_cached(server, stores):
    arr = open_array(f"{server.url}/plain.zarr")
    engine_read(arr, (3,), device="cpu")
    server.reset_counters()
    np.testing.assert_array_equal(engine_read(arr, (3,), device="cpu").data, _disk(stores, "plain.zarr")[3])
    assert server.requests == 0  # the chunks fetched for the first read were kept


def test_napari_reader_accepts_urls(server, stores):
    pytest.importorskip("napari")
    from gpu_zarr.napari_plugin._reader import napari_get_reader

    reader = napari_get_reader(f"{server.url}/v05s.ome.zarr")
    assert reader is not None
    layers = reader(f"{server.url}/v05s.ome.zarr")
    data = layers[0][0]
    level0 = data[0] if isinstance(data, list) else data
    np.testing.assert_array_equal(np.asarray(level0[3]), _disk(stores, "v05s.ome.zarr/0")[0, 3])
    assert napari_get_reader(f"{server.url}/no-such.zarr") is None


def test_cli_reads_a_url(server, stores):
    out = subprocess.run([sys.executable, "-m", "gpu_zarr.cli", "read", f"{server.url}/v05.ome.zarr",
                          "--backend", "cpu", "--repeat", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "does not exist" not in out.stderr and "(2, 8, 96, 96)" in out.stdout


@pytest.mark.parametrize("fault", ["fail_503", "fail_reset", "fail_truncate"])
def test_injected_failures_give_exact_pixels(stores, fault):
    byte_cache(get_runtime()).clear()
    with RangeServer(stores, latency=0.001, seed=3, **{fault: 0.05}) as srv:
        for rel in ("plain.zarr", "sharded.zarr", "v04.ome.zarr/0"):
            ref = _disk(stores, rel)
            for _ in range(2):
                byte_cache(get_runtime()).clear()
                arr = open_array(f"{srv.url}/{rel}")
                np.testing.assert_array_equal(engine_read(arr, device="cpu").data, ref)
                np.testing.assert_array_equal(np.asarray(arr[...]), ref)


def test_persistent_truncation_is_an_error_not_data(stores):
    byte_cache(get_runtime()).clear()
    arr = None
    with RangeServer(stores) as srv:
        arr = open_array(f"{srv.url}/sharded.zarr")
        srv.fail_truncate = 1.0
        with pytest.raises(RemoteError, match="sharded.zarr"):
            engine_read(arr, device="cpu")


def test_errors_name_the_url(stores):
    byte_cache(get_runtime()).clear()
    with RangeServer(stores, forbidden=("plain.zarr",)) as srv:
        with pytest.raises(RemoteError, match=r"plain\.zarr.*refused access"):
            open_node(f"{srv.url}/plain.zarr")
        with pytest.raises(NotAZarrError, match=r"nothing\.zarr.*404"):
            open_node(f"{srv.url}/nothing.zarr")
        arr = open_array(f"{srv.url}/sharded.zarr")
        url = srv.url
    # the server is gone: connection refused
    with pytest.raises(RemoteError, match=r"127\.0\.0\.1.*(reached|failed)"):
        open_node(f"{url}/v2.zarr", {"max_retries": 1, "retry_timeout": 2})
    with pytest.raises(RemoteError, match="sharded.zarr"):
        engine_read(arr, device="cpu")


def test_corrupt_shard_index_is_named(stores, tmp_path):
    import shutil

    shutil.copytree(stores / "sharded.zarr", tmp_path / "bad.zarr")
    shard = tmp_path / "bad.zarr" / "c" / "0" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-3] ^= 0xFF  # the index checksum
    shard.write_bytes(bytes(raw))
    byte_cache(get_runtime()).clear()
    with RangeServer(tmp_path) as srv:
        with pytest.raises(CorruptChunkError, match="bad.zarr/c/0/0/0"):
            engine_read(open_array(f"{srv.url}/bad.zarr"), device="cpu")


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_uncompressed_chunk_of_the_wrong_size_over_http_is_named_never_data(tmp_path, zarr_format):
    """An uncompressed chunk's answer must be its decoded size: one cut short (or grown) is a
    CorruptChunkError naming it, for a plane (decoded as answers arrive) and a whole read."""
    a = zarr.create_array(tmp_path / "u.zarr", shape=(4, 32, 32), chunks=(1, 32, 32), dtype="<u2",
                          zarr_format=zarr_format, compressors=None, fill_value=0)
    a[...] = np.arange(4 * 32 * 32, dtype="<u2").reshape(4, 32, 32)
    chunk = tmp_path / "u.zarr" / ("2.0.0" if zarr_format == 2 else "c/2/0/0")
    for cut in (chunk.read_bytes()[:-10], chunk.read_bytes() + b"\0" * 6):
        chunk.write_bytes(cut)
        byte_cache(get_runtime()).clear()
        with RangeServer(tmp_path) as srv:
            arr = open_array(f"{srv.url}/u.zarr")
            for sel in ((2,), Ellipsis):
                with pytest.raises(CorruptChunkError, match=r"u\.zarr/(2\.0\.0|c/2/0/0).*uncompressed"):
                    engine_read(arr, sel, device="cpu")
                byte_cache(get_runtime()).clear()
            assert np.array_equal(engine_read(arr, (1,), device="cpu").data, a[1])  # the others read right


@pytest.mark.parametrize("cname", ["lz4", "blosclz"])  # blosclz: left to c-blosc, parsed first
@pytest.mark.parametrize("damage", ["flip-table", "truncate", "garbage"])
def test_corrupt_blosc_chunk_over_http_is_named_never_data(tmp_path, cname, damage):
    """The remote host path decodes answers as they arrive: a damaged Blosc chunk (a block-table
    entry, a cut, same-length garbage) is a CorruptChunkError naming its URL, never pixels."""
    import numcodecs

    a = zarr.create_array(tmp_path / "b.zarr", shape=(4, 64, 64), chunks=(1, 64, 64), dtype="<u2", zarr_format=2,
                          compressors=numcodecs.Blosc(cname=cname, clevel=5, shuffle=1, blocksize=2048))
    a[...] = np.arange(4 * 64 * 64, dtype="<u2").reshape(4, 64, 64) % 251
    chunk = tmp_path / "b.zarr" / "2.0.0"
    raw = bytearray(chunk.read_bytes())
    if damage == "flip-table":
        raw[16 + 2] ^= 0x40  # the second byte of the first block's start offset
    elif damage == "truncate":
        raw = raw[: len(raw) * 2 // 3]
    else:
        raw[16:] = np.random.default_rng(3).integers(0, 256, len(raw) - 16, dtype=np.uint8).tobytes()
    chunk.write_bytes(bytes(raw))
    byte_cache(get_runtime()).clear()
    with RangeServer(tmp_path) as srv:
        arr = open_array(f"{srv.url}/b.zarr")
        for sel in ((2,), Ellipsis):
            with pytest.raises(CorruptChunkError, match=r"b\.zarr/2\.0\.0"):
                engine_read(arr, sel, device="cpu")
            byte_cache(get_runtime()).clear()


@pytest.mark.parametrize("cname", ["lz4", "blosclz"])
def test_plane_is_decoded_as_its_answers_arrive(tmp_path, cname):
    """A viewer's few chunks: each decoded and placed on a native thread as its answer arrives
    (Blosc's blosclz, which the native library leaves to numcodecs, once all are in); chunks
    the plane cuts go to the chunk cache, and reading them again sends no request. The decode
    set is opened while the requests travel, so the native HTTP client hands all four to it
    itself (no Python between an answer and its decode)."""
    import numcodecs

    import gpu_zarr.engine.sources.http as nh
    from gpu_zarr.engine import EngineOptions, native
    from gpu_zarr.engine.runtime import get_runtime


    ref = (np.arange(4 * 96 * 96, dtype="<u2").reshape(4, 96, 96) * 7) % 1009
    a = zarr.create_array(tmp_path / "b.zarr", shape=ref.shape, chunks=(1, 64, 64), dtype="<u2", zarr_format=2,
                          compressors=numcodecs.Blosc(cname=cname, clevel=5, shuffle=1))
    a[...] = ref
    byte_cache(get_runtime()).clear()
    get_runtime().clear_caches()
    sel = (2, slice(10, 90), slice(5, 70))
    with RangeServer(tmp_path) as srv:
        arr = open_array(f"{srv.url}/b.zarr")
        res = engine_read(arr, sel, device="cpu", options=EngineOptions(cache=True))
        np.testing.assert_array_equal(res.data, ref[sel])
        if native.available():
            assert res.stats["decoded_on_arrival"] == (4 if cname == "lz4" else 0)
            assert res.stats["handed_natively"] == (4 if nh.available() else 0), res.stats
        srv.reset_counters()
        again = engine_read(arr, sel, device="cpu", options=EngineOptions(cache=True))
        np.testing.assert_array_equal(again.data, ref[sel])
        assert srv.requests == 0 and again.stats["cache_hits"] == 4
        np.testing.assert_array_equal(engine_read(arr, (3,), device="cpu").data, ref[3])


def test_a_failed_answer_mid_plane_is_an_error_and_the_next_read_is_exact(tmp_path):
    """One chunk of a plane refused (403) while its neighbours arrive and go to the native
    decoders: a RemoteError naming that chunk, the decoders stopped cleanly, and the next plane
    read exactly."""
    import numcodecs

    ref = (np.arange(4 * 96 * 96, dtype="<u2").reshape(4, 96, 96) * 3) % 2003
    a = zarr.create_array(tmp_path / "f.zarr", shape=ref.shape, chunks=(1, 48, 48), dtype="<u2", zarr_format=2,
                          compressors=numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1))
    a[...] = ref
    byte_cache(get_runtime()).clear()
    with RangeServer(tmp_path, latency=0.01, forbidden=("f.zarr/2.1.0",)) as srv:
        arr = open_array(f"{srv.url}/f.zarr")
        for _ in range(3):
            with pytest.raises(RemoteError, match=r"f\.zarr/2\.1\.0"):
                engine_read(arr, (2,), device="cpu")
        np.testing.assert_array_equal(engine_read(arr, (1,), device="cpu").data, ref[1])
        np.testing.assert_array_equal(engine_read(arr, (2, slice(0, 48)), device="cpu").data, ref[2, :48])


def test_a_server_without_byte_ranges_reads_exactly(stores, caplog):
    """A server that ignores Range (python's http.server, some static hosts: 200 and the whole
    object) still gives exact pixels: shards are fetched whole once and cut, and the log says so."""
    byte_cache(get_runtime()).clear()
    with RangeServer(stores, ranges=False) as srv, caplog.at_level("WARNING", logger="gpu_zarr.remote"):
        arr = open_array(f"{srv.url}/sharded.zarr")
        want = _disk(stores, "sharded.zarr")
        for sel in ((5,), (slice(3, 20), slice(10, 40), 7), Ellipsis):
            byte_cache(get_runtime()).clear()
            np.testing.assert_array_equal(engine_read(arr, sel, device="cpu").data, want[sel])
        assert not any("range" in e["headers"] and e["status"] == 206 for e in srv.log)
    assert "answers no byte ranges" in caplog.text


def test_s3_through_moto(moto_s3, stores, monkeypatch):
    endpoint = moto_s3
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(k, v)
    byte_cache(get_runtime()).clear()
    from gpu_zarr.omezarr import read_omezarr

    arr, _ = read_omezarr("s3://pub/data/v05s.ome.zarr", level=0)
    np.testing.assert_array_equal(engine_read(arr, device="cpu").data, _disk(stores, "v05s.ome.zarr/0"))
    arr, _ = read_omezarr("s3://pub/data/v04.ome.zarr", level=1)
    np.testing.assert_array_equal(np.asarray(arr[...]), _disk(stores, "v04.ome.zarr/1"))
    # the same through storage_options, with the environment's credentials gone
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k)
    opts = {"key": "testing", "secret": "testing", "endpoint_url": endpoint}
    arr = open_array("s3://pub/data/plain.zarr", opts)
    np.testing.assert_array_equal(engine_read(arr, device="cpu").data, _disk(stores, "plain.zarr"))
    with pytest.raises((NotAZarrError, RemoteError), match="s3://pub/data/none.zarr"):
        open_node("s3://pub/data/none.zarr", opts)


def test_missing_obstore_names_the_install(monkeypatch):
    import sys as _sys

    from gpu_zarr.location import RemoteUnavailable

    monkeypatch.setitem(_sys.modules, "obstore.store", None)  # as if obstore were not installed
    with pytest.raises(RemoteUnavailable, match=r"pip install .*\[remote\]"):
        open_node("http://127.0.0.1:9/none.zarr")


def test_nothing_is_written(server, stores):
    import urllib.error
    import urllib.request

    from gpu_zarr.dask_array import to_dask
    from gpu_zarr.lazy import GpuLazyArray
    from gpu_zarr.omezarr import open_ome

    # the server records every method it receives (a write would be seen, not silently refused)
    req = urllib.request.Request(f"{server.url}/plain.zarr/zarr.json", data=b"{}", method="PUT")
    with pytest.raises(urllib.error.HTTPError, match="405"):
        urllib.request.urlopen(req, timeout=10)
    assert "PUT" in server.methods()
    server.reset_counters()

    before = {str(f): f.stat().st_mtime_ns for f in stores.rglob("*")}
    engine_read(open_array(f"{server.url}/sharded.zarr"), device="cpu")
    np.asarray(open_array(f"{server.url}/v2.zarr")[...])
    img = open_ome(f"{server.url}/v04.ome.zarr")
    GpuLazyArray(img.open_level(0), backend="cpu")[1]
    try:
        import dask  # noqa: F401  (CI installs it; a GPU machine may not have it)
    except ImportError:
        pass
    else:
        to_dask(f"{server.url}/v05s.ome.zarr", level=1, backend="cpu").compute(scheduler="threads")
    assert server.log and server.methods() <= {"GET", "HEAD"}, server.methods()
    assert {str(f): f.stat().st_mtime_ns for f in stores.rglob("*")} == before
    assert json.loads((stores / "sharded.zarr" / "zarr.json").read_text())["node_type"] == "array"


@pytest.mark.gpu
@pytest.mark.parametrize("rel", ["plain.zarr", "sharded.zarr", "v04.ome.zarr/0", "v05s.ome.zarr/0"])
def test_gpu_direct_engine_reads_remote(server, stores, rel):
    import cupy

    from gpu_zarr.zarr_io import read_zarr

    res = read_zarr(f"{server.url}/{rel}", prefer="kvikio", progress=False)
    assert isinstance(res.data, cupy.ndarray) and res.backend == "kvikio"
    np.testing.assert_array_equal(cupy.asnumpy(res.data), _disk(stores, rel))


@pytest.mark.gpu
def test_gpu_small_remote_reads_copy_from_reused_page_locked_staging(server, stores, monkeypatch):
    """A plane (a small read) is placed in page-locked staging and copied to the GPU (its GPU
    array and the copy set up while the requests travel); the staging goes back to the
    runtime's pool and the next plane reuses it, while the first plane's device array keeps
    its pixels. A stepped selection is copied out of the staging first, then uploaded."""
    import cupy

    import gpu_zarr.backends as backends
    from gpu_zarr import zarr_io
    from gpu_zarr.engine.runtime import get_runtime

    ran: list[bool] = []
    real_run = backends._Upload.run
    monkeypatch.setattr(backends._Upload, "run",
                        lambda self, data: ran.append(np.shares_memory(data, self.host)) or real_run(self, data))
    prep = zarr_io.prepare(open_array(f"{server.url}/plain.zarr"), prefer="kvikio")
    ref = _disk(stores, "plain.zarr")
    rt = get_runtime()
    planes, held = [], set()
    for z in range(4):
        res = prep.read((z,))
        assert isinstance(res.data, cupy.ndarray) and res.stats["small_read"], res.reason
        planes.append(res.data)
        held.add(rt.pinned.held_bytes)
    assert len(held) == 1  # the staging is reused, not a new buffer per plane
    assert ran == [True] * 4  # every plane's upload was set up while its requests travelled
    for z, p in enumerate(planes):
        np.testing.assert_array_equal(cupy.asnumpy(p), ref[z])
    stepped = prep.read((slice(None, None, 2), 3))  # a copy out of the staging, then uploaded
    np.testing.assert_array_equal(cupy.asnumpy(stepped.data), ref[::2, 3])
    assert ran == [True] * 4


@pytest.mark.parametrize("rel", ["plain.zarr", "sharded.zarr"])
def test_on_sent_runs_once_while_a_remote_reads_requests_travel(tmp_path, stores, rel):
    """``EngineOptions.on_sent`` runs once per remote read on the host path, after the
    requests left and before any answer is placed; not for local reads. An error there stops
    the read (no result), and the next read is exact."""
    from gpu_zarr.engine import EngineOptions

    ref = _disk(stores, rel)
    with RangeServer(stores, latency=0.02) as srv:
        arr = open_array(f"{srv.url}/{rel}")
        seen: list[int] = []
        sel = (2, slice(0, 40), slice(0, 40))
        byte_cache(get_runtime()).clear()
        res = engine_read(arr, sel, device="cpu",
                          options=EngineOptions(on_sent=lambda: seen.append(len(srv.log))))
        np.testing.assert_array_equal(res.data, ref[sel])
        assert len(seen) == 1 and seen[0] >= 1  # once, with requests already at the server
        assert res.data.shape == ref[sel].shape

        def boom():
            raise RuntimeError("setup failed")
        byte_cache(get_runtime()).clear()
        with pytest.raises(RuntimeError, match="setup failed"):
            engine_read(arr, sel, device="cpu", options=EngineOptions(on_sent=boom))
        byte_cache(get_runtime()).clear()
        np.testing.assert_array_equal(engine_read(arr, sel, device="cpu").data, ref[sel])
    local: list[int] = []
    engine_read(open_array(stores / rel), sel, device="cpu", options=EngineOptions(on_sent=lambda: local.append(1)))
    assert local == []


def test_bench_remote_runs(tmp_path):
    from gpu_zarr.bench.remote import run, table

    rows = run(tmp_path, size="small", latencies=[0], repeat=1, planes=1, readers=["ours", "zarr"], log=lambda s: None)
    assert {r["reader"] for r in rows} == {"ours", "zarr"} and len(rows) == 6
    assert all(r["requests"] > 0 and r["moved_mib"] > 0 for r in rows)
    assert "| ours |" in table(rows)


def test_bench_remote_warms_its_server_with_every_object(tmp_path):
    """Before anything is timed a plain client GETs every object of the volume once (a fresh
    server process's first answers are slower, and they fell on whichever reader ran first)."""
    from gpu_zarr.bench.remote import _volumes, _warm, _write
    from gpu_zarr.bench.remote_server import ServerProcess

    spec = next(iter(_volumes("tiny").values()))
    _write(tmp_path / "v", spec)
    files = [p for p in (tmp_path / "v").rglob("*") if p.is_file()]
    with ServerProcess(tmp_path) as srv:
        srv.reset_counters()
        _warm(srv.url, tmp_path, "v")
        assert srv.requests == len(files) and srv.bytes_sent == sum(p.stat().st_size for p in files)


@pytest.mark.parametrize("entry", [["-m", "gpu_zarr.bench"], ["-m", "gpu_zarr.cli", "bench"]])
def test_bench_remote_cli_entries(tmp_path, entry):
    """``python -m gpu_zarr.bench --remote`` and ``gpu-zarr bench --remote`` run (argv from sys.argv)."""
    out = subprocess.run([sys.executable, *entry, "--remote", "--size", "tiny", "--latency", "0",
                          "--readers", "ours", "--repeat", "1", "--planes", "1", "--workdir", str(tmp_path / "w"),
                          "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "| ours |" in out.stdout
    rows = json.loads((tmp_path / "o" / "remote.json").read_text())
    assert len(rows) == 3 and all(r["reader"] == "ours" and r["requests"] > 0 for r in rows)


# -- failures: 429, a stalled server, DNS -------------------------------------------------------
def test_429_is_retried_with_backoff_and_gives_exact_pixels(stores):
    import time

    byte_cache(get_runtime()).clear()
    ours: list[tuple[float, float]] = []  # when our open and engine read ran (then zarr's own read)
    with RangeServer(stores, fail_429=0.25, seed=5) as srv:
        for rel in ("plain.zarr", "sharded.zarr"):
            byte_cache(get_runtime()).clear()
            t0 = time.monotonic()  # (the server's clock)
            arr = open_array(f"{srv.url}/{rel}")
            np.testing.assert_array_equal(engine_read(arr, device="cpu").data, _disk(stores, rel))
            ours.append((t0, time.monotonic()))
            np.testing.assert_array_equal(np.asarray(arr[...]), _disk(stores, rel))
        # the backoff is judged on our requests: zarr-python's own read (obstore's retries) may ask
        # for one shard from two places at once, and one's retry then follows the other's 429
        log = [e for e in srv.log if any(t0 <= e["time"] <= t1 for t0, t1 in ours)]
    refused = [e for e in log if e["status"] == 429]
    assert len(refused) >= 5, "the server refused too few requests for the test to mean anything"
    # each refused request was sent again, and not at once: after a backoff (but the v2 documents
    # of a node whose zarr.json came are not needed: zarr-python reads the v3 node only)
    v3 = {x["path"].rsplit("/", 1)[0] for x in log if x["path"].endswith("/zarr.json") and x["status"] == 200}
    refused = [e for e in refused if not (e["path"].rsplit("/", 1)[0] in v3 and e["path"].rsplit("/", 1)[1] in
                                          (".zarray", ".zattrs", ".zgroup", ".zmetadata"))]
    gaps = []
    for e in refused:
        again = [x["time"] - e["time"] for x in log if x["path"] == e["path"]
                 and x["headers"].get("range") == e["headers"].get("range") and x["time"] > e["time"]]
        assert again, f"{e['path']} was refused (429) and never asked again"
        gaps.append(min(again))
    assert min(gaps) >= 0.03, f"retried after {min(gaps) * 1e3:.1f} ms: no backoff"


def test_a_stalled_server_times_out_with_the_url(stores):
    import time

    opts = {"timeout": 1, "connect_timeout": 1, "max_retries": 1, "retry_timeout": 3}
    byte_cache(get_runtime()).clear()
    with RangeServer(stores, stall=60) as srv:
        t = time.monotonic()
        with pytest.raises(RemoteError, match=r"127\.0\.0\.1:\d+/plain\.zarr.*did not answer in time"):
            open_node(f"{srv.url}/plain.zarr", opts)
        assert time.monotonic() - t < 30
    with RangeServer(stores) as srv:
        arr = open_array(f"{srv.url}/plain.zarr", opts)
        srv.stall = 60  # the metadata came; the chunks do not
        t = time.monotonic()
        with pytest.raises(RemoteError, match=r"127\.0\.0\.1:\d+/plain\.zarr/c/.*did not answer in time"):
            engine_read(arr, device="cpu")
        assert time.monotonic() - t < 30


def test_timeouts_given_as_timedeltas_read_exact_pixels(stores):
    """obstore's own options take timeouts as timedeltas: ours (the native client's, the source's
    deadline) take them too."""
    from datetime import timedelta

    opts = {"timeout": timedelta(seconds=30), "connect_timeout": timedelta(seconds=5)}
    byte_cache(get_runtime()).clear()
    with RangeServer(stores) as srv:
        for rel in ("plain.zarr", "sharded.zarr"):
            arr = open_array(f"{srv.url}/{rel}", opts)
            np.testing.assert_array_equal(engine_read(arr, device="cpu").data, _disk(stores, rel))


def test_dns_failure_names_the_url():
    import time

    t = time.monotonic()
    # the resolver says "no such host" (could not be resolved), or, where it cannot be asked in
    # time, the request times out: either way the URL is named and what to check is said
    with pytest.raises(RemoteError, match=r"http://gpu-zarr-test\.invalid/img\.zarr could not be reached: "
                                          r"(the host name .* could not be resolved|the server did not answer)"):
        open_node("http://gpu-zarr-test.invalid/img.zarr", {"max_retries": 1, "retry_timeout": 5,
                                                            "connect_timeout": 5})
    assert time.monotonic() - t < 60


# -- requests in flight -------------------------------------------------------------------------------
def test_default_requests_in_flight_is_at_least_64(tmp_path, monkeypatch):
    from gpu_zarr.engine.sources.remote import RemoteSource, RemoteState, source_of

    monkeypatch.delenv("GPU_ZARR_REMOTE_REQUESTS", raising=False)
    assert resolve("http://127.0.0.1:9/a.zarr").requests() >= 64
    assert RemoteSource(None, "", "http://127.0.0.1:9/a.zarr", state=RemoteState()).requests >= 64
    a = zarr.create_array(tmp_path / "many.zarr", shape=(16, 64, 64), chunks=(1, 16, 16), dtype="<u2",
                          compressors=None, fill_value=0)  # 256 chunks
    a[:] = np.arange(16 * 64 * 64, dtype="<u2").reshape(16, 64, 64)
    byte_cache(get_runtime()).clear()
    with RangeServer(tmp_path, latency=0.4) as srv:
        arr = open_array(f"{srv.url}/many.zarr")
        src = source_of(arr, get_runtime())
        assert src is not None and src.requests >= 64
        srv.reset_counters()
        np.testing.assert_array_equal(engine_read(arr, device="cpu").data, a[...])
        assert srv.max_in_flight >= 64, f"only {srv.max_in_flight} requests were outstanding at once"


# -- the CLI's info -------------------------------------------------------------------------------------
def test_cli_info_of_a_url(server):
    out = subprocess.run([sys.executable, "-m", "gpu_zarr.cli", "info", f"{server.url}/v05s.ome.zarr"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"{server.url}/v05s.ome.zarr" in out.stdout and "OME-NGFF 0.5" in out.stdout
    assert "level 2" in out.stdout and "shards" in out.stdout and "backend:" in out.stdout
    out = subprocess.run([sys.executable, "-m", "gpu_zarr.cli", "info", f"{server.url}/sharded.zarr"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "(40, 70, 50)" in out.stdout, out.stderr
    out = subprocess.run([sys.executable, "-m", "gpu_zarr.cli", "info", f"{server.url}/none.zarr"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "none.zarr" in out.stderr and "Traceback" not in out.stderr


# -- S3 (moto) behind a loopback proxy: latency, failures, anonymous access, no writes --------------------
@pytest.fixture(scope="module")
def moto_s3(stores):
    with moto_server() as (endpoint, s3):
        s3.create_bucket(Bucket="pub")
        s3.put_bucket_policy(Bucket="pub", Policy=json.dumps({  # a public bucket, as IDR's or the Cell Painting Gallery's
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject", "s3:ListBucket"],
                           "Resource": ["arn:aws:s3:::pub", "arn:aws:s3:::pub/*"]}]}))
        for rel in ("v05s.ome.zarr", "v04.ome.zarr", "plain.zarr"):
            for f in (stores / rel).rglob("*"):
                if f.is_file():
                    s3.upload_file(str(f), "pub", f"data/{f.relative_to(stores)}")
        yield endpoint


def _no_aws_env(monkeypatch):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL",
              "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(k, raising=False)


def test_s3_behind_a_proxy_with_latency_and_failures(moto_s3, stores, monkeypatch):
    from gpu_zarr.bench.remote_server import ProxyServer
    from gpu_zarr.omezarr import read_omezarr

    _no_aws_env(monkeypatch)
    with ProxyServer(moto_s3, latency=0.01, fail_503=0.05, fail_reset=0.03, fail_truncate=0.03, seed=11) as px:
        opts = {"endpoint_url": px.url, "key": "testing", "secret": "testing"}
        for rel, level in (("v05s.ome.zarr", 0), ("v04.ome.zarr", 1)):
            byte_cache(get_runtime()).clear()
            arr, _ = read_omezarr(f"s3://pub/data/{rel}", level=level, storage_options=opts)
            ref = _disk(stores, f"{rel}/{level}")
            np.testing.assert_array_equal(engine_read(arr, device="cpu").data, ref)
            np.testing.assert_array_equal(np.asarray(arr[...]), ref)
        statuses = [e["status"] for e in px.log]
        assert statuses.count(503) >= 1 and None in statuses, "no failure was injected"
        assert px.methods() <= {"GET", "HEAD"}, px.methods()  # no PUT / POST / DELETE reached S3
        # signed with the storage_options' keys (forwarded unchanged by the proxy)
        assert all(e["headers"].get("authorization", "").startswith("AWS4-HMAC-SHA256") for e in px.log)


def test_s3_anonymous_access(moto_s3, stores, monkeypatch):
    from gpu_zarr.bench.remote_server import ProxyServer
    from gpu_zarr.omezarr import read_omezarr

    _no_aws_env(monkeypatch)
    with ProxyServer(moto_s3) as px:
        # no credentials anywhere: unsigned requests, the default for public buckets
        monkeypatch.setenv("AWS_ENDPOINT_URL", px.url)
        byte_cache(get_runtime()).clear()
        arr, _ = read_omezarr("s3://pub/data/v05s.ome.zarr", level=1)
        np.testing.assert_array_equal(engine_read(arr, device="cpu").data, _disk(stores, "v05s.ome.zarr/1"))
        assert px.log and not any("authorization" in e["headers"] for e in px.log)
        # credentials in the environment, but anon=True: still unsigned (a public bucket, a user's keys)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        px.reset_counters()
        byte_cache(get_runtime()).clear()
        arr = open_array("s3://pub/data/plain.zarr", {"anon": True})
        np.testing.assert_array_equal(engine_read(arr, device="cpu").data, _disk(stores, "plain.zarr"))
        assert px.log and not any("authorization" in e["headers"] for e in px.log)
        # ... and without anon those credentials sign the requests (the check above can fail)
        px.reset_counters()
        byte_cache(get_runtime()).clear()
        np.asarray(open_array("s3://pub/data/plain.zarr")[0])
        assert px.log and all("authorization" in e["headers"] for e in px.log)
        # the CLI's --anon
        out = subprocess.run([sys.executable, "-m", "gpu_zarr.cli", "info", "s3://pub/data/v04.ome.zarr", "--anon"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "OME-NGFF 0.4" in out.stdout, out.stderr


@pytest.mark.parametrize("pinned_mib", [1024, 1])
def test_big_reads_land_in_the_arena_or_in_their_own_buffers(stores, monkeypatch, pinned_mib):
    """A read of more than ARENA_PIECES pieces: its answers land in one reused block (decoded where
    they landed) or, past the arena's bound, in buffers of their own; pixels exact either way, and
    nothing of it goes to the byte cache (the block is reused by the next read)."""
    from gpu_zarr import settings
    from gpu_zarr.engine.sources import remote_feed as remote_read

    monkeypatch.setattr(remote_read, "ARENA_PIECES", 4)
    byte_cache(get_runtime()).clear()
    with settings.set(pinned_bytes=pinned_mib << 20), RangeServer(stores) as srv:
        arr = open_array(f"{srv.url}/plain.zarr")
        for _ in range(2):  # the second read reuses the first one's block
            np.testing.assert_array_equal(engine_read(arr, Ellipsis, device="cpu").data, _disk(stores, "plain.zarr"))
        assert byte_cache(get_runtime()).nbytes == 0
        s = open_array(f"{srv.url}/sharded.zarr")
        np.testing.assert_array_equal(engine_read(s, Ellipsis, device="cpu").data, _disk(stores, "sharded.zarr"))


def test_anonymous_s3_goes_through_the_native_client(moto_s3, stores, monkeypatch):
    """An unsigned s3:// read is plain HTTPS: the native client serves it (path style under the
    endpoint); what it cannot serve is left to obstore, whose answer stands."""
    from gpu_zarr.bench.remote_server import ProxyServer
    from gpu_zarr.engine.sources import http as native_http
    from gpu_zarr.engine.sources.remote import source_of
    from gpu_zarr.location import Location, public_http_url

    assert public_http_url(Location("s3://bucket/a/b.zarr", "s3", {"anon": True})) == \
        "https://bucket.s3.amazonaws.com/a/b.zarr"
    assert public_http_url(Location("s3://b.dots/x", "s3", {"anon": True, "region": "eu-west-1"})) == \
        "https://s3.eu-west-1.amazonaws.com/b.dots/x"
    assert public_http_url(Location("s3://bucket/x", "s3", {"key": "k", "secret": "s"})) is None  # signed
    if not native_http.available():
        pytest.skip(native_http.status())
    _no_aws_env(monkeypatch)
    with ProxyServer(moto_s3, latency=0.005, fail_503=0.05, fail_reset=0.03, seed=5) as px:
        monkeypatch.setenv("AWS_ENDPOINT_URL", px.url)
        for rel in ("v05s.ome.zarr/0", "plain.zarr"):
            byte_cache(get_runtime()).clear()
            arr = open_array(f"s3://pub/data/{rel}")
            np.testing.assert_array_equal(engine_read(arr, device="cpu").data, _disk(stores, rel))
            src = source_of(arr, get_runtime())
            assert src is not None and src.http is not None, "obstore took over"
            assert src.http_url == f"{px.url}/pub/data/{rel}"
        assert not any("authorization" in e["headers"] for e in px.log)
        assert any(e["headers"].get("user-agent") == "gpu-zarr" for e in px.log)  # the native client's requests
        # a whole object longer than its bound (a chunk's worst case): refused, naming it, and
        # never handed to obstore to be read whole (issue 35: that held any body a server sent)
        arr = open_array("s3://pub/data/plain.zarr")
        src = source_of(arr, get_runtime())
        with pytest.raises(CorruptChunkError, match=r"plain\.zarr/zarr\.json is larger than 8 bytes"):
            src.stream([("zarr.json", None)], lambda i, g: None, cap=8)
        assert src.http is not None


# -- the runtime owns the remote state ------------------------------------------------------------------
@pytest.mark.parametrize("client", ["native", "obstore"])
def test_a_runtime_of_its_own_keeps_and_releases_the_remote_state(server, stores, client, monkeypatch):
    """A store opened with a runtime of its own, read with it: the obstore loop, the byte cache,
    the array's source, the metadata documents and the obstore store are that runtime's (the
    process's runtime gets none of them), reported, and released by its close()."""
    import threading

    from gpu_zarr.engine.metadata import layout_of
    from gpu_zarr.engine.runtime import Runtime
    from gpu_zarr.engine.sources.remote import remote_source, remote_state
    from gpu_zarr.location import metadata_cache, object_stores

    rt = Runtime()
    url = f"{server.url}/sharded.zarr"
    loc = resolve(url)
    arr = zarr.open_array(loc.zarr_store(rt), mode="r")
    lay = layout_of(arr)
    assert lay.source is not None and lay.source.url == url  # plain data: the runtime has the live source
    src = remote_source(rt, lay)
    assert remote_source(rt, lay) is src and src.url == url
    if client == "obstore":
        monkeypatch.setattr(src, "http", None)
    before = set(get_runtime().report()["resources"])
    np.testing.assert_array_equal(engine_read(arr, device="cpu", runtime=rt, layout=lay).data,
                                  _disk(stores, "sharded.zarr"))
    assert set(get_runtime().report()["resources"]) <= before  # nothing of this read in the process's runtime
    held = rt.report()["resources"]
    assert {"remote", "metadata-cache"} <= set(held), held
    assert metadata_cache(rt).nbytes > 0 and src.stats["requests"] > 0
    state = remote_state(rt)
    if client == "obstore":
        assert len(object_stores(rt)) == 1 and state.loop._thread is not None
    loop_thread = state.loop._thread
    rt.close()
    assert rt.report()["resources"] == {}
    assert state.fetched.nbytes == 0 and state.nbytes == 0 and metadata_cache(rt).nbytes == 0
    assert remote_source(rt, lay) is not src  # a new state, a new source
    if loop_thread is not None:
        assert not loop_thread.is_alive() and loop_thread not in threading.enumerate()
    rt.close()
