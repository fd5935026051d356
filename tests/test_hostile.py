"""Hostile servers and stores (issue 35): every read ends with a clear error from
``gpu_zarr.errors`` naming the URL or store and the chunk, within twice the configured
timeout, holding no more than 64 MiB beyond what the child held before its read (peak RSS of
the child process, ``os.wait4``), opening nothing outside the store.

Each hostile read runs in a child process (:func:`hostile.run_child`) against a
:class:`hostile.HostileServer` on loopback that stops by itself; remote reads run through the
native HTTP client and through obstore (``GPU_ZARR_NATIVE_HTTP=0``)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
import warnings

import numpy as np
import pytest
import zarr

pytest.importorskip("obstore")

from gpu_zarr.engine.sources import http as native_http  # noqa: E402
from hostile import HostileServer, run_child  # noqa: E402

GROWTH_MIB = 64  # the target: the read's output (KiB here) + its caches (4 MiB) + 64 MiB
CLIENTS = [pytest.param("1", id="native"), pytest.param("0", id="obstore")]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """16 chunks of 2 KiB (zstd), the same sharded, and an OME image."""
    from gpu_zarr.sample import write_sample_omezarr

    root = tmp_path_factory.mktemp("hostile")
    data = np.arange(128 * 128, dtype="<u2").reshape(128, 128)
    zarr.create_array(root / "u.zarr", shape=(128, 128), chunks=(32, 32), dtype="<u2",
                      compressors=zarr.codecs.ZstdCodec())[:] = data
    zarr.create_array(root / "s.zarr", shape=(128, 128), chunks=(32, 32), shards=(64, 64), dtype="<u2",
                      compressors=zarr.codecs.ZstdCodec())[:] = data
    write_sample_omezarr(root / "img.ome.zarr", version="0.4", shape=(1, 2, 32, 32), levels=1)
    return root


def _need_native(client: str) -> None:
    if client == "1" and not native_http.available():
        pytest.skip(native_http.status())


def _read(url: str, selection: str = "...", timeout: float | None = None) -> str:
    """The child's body: open ``url`` and read ``selection`` on the CPU through the engine."""
    opts = f", storage_options={{'timeout': {timeout}}}" if timeout is not None else ""
    return f"""
from gpu_zarr.engine import read
from gpu_zarr.store import open_array
arr = open_array({url!r}{opts})
out["shape"] = list(read(arr, np.s_[{selection}], device="cpu").data.shape)
"""


def _assert_clean(child, *, names: str, errors: tuple[str, ...], wall: float) -> None:
    """A gpu_zarr error of one of ``errors`` naming ``names``, within ``wall`` s and the memory bound."""
    out = child.out
    assert out, f"the child printed nothing (rc {child.rc}): {child.stderr[-2000:]}"
    assert out.get("error") in errors and out.get("gpu_zarr"), out
    assert names in out["message"], out["message"]
    assert out["seconds"] < wall, (out["seconds"], out["message"])
    assert child.growth_mib < GROWTH_MIB, f"peak {child.peak_mib:.0f} MiB, {child.growth_mib:.0f} MiB past the read's start"


# -- 1. memory --------------------------------------------------------------------------------
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("length", [True, False], ids=["length", "no-length"])
def test_a_huge_answer_to_a_chunk_get_is_cut_at_the_chunk_bound(stores, client, length):
    _need_native(client)
    hits = lambda p, h: p.startswith("/u.zarr/c/")  # noqa: E731
    with HostileServer(stores, "big", hits, length=length) as srv:
        child = run_child(_read(f"{srv.url}/u.zarr"), env={"GPU_ZARR_NATIVE_HTTP": client})
    # (obstore refuses an answer with no Content-Length itself: a RemoteError naming the chunk)
    ok = ("CorruptChunkError",) if length or client == "1" else ("RemoteError",)
    _assert_clean(child, names=f"{srv.url}/u.zarr/c/", errors=ok, wall=20)
    assert "larger than" in child.out["message"] or not length


