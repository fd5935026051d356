"""The GPU path for remote stores decodes answers in groups as they arrive (``sources.remote_feed.RemoteFeed``):
on its CPU twin (the same stream, groups, staging reads and batches), and on the GPU."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
import zarr

pytest.importorskip("obstore")

import gpu_zarr.engine.sources.remote_feed as remote_read  # noqa: E402
from gpu_zarr.bench.remote import _clear  # noqa: E402 - one definition: a cold read
from gpu_zarr.bench.remote_server import RangeServer  # noqa: E402
from gpu_zarr.engine import EngineOptions  # noqa: E402
from gpu_zarr.engine import read as engine_read  # noqa: E402
from gpu_zarr.engine.ops import AsyncCpuOps  # noqa: E402
from gpu_zarr.engine.runtime import get_runtime  # noqa: E402
from gpu_zarr.errors import CorruptChunkError, ReadCancelled  # noqa: E402
from gpu_zarr.location import RemoteError  # noqa: E402
from gpu_zarr.store import open_array  # noqa: E402

REF = (np.arange(16 * 64 * 64, dtype="<u2").reshape(16, 64, 64) * 13) % 4001


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    import numcodecs

    root = tmp_path_factory.mktemp("remote-groups")
    s = zarr.create_array(root / "sharded.zarr", shape=REF.shape, chunks=(1, 16, 32), shards=(4, 32, 64),
                          dtype="<u2", compressors=zarr.codecs.ZstdCodec(level=1), fill_value=9)
    s[:12] = REF[:12]  # the last shards are never written: the fill value
    p = zarr.create_array(root / "plain.zarr", shape=REF.shape, chunks=(2, 32, 32), dtype="<u2",
                          compressors=zarr.codecs.ZstdCodec(level=1), fill_value=5)
    p[...] = REF
    b = zarr.create_array(root / "v2.zarr", shape=REF.shape, chunks=(1, 32, 64), dtype="<u2", zarr_format=2,
                          compressors=numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1))
    b[...] = REF
    return root


def _disk(root, rel):
    return zarr.open_array(root / rel, mode="r")[...]


def _settled(srv: RangeServer, in_flight: int) -> None:
    """After a read was stopped, the server sees no new request: at most the ``in_flight`` ones
    already on their way when it stopped (the server counts a request once it has parsed it)."""
    stopped = srv.requests
    time.sleep(0.15)
    settled = srv.requests
    assert settled <= stopped + in_flight, "requests went on after the read stopped"
    time.sleep(0.1)
    assert srv.requests == settled, "requests went on after the read stopped"


@pytest.fixture
def one_answer_groups(monkeypatch):
    """Every wake-up of the driver decodes what has arrived (groups as small as they come)."""
    monkeypatch.setattr(remote_read, "GROUP_BYTES", 1)


SELS = [Ellipsis, (slice(1, None, 3),), (5, slice(3, 60), slice(10, 50)), (slice(2, 14), slice(None, None, 2))]


@pytest.mark.parametrize("rel", ["sharded.zarr", "plain.zarr", "v2.zarr"])
def test_twin_reads_in_groups_equal_zarr(root, rel, one_answer_groups):
    ref = _disk(root, rel)
    _clear()
    with RangeServer(root, latency=0.003) as srv:
        arr = open_array(f"{srv.url}/{rel}")
        for sel in SELS:
            _clear()
            res = engine_read(arr, sel, device="cpu", ops=AsyncCpuOps())
            np.testing.assert_array_equal(np.asarray(res.data), ref[sel])
        res = engine_read(arr, Ellipsis, device="cpu", ops=AsyncCpuOps())
        assert res.stats["groups"] >= 1 and res.stats["decoded_bytes"] == ref.nbytes


def test_answers_arriving_apart_are_several_groups(root, one_answer_groups):
    """With answers arriving over time, decoding starts before the last one is in."""
    _clear()
    with RangeServer(root, latency=0.02) as srv:
        arr = open_array(f"{srv.url}/plain.zarr")
        # 8 x 2 x 2 = 32 chunks, 4 requests in flight: answers arrive in waves a round trip apart
        from gpu_zarr.engine.metadata import layout_of

        lay = layout_of(arr)
        assert lay.source is not None
        lay = replace(lay, source=replace(lay.source, requests=4))
        res = engine_read(arr, Ellipsis, device="cpu", ops=AsyncCpuOps(), layout=lay)
        np.testing.assert_array_equal(np.asarray(res.data), REF)
        assert res.stats["groups"] >= 4, res.stats
        assert res.stats["pieces"] == 32 and res.stats["requests"] == 32


def test_default_groups_keep_a_plane_in_one_decode(root):
    """A viewer's plane is one group (each decode call has a fixed cost on the GPU)."""
    _clear()
    with RangeServer(root, latency=0.005) as srv:
        arr = open_array(f"{srv.url}/v2.zarr")
        res = engine_read(arr, (7,), device="cpu", ops=AsyncCpuOps())
        np.testing.assert_array_equal(np.asarray(res.data), REF[7])
        assert res.stats["groups"] == 1 and res.stats["batches"] == 1
        assert res.stats["slots"] == 1 and res.stats["batch_bytes"] < 1 << 20  # sized by what a plane can need
        empty = engine_read(arr, (slice(3, 3),), device="cpu", ops=AsyncCpuOps())
        assert empty.data.shape == (0, 64, 64) and empty.stats["pieces"] == 0


