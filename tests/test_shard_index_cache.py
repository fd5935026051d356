"""Shard indexes kept across reads (``Runtime.shard_indexes``): a viewer's plane reads reuse
them, and a shard rewritten between reads is read again (its size or mtime changed)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zarr

from gpu_zarr.engine import EngineOptions
from gpu_zarr.engine import read as engine_read
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.errors import CorruptChunkError


def _sharded(path: Path, seed: int = 0) -> zarr.Array:
    a = zarr.create_array(str(path), shape=(8, 64, 64), chunks=(1, 16, 16), shards=(4, 32, 32), dtype="u2",
                          compressors=zarr.codecs.ZstdCodec(level=1), overwrite=True)
    a[:] = np.random.default_rng(seed).integers(0, 1000, (8, 64, 64), dtype="u2")
    return a


@pytest.fixture(autouse=True)
def _fresh_indexes():
    get_runtime().shard_indexes().clear()
    yield
    get_runtime().shard_indexes().clear()


def _plane(path: Path, z: int) -> np.ndarray:
    return engine_read(str(path), (z,), device="cpu", options=EngineOptions(cache=False)).data


def test_plane_reads_reuse_checked_indexes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.zarr"
    a = _sharded(path)
    np.testing.assert_array_equal(_plane(path, 1), a[1])
    held = get_runtime().shard_indexes().nbytes
    assert held > 0
    # the second read of the same shards reads no index: a pread would fail it
    import gpu_zarr.engine.sources.locate as locate_mod

    def no_pread(*args: object) -> bytes:
        raise AssertionError("a shard index was read again")
    monkeypatch.setattr(locate_mod.os, "pread", no_pread)
    np.testing.assert_array_equal(_plane(path, 2), a[2])
    assert get_runtime().shard_indexes().nbytes == held


def test_a_rewritten_shard_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    _sharded(path, seed=0)
    _plane(path, 1)
    b = _sharded(path, seed=1)  # new data: the shards' sizes or mtimes change
    for f in (path / "c").rglob("*"):
        if f.is_file():
            st = f.stat()
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # whatever the clock's granularity
    np.testing.assert_array_equal(_plane(path, 1), b[1])


def test_a_shard_index_damaged_after_caching_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    _sharded(path)
    _plane(path, 0)
    shard = next(f for f in sorted((path / "c").rglob("*")) if f.is_file())
    raw = bytearray(shard.read_bytes())
    raw[-20:-4] = b"\xff" * 8 + b"\x00" * 8  # an index entry pointing outside, same size
    shard.write_bytes(bytes(raw))
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(CorruptChunkError, match="index|checksum"):
        engine_read(str(path), device="cpu", options=EngineOptions(cache=False))


def test_clear_caches_drops_the_indexes(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    _sharded(path)
    _plane(path, 0)
    assert get_runtime().shard_indexes().nbytes > 0
    get_runtime().clear_caches()
    assert get_runtime().shard_indexes().nbytes == 0


def test_shard_groups_are_numpys_row_wise_unique():
    """Pieces are grouped by shard through one integer per shard over the read's bounding box;
    the groups are numpy's row-wise unique, also where the box is too large to number."""
    from gpu_zarr.engine.sources.locate import _shard_groups

    rng = np.random.default_rng(0)
    cases = [rng.integers(3, 9, (40, 3)), rng.integers(0, 2, (5, 1)), np.array([[7, 0, 2]]),
             np.array([[0, 0, 0], [2**40, 2**40, 1], [0, 0, 0]]), rng.integers(0, 4, (200, 5))]
    for coords in cases:
        coords = coords.astype(np.int64)
        uniq, where = _shard_groups(coords)
        want, want_where = np.unique(coords, axis=0, return_inverse=True)
        np.testing.assert_array_equal(uniq, want)
        np.testing.assert_array_equal(where, want_where.reshape(-1))
        np.testing.assert_array_equal(uniq[where], coords)
