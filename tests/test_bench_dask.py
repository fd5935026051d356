"""benchmarks/bench_dask.py end to end at a tiny size on the CPU (2-worker LocalCluster), and its checksum."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("dask.array")
pytest.importorskip("distributed")

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench_dask():
    sys.path.insert(0, str(BENCH_DIR))
    try:
        import bench_dask

        yield bench_dask
    finally:
        sys.path.remove(str(BENCH_DIR))


def test_checksum_is_order_sensitive_and_dtype_generic(bench_dask):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 65535, (3, 100, 77), dtype=np.uint16)
    c = bench_dask.block_checksum(a)
    assert c == bench_dask.block_checksum(a.copy()) and c[3] == a.size
    b = a.copy()
    b[0, 0, 0], b[2, 99, 76] = a[2, 99, 76], a[0, 0, 0]  # same values, other places
    if a[0, 0, 0] != a[2, 99, 76]:
        assert bench_dask.block_checksum(b) != c
    b = a.copy()
    b[1, 50, 3] ^= 1
    assert bench_dask.block_checksum(b) != c
    assert bench_dask.block_checksum(a[:, :, ::-1]) != c  # non-contiguous views are read in order
    assert bench_dask.block_checksum(np.arange(5, dtype=np.float32))[3] == 5


def test_bench_dask_tiny_cpu(bench_dask, tmp_path):
    out = tmp_path / "out"
    rc = bench_dask.main(["--size-gib", "0.05", "--cpu", "--workers", "1,2", "--repeat", "1",
                          "--block-mib", "8,auto", "--write-procs", "2", "--workdir", str(tmp_path / "work"),
                          "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "dask-0.05GiB-cpu.json").read_text())
    assert "error" not in res
    assert res["shape"] == [6, 2048, 2048] and res["device"] == "cpu"
    assert set(res["layouts"]) == {"zstd-1MiB", "blosc-lz4", "zstd-256KiB"}
    for name, rec in res["layouts"].items():
        assert rec["plain"]["backend"] == "cpu" and rec["plain"]["gib_s"] > 0, name
        assert set(rec["dask"]) == {"8 MiB", "auto"}
        small = rec["dask"]["8 MiB"]
        assert set(small["runs"]) == {"1", "2"}
        assert small["runs"]["2"]["blocks"] == 6 and small["runs"]["2"]["meta"] == "numpy.ndarray"
        assert rec["dask"]["auto"]["runs"]["1"]["blocks"] == 1  # 48 MiB < 128 MiB: one block by default
        assert rec["check"] == {**rec["check"], "blocks": 6, "mismatched": 0, "equal": True}
        assert small["scaling_2_vs_1"] > 0 and small["one_worker_vs_plain"] > 0
        assert res["volumes"][name]["ratio"] > 1
    assert len(res["clusters"]["2"]["workers"]) == 2
    md = (out / "dask-0.05GiB-cpu.md").read_text()
    assert "| zstd-1MiB" in md and "| blosc-lz4" in md and "| zstd-256KiB" in md and "all equal" in md
    assert ">= 1.9x" in md
    # the volumes are reused on a second run (complete and matching)
    # ... and past --deadline-s only the first block size is measured, once
    rc = bench_dask.main(["--size-gib", "0.05", "--cpu", "--workers", "2", "--repeat", "2", "--layouts", "zstd-1MiB",
                          "--block-mib", "auto,8", "--deadline-s", "0", "--no-check",
                          "--workdir", str(tmp_path / "work"), "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "dask-0.05GiB-cpu.json").read_text())
    assert res["volumes"]["zstd-1MiB"]["reused"] is True
    rec = res["layouts"]["zstd-1MiB"]
    assert len(rec["dask"]["auto"]["runs"]["2"]["seconds"]) == 1 and rec["dask"]["8 MiB"]["runs"] == {}
    assert len(rec["plain"]["seconds"]) == 1 and len(res["skipped_for_time"]) == 3


def _visible() -> str | None:
    import os

    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_nanny_per_gpu_fallback_sets_visible_devices(bench_dask):
    """The fallback used where dask-cuda cannot start: each worker sees its own GPU first."""
    from distributed import Client

    with bench_dask.nanny_per_gpu_cluster(2, 2) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        got = sorted(client.run(_visible).values())
    assert got == ["0,1", "1,0"]