@pytest.mark.parametrize("client", CLIENTS)
def test_a_200_to_a_range_request_is_never_read_whole(stores, client):
    """Either what was asked for (the answer cut where the range ends) or a clear error; never
    the 400 MiB held."""
    _need_native(client)
    hits = lambda p, h: p.startswith("/s.zarr/c/")  # noqa: E731
    body = _read("URL", "0:32, 0:32").replace('out["shape"] = list(', 'got = (').replace(".data.shape)", ".data)") + \
        "out['sum'] = int(got.astype(np.int64).sum())\n"
    with HostileServer(stores, "range200", hits) as srv:
        child = run_child(body.replace("'URL'", repr(f"{srv.url}/s.zarr")), env={"GPU_ZARR_NATIVE_HTTP": client})
    if "error" in child.out:
        _assert_clean(child, names=f"{srv.url}/s.zarr", errors=("RemoteError", "CorruptChunkError"), wall=20)
        assert "no byte ranges" in child.out["message"]
        return
    want = int(np.arange(128 * 128, dtype="<u2").reshape(128, 128)[:32, :32].astype(np.int64).sum())
    assert child.out["sum"] == want
    assert child.out["seconds"] < 20
    assert child.growth_mib < GROWTH_MIB, child.growth_mib


@pytest.mark.parametrize("client", CLIENTS)
def test_a_huge_metadata_document_is_refused_saying_how_to_raise_the_cap(stores, client):
    _need_native(client)
    hits = lambda p, h: p == "/u.zarr/zarr.json"  # noqa: E731
    with HostileServer(stores, "big", hits) as srv:
        child = run_child(_read(f"{srv.url}/u.zarr"), env={"GPU_ZARR_NATIVE_HTTP": client})
    _assert_clean(child, names=f"{srv.url}/u.zarr/zarr.json", errors=("RemoteError",), wall=20)
    assert "GPU_ZARR_METADATA_MIB" in child.out["message"]


# -- 2. time ----------------------------------------------------------------------------------
@pytest.mark.parametrize("client", CLIENTS)
def test_a_dripped_body_ends_within_twice_the_timeout(stores, client):
    _need_native(client)
    hits = lambda p, h: p.startswith("/u.zarr/c/0/")  # noqa: E731
    with HostileServer(stores, "drip", hits, drip_s=0.4) as srv:
        child = run_child(_read(f"{srv.url}/u.zarr", timeout=3), env={"GPU_ZARR_NATIVE_HTTP": client})
    _assert_clean(child, names=f"{srv.url}/u.zarr/c/0/", errors=("RemoteError",), wall=2 * 3)


@pytest.mark.parametrize("client", CLIENTS)
def test_cancel_stops_transfers_in_flight_within_a_second(stores, client):
    _need_native(client)
    hits = lambda p, h: p.startswith("/u.zarr/c/0/")  # noqa: E731
    body = """
import threading
from gpu_zarr import read_zarr
ev = threading.Event()
threading.Timer(1.5, ev.set).start()
try:
    read_zarr({url!r}, prefer="cpu", progress=False, cancel=ev)
finally:
    out["after_cancel"] = time.monotonic() - t - 1.5
"""
    with HostileServer(stores, "drip", hits, drip_s=0.4) as srv:
        child = run_child(body.replace("{url!r}", repr(f"{srv.url}/u.zarr")), env={"GPU_ZARR_NATIVE_HTTP": client})
    out = child.out
    assert out.get("error") == "ReadCancelled" and out.get("gpu_zarr"), (out, child.stderr[-2000:])
    assert out["after_cancel"] < 1.0, out
    assert child.growth_mib < GROWTH_MIB


# -- 4. every answer checked against its request ------------------------------------------------
@pytest.mark.parametrize("client", CLIENTS)
def test_a_suffix_answered_with_the_first_bytes_is_refused(stores, client):
    _need_native(client)
    hits = lambda p, h: p.startswith("/s.zarr/c/")  # noqa: E731
    with HostileServer(stores, "suffix_wrong", hits) as srv:
        child = run_child(_read(f"{srv.url}/s.zarr", "0:32, 0:32"),
                          env={"GPU_ZARR_NATIVE_HTTP": client, "GPU_ZARR_REMOTE_TIMEOUT_S": "10"})
    _assert_clean(child, names=f"{srv.url}/s.zarr/c/", errors=("RemoteError",), wall=20)
    assert "shard index" in child.out["message"]


