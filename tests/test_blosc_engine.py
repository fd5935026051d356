"""Whole-array and region reads of Blosc stores through the engine's CPU twin, against zarr's own read."""

from __future__ import annotations

import os

import numpy as np
import pytest

from blosc_cases import BLOSC_LAYOUTS, write_blosc
from gpu_zarr import capabilities
from gpu_zarr.engine import read
from gpu_zarr.engine.metadata import layout_of
from gpu_zarr.errors import CorruptChunkError

IDS = [i for i, _ in BLOSC_LAYOUTS]


@pytest.mark.parametrize("kw", [k for _, k in BLOSC_LAYOUTS], ids=IDS)
def test_engine_reads_blosc_like_zarr(tmp_path, kw):
    arr, _ = write_blosc(tmp_path / "a.zarr", **kw)
    lay = layout_of(arr)
    assert lay.codec == "blosc"
    want = arr[...]
    got = read(arr, device="cpu").data
    assert got.dtype == want.dtype.newbyteorder("=") and np.array_equal(got, want)
    sel = (slice(3, 30, 2), slice(None, None, -3), slice(1, 20))
    assert np.array_equal(read(arr, sel, device="cpu").data, want[sel])


def test_blosc_detection_params(tmp_path):
    arr, _ = write_blosc(tmp_path / "v2.zarr", fmt=2, cname="zstd", shuffle="bitshuffle")
    p = layout_of(arr).codec_params
    assert p["cname"] == "zstd" and p["shuffle"] == "bitshuffle"
    arr, _ = write_blosc(tmp_path / "v3.zarr", fmt=3, cname="lz4", shuffle=None, dtype="<u4")
    p = layout_of(arr).codec_params
    assert p["cname"] == "lz4" and p["typesize"] == 4 and p["shuffle"] == "shuffle"  # zarr's resolution


def _chunk_files(root):
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith((".z", "zarr.json")))


@pytest.mark.parametrize("fmt", [2, 3])
def test_corrupt_blosc_chunk_named(tmp_path, fmt):
    root = tmp_path / "c.zarr"
    arr, _ = write_blosc(root, fmt=fmt, cname="lz4", shuffle="shuffle", shape=(16, 32), chunks=(8, 16),
                         partial=False)
    victim = _chunk_files(root)[1]
    b = bytearray(victim.read_bytes())
    b[16:20] = (len(b) + 50).to_bytes(4, "little")  # first block offset past the end
    victim.write_bytes(bytes(b))
    key = os.path.relpath(victim, root).replace(os.sep, "/")
    with pytest.raises(CorruptChunkError, match="block 0 starts at byte") as exc:
        read(arr, device="cpu")
    assert key.split("/")[-1] in str(exc.value)
    victim.write_bytes(bytes(b[:-40]))  # truncated
    with pytest.raises(CorruptChunkError, match="Blosc"):
        read(arr, device="cpu")


def test_overlapped_cpu_twin_orders_blosc_work(tmp_path):
    """With ops that run decodes late on a worker thread, the unshuffle still sees decoded bytes."""
    import time

    from gpu_zarr.engine import EngineOptions
    from gpu_zarr.engine.ops import AsyncCpuOps

    class SlowDecodes(AsyncCpuOps):
        def decode_batch(self, algo, src, so, ss, dst, do, ds, names, slot=0, wait=None, walked=False):
            from gpu_zarr.engine.decode import decode_batch_cpu

            def slow(*a):
                time.sleep(0.01)
                decode_batch_cpu(*a, walked=walked)
            self._run(slow, algo, src, so, ss, dst, do, ds, names, slot=slot, after=wait)

    arr, _ = write_blosc(tmp_path / "a.zarr", fmt=3, cname="zstd", shuffle="bitshuffle", chunks=(4, 8, 7),
                         shards=(8, 16, 14))
    ops = SlowDecodes(3)  # one worker thread per lane, lane = slot % lanes
    try:
        res = read(arr, device="cpu", ops=ops, options=EngineOptions(batch_bytes=1, slots=3, lanes=3, threads=2))
    finally:
        ops.sync()
        ops.close()
    assert res.stats["batches"] > 10 and res.stats["blosc_streams_zstd"] > 0
    np.testing.assert_array_equal(res.data, arr[...])


def test_host_decoded_chunks_are_reported(tmp_path):
    from gpu_zarr.kvikio_zarr import describe

    arr, _ = write_blosc(tmp_path / "a.zarr", fmt=2, cname="blosclz", shuffle="shuffle")
    res = read(arr, device="cpu")
    assert res.stats["blosc_host_chunks"] == res.stats["blosc_host_blosclz"] > 0
    assert "host" in describe(layout_of(arr))


@pytest.mark.parametrize("fmt", [2, 3])
def test_cpu_backend_names_the_corrupt_blosc_chunk(tmp_path, monkeypatch, fmt):
    """zarr-python's own Blosc error becomes a CorruptChunkError naming the chunk; nothing is written."""
    from gpu_zarr import zarr_io
    from gpu_zarr.capabilities import Capabilities

    monkeypatch.setattr(capabilities, "probe", lambda: Capabilities(notes=["no GPU in this test"]))
    root = tmp_path / "a.zarr"
    write_blosc(root, fmt=fmt, cname="lz4", shuffle="shuffle", shape=(16, 32), chunks=(8, 16), partial=False)
    key = "0.1" if fmt == 2 else "c/0/1"
    f = root / key
    b = bytearray(f.read_bytes())
    b[4:8] = (12345).to_bytes(4, "little")  # header's decoded size
    f.write_bytes(bytes(b))
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    with pytest.raises(CorruptChunkError, match=key.replace(".", r"\.")):
        zarr_io.read_zarr(root, prefer="cpu")
    assert before == {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
