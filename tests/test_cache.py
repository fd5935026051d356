"""The decoded-chunk cache and scroll prefetch (CPU twin: the same pipeline code as the GPU)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zarr

from gpu_zarr import settings
from gpu_zarr.engine import EngineOptions, get_runtime, read
from gpu_zarr.engine.cache import ChunkCache
from stores import write


def test_lru_keeps_at_most_its_capacity():
    c = ChunkCache(100)
    for k in range(5):
        c.put(k, np.zeros(30, np.uint8))
    assert len(c) == 3 and c.nbytes == 90
    assert c.get(0) is None and c.get(4) is not None
    c.get(2)  # now most recent: 3 goes first
    c.put(9, np.zeros(30, np.uint8))
    assert c.get(3) is None and c.get(2) is not None
    c.put("huge", np.zeros(101, np.uint8))
    assert c.get("huge") is None
    rep = c.report()
    assert rep["entries"] == 3 and rep["hits"] >= 3 and rep["misses"] >= 2


def test_second_read_of_a_plane_comes_from_the_cache(tmp_path):
    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", shape=(16, 32, 28), chunks=(8, 8, 7))
    get_runtime().clear_caches()
    opts = EngineOptions(cache=True)
    first = read(arr, (3,), device="cpu", options=opts)
    second = read(arr, (4,), device="cpu", options=opts)  # same chunk layer: every chunk cached
    np.testing.assert_array_equal(first.data, arr[3])
    np.testing.assert_array_equal(second.data, arr[4])
    assert first.stats["cache_hits"] == 0 and first.stats["batches"] > 0
    assert second.stats["cache_hits"] == second.stats["pieces"] == 16 and second.stats["batches"] == 0
    plain = read(arr, (5,), device="cpu")  # without cache=True nothing is looked up
    assert "cache_hits" not in plain.stats


def test_a_chunk_rewritten_on_disk_is_not_served_stale(tmp_path):
    path = tmp_path / "a.zarr"
    arr, _ = write(path, fmt=2, codec="zstd", shape=(16, 32, 28), chunks=(8, 8, 7))
    get_runtime().clear_caches()
    opts = EngineOptions(cache=True)
    read(arr, (3,), device="cpu", options=opts)
    time.sleep(0.01)
    w = zarr.open_array(str(path), mode="r+")  # the test itself rewrites its store
    w[0:8, 0:8, 0:7] = 777
    again = read(zarr.open_array(str(path), mode="r"), (3,), device="cpu", options=opts)
    assert (again.data[0:8, 0:7] == 777).all()
    assert again.stats["cache_hits"] < again.stats["pieces"]


def test_cache_respects_its_setting(tmp_path):
    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", shape=(16, 32, 28), chunks=(8, 8, 7))
    with settings.set(cache_bytes=0):
        res = read(arr, (3,), device="cpu", options=EngineOptions(cache=True))
    assert "cache_hits" not in res.stats


def test_scrolling_prefetches_the_next_plane(tmp_path, monkeypatch):
    from gpu_zarr.lazy import _Source

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", shape=(16, 32, 28), chunks=(8, 8, 7))
    src = _Source(arr, "cpu")
    asked = []

    class Prepared:
        layout = None  # one plane per chunk layer, as far as the prefetch knows

        def read(self, key, **kw):
            asked.append((key, kw["options"].cache))

    monkeypatch.setattr(src, "prepared", lambda: Prepared())
    full = slice(0, 32, 1), slice(0, 28, 1)
    src.prefetch_next((5, *full))            # first plane: no direction yet
    src.prefetch_next((6, *full))            # forward: plane 7 next
    src.prefetching.result(timeout=10)
    src.prefetch_next((5, *full))            # backward: plane 4
    src.prefetching.result(timeout=10)
    src.prefetch_next((9, *full))            # a jump: no prefetch
    src.prefetch_next((15, *full))
    src.prefetch_next((15, slice(0, 16, 1), slice(0, 28, 1)))  # a pan, not a scroll
    assert [k[0] for k, _ in asked] == [7, 4] and all(c for _, c in asked)


def test_only_chunks_a_read_uses_in_part_are_kept(tmp_path):
    """A plane of one-plane-thick chunks uses each chunk whole: nothing is left for the next
    plane, so nothing is copied into the cache; a prefetch (cache="all") keeps everything."""
    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", shape=(16, 32, 28), chunks=(1, 8, 7))
    get_runtime().clear_caches()
    cache = get_runtime().chunk_cache("cpu")
    first = read(arr, (3,), device="cpu", options=EngineOptions(cache=True))
    np.testing.assert_array_equal(first.data, arr[3])
    assert len(cache) == 0
    read(arr, (4,), device="cpu", options=EngineOptions(cache="all"))
    assert len(cache) == 16
    again = read(arr, (4,), device="cpu", options=EngineOptions(cache=True))
    np.testing.assert_array_equal(again.data, arr[4])
    assert again.stats["cache_hits"] == 16
    # a region cutting chunks keeps the cut ones only
    get_runtime().clear_caches()
    part = read(arr, (5, slice(0, 12), slice(0, 28)), device="cpu", options=EngineOptions(cache=True))
    np.testing.assert_array_equal(part.data, arr[5, :12])
    assert len(get_runtime().chunk_cache("cpu")) == 4  # the row of chunks cut at y=12


def test_scrolling_thick_chunks_prefetches_the_next_chunk_layer(tmp_path, monkeypatch):
    """Inside a layer of 8-plane chunks the next plane is cached already: the prefetch goes to
    the first plane of the next layer, once."""
    from types import SimpleNamespace

    from gpu_zarr.lazy import _Source

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", shape=(24, 32, 28), chunks=(8, 8, 7))
    src = _Source(arr, "cpu")
    asked = []

    class Prepared:
        layout = SimpleNamespace(inner_shape=(8, 8, 7))

        def read(self, key, **kw):
            asked.append(key[0])

    monkeypatch.setattr(src, "prepared", lambda: Prepared())
    full = slice(0, 32, 1), slice(0, 28, 1)
    for z in (3, 4, 5, 6, 7, 8, 9):
        src.prefetch_next((z, *full))
        if src.prefetching is not None:
            src.prefetching.result(timeout=10)
    src.prefetch_next((10, *full))
    src.prefetching.result(timeout=10)
    src.prefetch_next((9, *full))   # backward inside layer 8..15: the last plane of layer 0..7
    src.prefetching.result(timeout=10)
    assert asked == [8, 16, 7]


def test_a_lazy_array_keeps_chunks_while_its_reads_stay_near(tmp_path):
    """Tiles that jump around keep nothing (each would cost fresh memory no neighbour uses); a
    tile next to the one before keeps its partly used chunks; a far jump is served from the cache
    where it can be, and keeps nothing again. The same chunks are read alike every way."""
    from gpu_zarr.engine import native
    from gpu_zarr.lazy import GpuLazyArray

    if not native.available():  # the CPU backend is then zarr-python's read: no chunk cache to keep in
        pytest.skip(f"the lazy array's CPU engine path needs the native library: {native.status().reason}")
    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", shape=(8, 64, 64), chunks=(4, 16, 16))
    get_runtime().clear_caches()
    cache = get_runtime().chunk_cache("cpu")
    la = GpuLazyArray(arr, backend="cpu")
    want = arr[...]

    def tile(z, y, x):
        np.testing.assert_array_equal(la[z, y:y + 24, x:x + 24], want[z, y:y + 24, x:x + 24])
        return len(cache)

    assert tile(0, 4, 4) > 0  # the first read has no read before it: kept
    kept = len(cache)
    assert tile(7, 36, 36) == kept  # far from the last: nothing kept
    assert tile(0, 36, 4) == kept  # far again
    grown = tile(1, 40, 8)  # within a chunk of the read before: its partly used chunks kept
    assert grown > kept
    assert tile(1, 40, 8) == grown  # the same tile again: served from the cache