# -- 5. sizes before allocation -----------------------------------------------------------------
def _claiming_shard(src, dst, claim: int) -> None:
    """``dst``: the sharded store with its first shard's index claiming ``claim`` bytes for its
    first inner chunk, at an offset inside a shard that says it is big enough (no crc32c: the
    default index has one, rewritten here)."""
    import google_crc32c

    shutil.copytree(src, dst)
    f = dst / "c" / "0" / "0"
    raw = bytearray(f.read_bytes())
    n = 4 * 16
    index = raw[-(n + 4):]
    entries = np.frombuffer(bytes(index[:n]), "<u8").reshape(4, 2).copy()
    entries[0] = (0, claim)
    body = entries.astype("<u8").tobytes()
    raw[-(n + 4):] = body + google_crc32c.value(body).to_bytes(4, "little")
    f.write_bytes(bytes(raw))


@pytest.mark.parametrize("client", CLIENTS)
def test_a_remote_index_claiming_64_gib_is_refused_before_a_request(stores, tmp_path, client):
    _need_native(client)
    _claiming_shard(stores / "s.zarr", tmp_path / "s.zarr", 64 << 30)
    hits = lambda p, h: p == "/s.zarr/c/0/0"  # noqa: E731
    with HostileServer(tmp_path, "claim", hits, claim=(64 << 30) + 4096) as srv:
        child = run_child(_read(f"{srv.url}/s.zarr", "0:32, 0:32"), env={"GPU_ZARR_NATIVE_HTTP": client})
        asked = [e["headers"].get("range", "") for e in srv.log if e["path"] == "/s.zarr/c/0/0"]
    _assert_clean(child, names="inner chunk (0, 0)", errors=("CorruptChunkError",), wall=20)
    assert f"{srv.url}/s.zarr/c/0/0" in child.out["message"]
    assert all(not r.startswith("bytes=0-") for r in asked), asked  # no range of the claimed chunk was asked for


def test_a_local_index_claiming_more_than_the_worst_case_is_refused(stores, tmp_path):
    _claiming_shard(stores / "s.zarr", tmp_path / "s.zarr", 1 << 30)
    f = tmp_path / "s.zarr" / "c" / "0" / "0"
    raw = f.read_bytes()
    with open(f, "r+b") as fh:  # a sparse shard of 1 GiB + its index: the claim lies inside it
        fh.truncate((1 << 30) + 4096)
        fh.seek((1 << 30) + 4096)
        fh.write(raw[-(4 * 16 + 4):])
    child = run_child(_read(str(tmp_path / "s.zarr"), "0:32, 0:32"))
    _assert_clean(child, names="c/0/0: inner chunk (0, 0)", errors=("CorruptChunkError",), wall=20)


def test_a_sparse_gigabyte_chunk_file_is_refused_before_it_is_read(stores, tmp_path):
    shutil.copytree(stores / "u.zarr", tmp_path / "u.zarr")
    with open(tmp_path / "u.zarr" / "c" / "1" / "1", "r+b") as fh:
        fh.truncate(1 << 30)
    child = run_child(_read(str(tmp_path / "u.zarr")))
    _assert_clean(child, names="c/1/1", errors=("CorruptChunkError",), wall=20)


@pytest.mark.parametrize("kind", ["u", "s"])
def test_a_fifo_where_a_chunk_or_shard_belongs_is_refused_not_waited_on(stores, tmp_path, kind):
    shutil.copytree(stores / f"{kind}.zarr", tmp_path / f"{kind}.zarr")
    target = tmp_path / f"{kind}.zarr" / "c" / "0" / "0"  # (a chunk of u.zarr, a shard of s.zarr)
    target.unlink()
    os.mkfifo(target)
    child = run_child(_read(str(tmp_path / f"{kind}.zarr")), timeout=30)
    _assert_clean(child, names="FIFO", errors=("CorruptChunkError",), wall=10)
    assert stat.S_ISFIFO(os.stat(target).st_mode)


# -- 3. redirects (the native client's: obstore's are reqwest's) ---------------------------------
def test_a_redirect_to_another_scheme_is_refused(stores):
    _need_native("1")
    hits = lambda p, h: p.startswith("/u.zarr/c/")  # noqa: E731
    with HostileServer(stores, "redirect", hits, target="ftp://127.0.0.1:21") as srv:
        child = run_child(_read(f"{srv.url}/u.zarr"))
    _assert_clean(child, names="not an http(s) URL", errors=("RemoteError",), wall=20)
    assert f"{srv.url}/u.zarr/c/" in child.out["message"]


