"""The writer's memory: measured in every result, and bounded by its batches, not by the data.

The bound is checked in a child process (a fresh heap: what earlier tests allocated and freed
would hide or inflate this one's growth), after a small write there so that imports, thread
pools and the native library are in place before the measured write.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpu_zarr.memory import HostMemory
from gpu_zarr.write.api import write_zarr

MiB = 1 << 20

# the measured write: 256 MiB of incompressible uint16 (so its encoded bytes are ~256 MiB too),
# 128 KiB chunks in 2 MiB shards, 1 MiB batches (so each batch is one shard), 2 lanes
_CHILD = """
import json, sys
import numpy as np
from gpu_zarr import settings
from gpu_zarr.write.api import write_zarr

kind, dst = sys.argv[1], sys.argv[2]
shape, chunks, shards = (256, 512, 1024), (1, 256, 256), (4, 512, 512)
rng = np.random.default_rng(0)
write_zarr(rng.integers(0, 65535, (8, 512, 512), dtype=np.uint16), dst + "/warm", chunks=chunks, shards=shards,
           level=1, encoder="cpu")  # imports, pools, the native library: in place before the measured write
if kind == "dask":
    import dask.array as da

    data = da.random.default_rng(0).integers(0, 65535, shape, chunks=shards, dtype=np.uint16)
else:
    data = rng.integers(0, 65535, shape, dtype=np.uint16)
held = []
if kind == "hoarding":  # a writer that keeps every encoded chunk: the bound must catch it
    from gpu_zarr.write import encode

    real = encode.CpuEncoder.encode
    encode.CpuEncoder.encode = lambda self, c: held.append(list(real(self, c).parts)) or encode.HostFrames(held[-1])
with settings.set(batch_bytes=1 << 20, lanes=2):
    res = write_zarr(data, dst + "/big", chunks=chunks, shards=None if kind == "auto" else shards, level=1,
                     encoder="cpu")
unit = 4 * 512 * 512 * 2
print(json.dumps({"peak": res.host_peak_bytes, "memory": res.memory, "stored": res.stored_bytes,
                  "nbytes": res.nbytes, "unit": unit}))
"""


def _child(kind: str, tmp_path: Path) -> dict:
    src = str(Path(__file__).parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _CHILD, kind, str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _bound(batch: int, unit: int, lanes: int) -> int:
    """What a write may hold beyond its input: per lane in flight, a batch (at least one shard)
    as blocks read, as gathered chunks and as encoded chunks, with room for the allocator's
    per-thread arenas (x6 in all), plus 64 MiB for the encode and file threads' stacks and
    compression contexts. Independent of the data's size."""
    return 64 * MiB + 6 * lanes * max(batch, unit)


def test_host_memory_measures_what_a_block_touches():
    with HostMemory() as mem:
        a = np.ones(64 * MiB, np.uint8)  # touched: resident
        del a
    if mem.peak_bytes is None:
        pytest.skip(f"host memory not measurable here: {mem.method}")
    assert mem.method in ("VmHWM", "ru_maxrss (lower bound)")
    assert 60 * MiB <= mem.peak_bytes < 200 * MiB


def test_every_write_result_reports_its_memory(tmp_path):
    a = np.arange(64 * 64 * 64, dtype=np.uint16).reshape(64, 64, 64)
    res = write_zarr(a, tmp_path / "a", chunks=(16, 32, 32), encoder="cpu")
    assert res.memory.startswith("host resident set, sampled")
    assert res.device_peak_bytes is None  # the CPU encoder on host data: no GPU involved
    assert res.host_peak_bytes is None or res.host_peak_bytes >= 0


def test_a_write_leaves_the_process_high_water_mark_alone(tmp_path):
    """A library call must not reset what the user's own peak-memory accounting reads
    (``getrusage``'s ``ru_maxrss`` is the kernel's high-water mark)."""
    import resource

    big = np.ones(128 * MiB, np.uint8)  # a peak of the caller's, before the write
    del big
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    write_zarr(np.zeros((8, 64, 64), np.uint16), tmp_path / "a", chunks=(4, 32, 32), encoder="cpu")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >= before


def test_the_sampler_sees_what_a_block_holds():
    import time

    from gpu_zarr.memory import PeakSampler

    with PeakSampler() as mem:
        a = np.ones(64 * MiB, np.uint8)
        time.sleep(0.05)  # held for 25 intervals
        del a
    if mem.host_bytes is None:
        pytest.skip(f"host memory not measurable here: {mem.method}")
    assert 60 * MiB <= mem.host_bytes < 200 * MiB


@pytest.mark.parametrize("kind", ["numpy", "dask"])
def test_host_memory_of_a_write_is_bounded_by_its_batches(tmp_path, kind):
    """256 MiB written in 2 MiB shards, 2 lanes: the peak extra resident memory stays within
    what the batches in flight hold (it would be ~256 MiB if the encoded volume were kept)."""
    if kind == "dask":
        pytest.importorskip("dask.array")
    r = _child(kind, tmp_path)
    if r["peak"] is None:
        pytest.skip(f"host memory not measurable here: {r['memory']}")
    bound = _bound(1 * MiB, r["unit"], 2)
    assert r["stored"] > 2.5 * bound  # so keeping the encoded volume could not pass
    assert r["peak"] < bound, f"peak extra {r['peak'] / MiB:.0f} MiB, bound {bound / MiB:.0f} MiB ({r['memory']})"


def test_the_bound_catches_a_writer_that_keeps_its_encoded_chunks(tmp_path):
    r = _child("hoarding", tmp_path)
    if r["peak"] is None:
        pytest.skip(f"host memory not measurable here: {r['memory']}")
    assert r["peak"] > _bound(1 * MiB, r["unit"], 2)