@pytest.mark.parametrize("fault", ["fail_503", "fail_reset", "fail_truncate"])
def test_injected_failures_in_groups_give_exact_pixels(root, fault, one_answer_groups):
    with RangeServer(root, latency=0.001, seed=5, **{fault: 0.05}) as srv:
        for rel in ("sharded.zarr", "plain.zarr", "v2.zarr"):
            _clear()
            arr = open_array(f"{srv.url}/{rel}")
            np.testing.assert_array_equal(np.asarray(engine_read(arr, device="cpu", ops=AsyncCpuOps()).data),
                                          _disk(root, rel))


def test_a_corrupt_chunk_in_an_early_group_stops_the_read_cleanly(root, tmp_path, one_answer_groups):
    """A damaged chunk decoded while other answers are still on the way: CorruptChunkError
    naming it (a decoder's verdict may come as late as the read's last sync: the GPU's per-chunk
    statuses are looked at a few batches later); no request is left writing when the error is
    raised; the next read is exact."""
    import shutil

    shutil.copytree(root / "plain.zarr", tmp_path / "bad.zarr")
    chunk = tmp_path / "bad.zarr" / "c" / "0" / "0" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2:] = bytes(len(raw) - len(raw) // 2)  # a zstd frame with garbage inside
    chunk.write_bytes(bytes(raw))
    _clear()
    with RangeServer(tmp_path, latency=0.02) as srv:
        arr = open_array(f"{srv.url}/bad.zarr")
        from gpu_zarr.engine.metadata import layout_of

        lay = layout_of(arr)
        assert lay.source is not None
        lay = replace(lay, source=replace(lay.source, requests=2))  # 32 chunks two at a time
        with pytest.raises(CorruptChunkError, match=r"bad\.zarr/c/0/0/0"):
            engine_read(arr, Ellipsis, device="cpu", ops=AsyncCpuOps(), layout=lay)
        _settled(srv, lay.source.requests)
        np.testing.assert_array_equal(np.asarray(engine_read(arr, (slice(2, None),), device="cpu",
                                                             ops=AsyncCpuOps(), layout=lay).data), REF[2:])


def test_a_failed_request_mid_read_is_a_remote_error(root):
    _clear()
    with RangeServer(root, latency=0.005, forbidden=("plain.zarr/c/3/1/0",)) as srv:
        arr = open_array(f"{srv.url}/plain.zarr")
        with pytest.raises(RemoteError, match=r"plain\.zarr/c/3/1/0"):
            engine_read(arr, Ellipsis, device="cpu", ops=AsyncCpuOps())
        np.testing.assert_array_equal(np.asarray(engine_read(arr, (slice(0, 6),), device="cpu",
                                                             ops=AsyncCpuOps()).data), REF[:6])


def test_cancel_between_groups(root, one_answer_groups):
    import threading

    _clear()
    stop = threading.Event()
    with RangeServer(root, latency=0.02) as srv:
        arr = open_array(f"{srv.url}/plain.zarr")
        from gpu_zarr.engine.metadata import layout_of

        lay = layout_of(arr)
        assert lay.source is not None
        lay = replace(lay, source=replace(lay.source, requests=2))  # 32 chunks two at a time: 16 round trips, many groups

        def progress(done: int, total: int) -> None:
            stop.set()  # cancel once the first batch is placed
        srv.reset_counters()
        with pytest.raises(ReadCancelled):
            engine_read(arr, Ellipsis, device="cpu", ops=AsyncCpuOps(), layout=lay,
                        options=EngineOptions(cancel=stop, progress=progress))
        _settled(srv, lay.source.requests)
        assert srv.requests < 32, "every chunk was requested: the rest of the transfer was not cancelled"


@pytest.mark.gpu
@pytest.mark.parametrize("rel", ["sharded.zarr", "plain.zarr", "v2.zarr"])
def test_gpu_reads_remote_in_groups(root, rel, one_answer_groups):
    import cupy

    ref = _disk(root, rel)
    with RangeServer(root, latency=0.005) as srv:
        arr = open_array(f"{srv.url}/{rel}")
        for sel in SELS:
            _clear()
            res = engine_read(arr, sel, device="gpu")
            assert isinstance(res.data, cupy.ndarray)
            np.testing.assert_array_equal(cupy.asnumpy(res.data), ref[sel])
        assert res.stats["groups"] >= 1


def test_a_shard_rewritten_while_its_index_is_known_is_read_again(root, tmp_path, one_answer_groups):
    """The open array knows a shard's index; the shard is rewritten (other sizes and offsets).
    The ranged answers of the next read do not match that index. The shard is read again, and
    the second answer wins for every piece, including ones it now leaves to the fill value."""
    import shutil

    shutil.copytree(root / "sharded.zarr", tmp_path / "changing.zarr")
    _clear()
    with RangeServer(tmp_path, latency=0.002) as srv:
        arr = open_array(f"{srv.url}/changing.zarr")
        np.testing.assert_array_equal(np.asarray(engine_read(arr, (1,), device="cpu", ops=AsyncCpuOps()).data), REF[1])
        new = np.full(REF.shape, 9, "<u2")
        new[1, :16] = (np.arange(16 * 64, dtype="<u2").reshape(16, 64) * 5) % 777
        w = zarr.open_array(tmp_path / "changing.zarr", mode="r+")
        w[...] = new
        w[1, 16:] = 9  # the fill value: written as such (zarr may leave those inner chunks out)
        _clear()
        got = engine_read(arr, (1,), device="cpu", ops=AsyncCpuOps())
        np.testing.assert_array_equal(np.asarray(got.data), new[1])


@pytest.mark.parametrize("path", ["groups", "host"])
def test_a_shard_deleted_while_its_index_is_known_reads_as_the_fill_value(root, tmp_path, path):
    """A shard the open array knows the index of is deleted (the store rewritten, all of it the
    fill value there). The byte cache still holds that index: the ranged GET finds nothing,
    the shard is read again, found missing, and read as the fill value; never an error, never
    the old pixels. On the GPU path's twin and on the CPU's host path."""
    import shutil

    shutil.copytree(root / "sharded.zarr", tmp_path / "gone.zarr")
    _clear()
    ops = AsyncCpuOps() if path == "groups" else None
    with RangeServer(tmp_path, latency=0.002) as srv:
        arr = open_array(f"{srv.url}/gone.zarr")
        np.testing.assert_array_equal(np.asarray(engine_read(arr, (5,), device="cpu", ops=ops).data), REF[5])
        for shard in (tmp_path / "gone.zarr" / "c" / "1").rglob("*"):
            if shard.is_file():
                shard.unlink()  # planes 4-7: never written, now
        get_runtime().clear_caches()  # decoded chunks gone; the byte cache and the known indexes stay
        got = engine_read(arr, (5,), device="cpu", ops=ops)
        assert (np.asarray(got.data) == 9).all()


@pytest.mark.parametrize("rel", ["sharded.zarr", "plain.zarr", "v2.zarr"])
def test_batches_are_uploaded_from_where_the_answers_landed(root, rel, monkeypatch):
    """A big read's answers land in the arena (the GPU's pinned staging pool); a batch whose
    pieces lie in one arena block is uploaded from there, with no copy into staging. The
    pixels are zarr's whether or not a batch could be (arena answers: native HTTP only)."""
    from gpu_zarr.engine.sources import http as native_http

    monkeypatch.setattr(remote_read, "ARENA_PIECES", 4)  # these small arrays' reads count as big
    ref = _disk(root, rel)
    _clear()
    with RangeServer(root, latency=0.003) as srv:
        arr = open_array(f"{srv.url}/{rel}")
        res = engine_read(arr, Ellipsis, device="cpu", ops=AsyncCpuOps())
        np.testing.assert_array_equal(np.asarray(res.data), ref)
        again = engine_read(arr, (slice(2, 13), slice(5, 60)), device="cpu", ops=AsyncCpuOps())
        np.testing.assert_array_equal(np.asarray(again.data), ref[2:13, 5:60])
    if native_http.available():
        assert res.stats.get("in_place_batches", 0) == res.stats["batches"] >= 1, res.stats