def test_a_redirect_to_another_host_drops_the_storage_options_headers(stores):
    _need_native("1")
    body = """
from gpu_zarr.engine import read
from gpu_zarr.store import open_array
arr = open_array(URL, storage_options={"headers": {"X-Secret": "s3cr3t"}})
out["sum"] = int(read(arr, np.s_[...], device="cpu").data.astype(np.int64).sum())
"""
    with HostileServer(stores) as other:
        there = other.url.replace("127.0.0.1", "localhost")  # another host name: the headers stay behind
        hits = lambda p, h: p.startswith("/u.zarr/c/")  # noqa: E731
        with HostileServer(stores, "redirect", hits, target=there) as srv:
            child = run_child(body.replace("URL", repr(f"{srv.url}/u.zarr")))
        moved = [e for e in other.log if e["path"].startswith("/u.zarr/c/")]
        first = [e for e in srv.log if e["path"].startswith("/u.zarr/c/")]
    assert child.out.get("sum") == int(np.arange(128 * 128, dtype="<u2").astype(np.int64).sum()), child.out
    assert moved and first
    assert all(e["headers"].get("x-secret") == "s3cr3t" for e in first)
    assert not any("x-secret" in e["headers"] for e in moved), moved[:2]


# -- 6. OME label paths ---------------------------------------------------------------------------
_BAD_LABELS = ["../../outside/img.ome.zarr", "/etc", "file:///etc", "blobs"]


@pytest.fixture
def bad_labels(stores, tmp_path):
    """An OME image whose labels/.zattrs names paths outside the store, and an OME image there."""
    root = tmp_path / "store"
    shutil.copytree(stores / "img.ome.zarr", root / "img.ome.zarr")
    shutil.copytree(stores / "img.ome.zarr", tmp_path / "outside" / "img.ome.zarr")
    (root / "img.ome.zarr" / "labels" / ".zattrs").write_text(json.dumps({"labels": _BAD_LABELS}))
    return root


def _check_labels(image, caught) -> None:
    assert list(image.labels) == ["blobs"]
    said = " ".join(str(w.message) for w in caught)
    for name in _BAD_LABELS[:3]:
        assert repr(name) in said, said


def test_label_names_outside_the_store_are_skipped_with_a_warning(bad_labels):
    from gpu_zarr.omezarr import open_ome

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        image = open_ome(bad_labels / "img.ome.zarr")
    _check_labels(image, caught)


def test_label_names_outside_a_remote_store_are_never_requested(bad_labels):
    from gpu_zarr.location import clear_metadata_cache
    from gpu_zarr.omezarr import open_ome

    clear_metadata_cache()
    with HostileServer(bad_labels) as srv:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            image = open_ome(f"{srv.url}/img.ome.zarr")
        paths = [e["path"] for e in srv.log]
    _check_labels(image, caught)
    assert paths and all(p.startswith("/img.ome.zarr/") for p in paths), [p for p in paths
                                                                           if not p.startswith("/img.ome.zarr/")]


def test_the_napari_reader_skips_label_names_outside_the_store(bad_labels):
    pytest.importorskip("napari")
    from gpu_zarr.napari_plugin._reader import napari_get_reader

    reader = napari_get_reader(str(bad_labels / "img.ome.zarr"))
    assert reader is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layers = reader(str(bad_labels / "img.ome.zarr"))
    assert [t for _, _, t in layers].count("labels") == 1
    said = " ".join(str(w.message) for w in caught)
    assert all(repr(name) in said for name in _BAD_LABELS[:3]), said


def test_the_server_stops_by_itself(stores):
    import urllib.request

    srv = HostileServer(stores, lifetime=0.5)
    with srv:
        assert urllib.request.urlopen(f"{srv.url}/u.zarr/zarr.json", timeout=5).status == 200
        assert srv.closing.wait(5)
    ended = threading.Event()

    def ask() -> None:
        try:
            urllib.request.urlopen(f"{srv.url}/u.zarr/zarr.json", timeout=2)
        except OSError:
            ended.set()
    ask()
    assert ended.is_set()
