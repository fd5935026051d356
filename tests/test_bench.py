"""The benchmark harness end to end on tiny volumes, CPU device (runs in CI, no GPU)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"

THROUGHPUT_LAYOUTS = {
    "raw-v3-32MiB",
    "raw-v2-8MiB",
    "zstd-v3-32MiB",
    "zstd-v3-4MiB",
    "zstd-v3-1MiB",
    "sharded-zstd-v3-64MiB-1MiB",
}
BROWSE_LAYOUTS = {"zstd-32x256x256", "zstd-1x512x1024", "sharded-zstd-64MiB-1MiB"}


@pytest.fixture(scope="module")
def bench():
    """benchmarks/bench.py loaded by path, as ``gpu-zarr bench`` does."""
    spec = importlib.util.spec_from_file_location("_gpu_zarr_bench_under_test", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


def _run(bench, tmp_path: Path, *extra: str) -> tuple[int, Path]:
    out = tmp_path / "out"
    rc = bench.main(
        [
            "--size", "tiny", "--device", "cpu", "--repeat", "1",
            "--workdir", str(tmp_path / "work"), "--out", str(out), "--no-progress",
            *extra,
        ]
    )
    return rc, out


def test_throughput_tiny_cpu(bench, tmp_path):
    rc, out = _run(bench, tmp_path)
    assert rc == 0
    data = json.loads((out / "throughput-tiny-cpu.json").read_text())
    assert data["complete"] is True
    assert data["device"] == "cpu"
    assert data["shape"] == [16, 128, 128]
    assert {lay["name"] for lay in data["layouts"]} == THROUGHPUT_LAYOUTS
    for lay in data["layouts"]:
        assert lay["stored_bytes"] > 0
        assert set(lay["readers"]) == {"zarr-cpu", "ours-cpu", "ours-engine-cpu"}
        for name, rec in lay["readers"].items():
            assert "error" not in rec, (lay["name"], name, rec.get("error"))
            assert rec["gib_per_s"] > 0
            assert rec["median_s"] > 0
            assert len(rec["warm_s"]) == 1
            assert rec["correct"] is True, rec.get("correct_detail")
            assert rec["output_bytes"] == 16 * 128 * 128 * 2
        assert lay["ratios"]["ours-cpu"]["zarr-cpu"] > 0
        assert lay["ratios"]["ours-engine-cpu"]["zarr-cpu"] > 0
        assert lay["readers"]["ours-cpu"]["backend"] == "cpu"
        stages = lay["readers"]["ours-engine-cpu"]["stages"]
        assert stages and stages[0]["decoded_bytes"] == 16 * 128 * 128 * 2
        if lay["codec"] != "raw":
            assert 1.1 < lay["compression_ratio"] < 1.6
    assert (out / "throughput-tiny-cpu.png").stat().st_size > 0
    assert "ours-cpu / zarr-cpu" in (out / "throughput-tiny-cpu.md").read_text()


def test_throughput_reuses_volumes(bench, tmp_path):
    rc, _ = _run(bench, tmp_path, "--layouts", "zstd-v3-1MiB", "--no-cold")
    assert rc == 0
    rc, out = _run(bench, tmp_path, "--layouts", "zstd-v3-1MiB", "--no-cold")
    assert rc == 0
    data = json.loads((out / "throughput-tiny-cpu.json").read_text())
    (lay,) = data["layouts"]
    assert lay["reused"] is True
    assert data["cold"]["measured"] is False


def test_browse_tiny_cpu(bench, tmp_path):
    rc, out = _run(bench, tmp_path, "--mode", "browse", "--planes", "5")
    assert rc == 0
    data = json.loads((out / "browse-tiny-cpu.json").read_text())
    assert data["complete"] is True
    assert {lay["name"] for lay in data["layouts"]} == BROWSE_LAYOUTS
    for lay in data["layouts"]:
        assert len(lay["planes"]) == 5
        readers = lay["readers"]
        assert {
            "zarr-cpu", "ours-lazy-cpu", "ours-engine-cpu", "ours-resident-cpu", "dask-zarr"
        } <= set(readers)
        for name, rec in readers.items():
            if "skipped" in rec:
                assert name == "dask-zarr"
                continue
            assert "error" not in rec, (lay["name"], name, rec.get("error"))
            assert 0 < rec["p50_ms"] <= rec["p95_ms"]
            assert rec["correct"] is True, rec.get("correct_detail")
        assert readers["ours-resident-cpu"]["load_s"] > 0
    assert (out / "browse-tiny-cpu.png").stat().st_size > 0


def test_volume_data_is_deterministic_and_scaled():
    sys.path.insert(0, str(BENCH.parent))
    try:
        import bench_volumes as bv
    finally:
        sys.path.remove(str(BENCH.parent))
    shape = (16, 128, 128)
    whole = bv.make_slab(shape, 0, 16)
    parts = np.concatenate([bv.make_slab(shape, 0, 5), bv.make_slab(shape, 5, 16)])
    assert np.array_equal(whole, parts)
    full = bv.THROUGHPUT_SHAPES["full"]
    assert [lay.chunk_bytes for lay in bv.THROUGHPUT_LAYOUTS] == [
        32 << 20, 8 << 20, 32 << 20, 4 << 20, 1 << 20, 1 << 20
    ]
    assert bv.THROUGHPUT_LAYOUTS[-1].shard_bytes == 64 << 20
    for lay in bv.scaled_layouts(bv.THROUGHPUT_LAYOUTS, full, shape):
        if lay.shards is not None:
            assert all(s % c == 0 for s, c in zip(lay.shards, lay.chunks))
    with pytest.raises(ValueError):
        bv.parse_shape("huge", bv.THROUGHPUT_SHAPES)
    assert bv.parse_shape("4,8,8", bv.THROUGHPUT_SHAPES) == (4, 8, 8)


def test_list_and_bad_arguments(bench, capsys):
    assert bench.main(["--list", "--size", "tiny"]) == 0
    text = capsys.readouterr().out
    assert "sharded-zstd-v3-64MiB-1MiB" in text and "kvikio-gds" in text
    with pytest.raises(SystemExit):
        bench.main(["--size", "tiny", "--device", "cpu", "--layouts", "nope"])
