"""Remote reads cost the requests and round trips they should (counted at the loopback server,
no timing): whole shards in one GET, a plane of an open sharded array in one round trip,
shard indexes in one concurrent wave, near inner chunks coalesced; pixels equal zarr's."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

pytest.importorskip("obstore")

from gpu_zarr.bench.remote import _clear  # noqa: E402 - one definition: a cold read
from gpu_zarr.bench.remote_server import RangeServer  # noqa: E402
from gpu_zarr.engine import read as engine_read  # noqa: E402
from gpu_zarr.store import open_array  # noqa: E402


class _Log(RangeServer):
    """The server, whose log gives every request's path and Range header, and when each was
    served (requests that overlapped were sent together: one wave, one round trip)."""

    spans: dict[tuple[str, str | None], tuple[float, float]] = {}  # request -> (start, end)

    def take(self) -> list[tuple[str, str | None]]:
        """The requests since the last take (``self.inflight``: the most at once among them)."""
        with self.lock:
            out, self.log = self.log, []
            self.inflight = self.max_in_flight
            self.requests = self.max_in_flight = 0
        reqs = [(e["path"], e["headers"].get("range")) for e in out]
        self.spans = {r: (e["time"], e.get("end", e["time"])) for r, e in zip(reqs, out)}
        return reqs


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote-perf")
    data = np.arange(16 * 64 * 64, dtype="<u2").reshape(16, 64, 64)
    # 4 shards of 8x32x64 (zarr writes inner chunks in Morton order: a plane's are not adjacent)
    s = zarr.create_array(root / "sharded.zarr", shape=(16, 64, 64), chunks=(1, 16, 16), shards=(8, 32, 64),
                          dtype="<u2", compressors=zarr.codecs.ZstdCodec(level=1), fill_value=0)
    s[...] = data
    p = zarr.create_array(root / "plain.zarr", shape=(16, 64, 64), chunks=(4, 32, 32), dtype="<u2",
                          compressors=zarr.codecs.ZstdCodec(level=1), fill_value=5)
    p[:8] = data[:8]  # chunks of planes 8.. never written: the fill value
    return root, data


@pytest.fixture
def server(root):
    with _Log(root[0], latency=0.02) as srv:  # 20 ms: requests sent one after another would overlap less
        yield srv


def _cpu(arr, sel):
    return np.asarray(engine_read(arr, sel, device="cpu").data)


def test_whole_sharded_read_is_one_get_per_shard(server, root):
    """A whole shard is one GET. With the native HTTP client and decoder, each shard's index
    is asked for beside it, in the same wave (its inner chunks then decode as the shard's
    bytes arrive): one round trip all the same. Read again, the indexes are known: GETs only."""
    from gpu_zarr.engine.native import chunkwise as native_read
    from gpu_zarr.engine.sources import http as nh

    beside = nh.available() and native_read.native_codec("zstd") is not None
    _clear()
    arr = open_array(f"{server.url}/sharded.zarr")
    server.take()
    got = _cpu(arr, Ellipsis)
    np.testing.assert_array_equal(got, root[1])
    log = server.take()
    shards = sorted(f"/sharded.zarr/c/{z}/{y}/0" for z in range(2) for y in range(2))
    assert sorted(p for p, r in log if r is None) == shards, "whole shards are one GET each"
    indexes = sorted(p for p, r in log if r is not None)
    assert indexes == (shards if beside else []) and all(r.startswith("bytes=-") for _, r in log if r is not None)
    starts, ends = [a for a, _ in server.spans.values()], [b for _, b in server.spans.values()]
    assert max(starts) < min(ends), "one wave: every request was sent before any was answered"
    _clear()
    np.testing.assert_array_equal(_cpu(arr, Ellipsis), root[1])
    assert all(r is None for _, r in server.take()), "indexes known: whole GETs only"


@pytest.mark.parametrize("ops", ["twin", "cpu"])
def test_whole_sharded_read_on_the_gpu_path_is_one_get_per_shard(server, root, ops):
    """The GPU path (its CPU twin here: the same locate and staging reads) fetches a shard the
    read needs all of in one GET too, its index taken from its tail: no index round trip."""
    from gpu_zarr.engine.ops import AsyncCpuOps, CpuOps

    _clear()
    arr = open_array(f"{server.url}/sharded.zarr")
    server.take()
    o = AsyncCpuOps() if ops == "twin" else CpuOps()
    res = engine_read(arr, Ellipsis, device="cpu", ops=o)
    np.testing.assert_array_equal(np.asarray(res.data), root[1])
    assert res.stats["groups"] >= 1  # the batch pipeline (in groups as answers arrive), not the host path
    log = server.take()
    assert sorted(p for p, _ in log) == sorted(f"/sharded.zarr/c/{z}/{y}/0" for z in range(2) for y in range(2))
    assert all(r is None for _, r in log)
    # half of the array: two shards whole, the others untouched
    np.testing.assert_array_equal(np.asarray(engine_read(arr, (slice(0, 8),), device="cpu", ops=o).data), root[1][:8])
    # a plane: its shards' indexes are known from the whole reads: one wave of ranges, no index request
    server.take()
    np.testing.assert_array_equal(np.asarray(engine_read(arr, (3,), device="cpu", ops=o).data), root[1][3])
    assert all(r is not None and not r.startswith("bytes=-") for _, r in server.take())


def test_plane_of_an_open_sharded_array_is_one_round_trip(server, root):
    _clear()
    arr = open_array(f"{server.url}/sharded.zarr")
    _cpu(arr, Ellipsis)  # the whole read leaves every shard's index known to the open array
    _clear()  # no chunk or byte cache: only the open array's shard indexes
    server.take()
    got = _cpu(arr, (3,))
    np.testing.assert_array_equal(got, root[1][3])
    log = server.take()
    # plane 3: 4 inner chunks in each of two shards, a few KiB apart (Morton order): one
    # ranged GET per shard, both sent at once, and no shard-index request
    assert sorted(p for p, _ in log) == ["/sharded.zarr/c/0/0/0", "/sharded.zarr/c/0/1/0"]
    assert all(r is not None and not r.startswith("bytes=-") for _, r in log), "no shard-index request"


def test_shard_indexes_come_in_one_wave(server, root):
    _clear()
    arr = open_array(f"{server.url}/sharded.zarr")  # fresh: no index known
    server.take()
    got = _cpu(arr, (slice(None), slice(0, 16), slice(0, 16)))  # one inner chunk column: 1/8 of each shard
    np.testing.assert_array_equal(got, root[1][:, :16, :16])
    log = server.take()
    idx = [(p, r) for p, r in log if r is not None and r.startswith("bytes=-")]
    assert sorted(p for p, _ in idx) == ["/sharded.zarr/c/0/0/0", "/sharded.zarr/c/1/0/0"]
    assert set(log[:2]) == set(idx), "both indexes first, then the inner chunks"
    (a0, a1), (b0, b1) = (server.spans[k] for k in idx)
    assert a0 < b1 and b0 < a1, "the two index requests were in flight together (one round trip)"
    assert len(log) == 4  # then one ranged GET per shard (its 8 inner chunks are near each other)
    # a second read of the same open array asks for no index again
    _clear()
    server.take()
    np.testing.assert_array_equal(_cpu(arr, (slice(None), slice(0, 16), slice(0, 16))), root[1][:, :16, :16])
    assert not [r for _, r in server.take() if r is not None and r.startswith("bytes=-")]


def test_near_inner_chunks_are_one_ranged_get(server, root):
    _clear()
    arr = open_array(f"{server.url}/sharded.zarr")
    _cpu(arr, (0,))  # index of shard 0 known
    _clear()
    server.take()
    # planes 0-1, rows 0-15: inner chunks (0,0,*) and (1,0,*) -- in Morton order near each other
    got = _cpu(arr, (slice(0, 2), slice(0, 16)))
    np.testing.assert_array_equal(got, root[1][:2, :16])
    log = server.take()
    assert len(log) < 8, f"8 inner chunks within GAP_BYTES of each other: fewer GETs than chunks ({log})"


def test_unsharded_whole_read_sends_every_chunk_at_once(server, root):
    _clear()
    arr = open_array(f"{server.url}/plain.zarr")
    server.take()
    got = _cpu(arr, Ellipsis)
    np.testing.assert_array_equal(got[:8], root[1][:8])
    assert (got[8:] == 5).all()
    log = server.take()
    assert len(log) == 4 * 2 * 2  # every chunk once (the missing ones answer 404: the fill value)
    assert all(r is None for _, r in log)
    assert server.inflight >= 12  # one wave (64 in flight by default), not one after another


def test_stale_shard_index_is_not_used(server, root, tmp_path):
    import shutil

    src = root[0] / "sharded.zarr"
    dst = root[0] / "changing.zarr"
    shutil.copytree(src, dst, dirs_exist_ok=True)
    _clear()
    arr = open_array(f"{server.url}/changing.zarr")
    _cpu(arr, (0,))  # shard 0's index known to the open array
    new = np.full((16, 64, 64), 9, "<u2")
    new[0, :4] = np.arange(4 * 64, dtype="<u2").reshape(4, 64)
    w = zarr.open_array(dst, mode="r+")
    w[...] = new  # every shard rewritten: other sizes, other offsets
    _clear()
    got = _cpu(arr, (0,))
    np.testing.assert_array_equal(got, new[0])


@pytest.mark.parametrize("fault", [None, "fail_truncate"])
def test_whole_shards_with_known_indexes_decode_as_their_bytes_arrive(root, tmp_path, fault):
    """Once the open array knows the shards' indexes, a whole read hands each inner chunk to
    the native decode set as the shard's bytes pass its end (every piece, none left for after
    the answers); pixels equal zarr's, also with answers cut short and retried. A shard
    rewritten since its index was read (another size) hands nothing: it is read from its own
    bytes, and the pixels are the new ones."""
    import shutil

    from gpu_zarr.engine.native import chunkwise as native_read
    from gpu_zarr.engine.sources import http as nh

    if not (nh.available() and native_read.native_codec("zstd")):
        pytest.skip("the native HTTP client or native zstd is not here")
    dst = tmp_path / "s.zarr"
    shutil.copytree(root[0] / "sharded.zarr", dst)
    kw = {fault: 0.3} if fault else {}
    with RangeServer(tmp_path, latency=0.005, seed=1, **kw) as srv:
        _clear()
        arr = open_array(f"{srv.url}/s.zarr")
        first = engine_read(arr, Ellipsis, device="cpu")  # indexes unknown: asked for beside the shards
        np.testing.assert_array_equal(np.asarray(first.data), root[1])
        assert first.stats["index_requests"] == 4
        _clear()
        res = engine_read(arr, Ellipsis, device="cpu")
        np.testing.assert_array_equal(np.asarray(res.data), root[1])
        assert res.stats["handed_natively"] == res.stats["pieces"] == 256, res.stats
        assert res.stats["index_requests"] == 0
        new = root[1].copy()
        new[:8, :32] = np.random.default_rng(0).integers(0, 60000, (8, 32, 64), dtype="<u2")  # shard (0, 0, 0)
        zarr.open_array(dst, mode="r+")[:8, :32] = new[:8, :32]
        _clear()
        res = engine_read(arr, Ellipsis, device="cpu")
        np.testing.assert_array_equal(np.asarray(res.data), new)
        assert res.stats["handed_natively"] == 256 - 64, res.stats


def test_a_first_whole_read_decodes_shards_as_they_arrive_once_their_indexes_come(root, tmp_path):
    """A new open array knows no index: each shard's is asked for beside it (same wave), and
    from the moment it is in, the shard's inner chunks are handed to the decode set as its
    bytes arrive (the bodies come slowly here: most of each is still on the way then)."""
    from gpu_zarr.engine.native import chunkwise as native_read
    from gpu_zarr.engine.sources import http as nh

    if not (nh.available() and native_read.native_codec("zstd")):
        pytest.skip("the native HTTP client or native zstd is not here")
    with RangeServer(root[0], latency=0.005, trickle=(1024, 0.002)) as srv:
        _clear()
        res = engine_read(open_array(f"{srv.url}/sharded.zarr"), Ellipsis, device="cpu")
        np.testing.assert_array_equal(np.asarray(res.data), root[1])
        assert res.stats["index_requests"] == 4 and res.stats["handed_natively"] > 0, res.stats
