"""``gpu-zarr bench --mode write`` on a small volume: every writer runs or says why not."""

from __future__ import annotations

import json

import pytest

from gpu_zarr.bench.cli import _without_write_mode
from gpu_zarr.bench.write import run
from gpu_zarr.cli import main


def test_write_mode_is_routed():
    assert _without_write_mode(["--mode", "write", "--repeat", "1"]) == ["--repeat", "1"]
    assert _without_write_mode(["--mode=write"]) == []
    assert _without_write_mode(["--mode", "browse"]) is None


def test_small_write_benchmark(tmp_path, capsys):
    pytest.importorskip("tensorstore")
    out = tmp_path / "w.json"
    rc = main(["bench", "--mode", "write", "--size-mib", "4", "--chunks", "1,128,256", "--shard-mib", "1",
               "--repeat", "1", "--writers", "ours-cpu,zarr,tensorstore,ome-zarr-py", "--out", str(out),
               "--workdir", str(tmp_path / "wd")])
    assert rc == 0
    res = json.loads(out.read_text())
    sharded = res["layouts"]["sharded"]
    assert {"ours-cpu", "zarr", "tensorstore"} <= {n for n, r in sharded.items() if r.get("gib_per_s", 0) > 0}
    # same codec and level: every writer stores about the same bytes (ours within 2 % of zarr's)
    assert abs(sharded["ours-cpu"]["stored_bytes"] / sharded["zarr"]["stored_bytes"] - 1) < 0.02
    assert "ome-zarr-py does not write the sharded layout" in sharded["ome-zarr-py"]["skipped"]
    assert res["layouts"]["pyramid"]["ours-cpu"]["gib_per_s"] > 0
    assert "| sharded | ours-cpu |" in capsys.readouterr().out
    assert out.with_suffix(".md").is_file()


def test_run_records_a_failing_writer(monkeypatch, tmp_path):
    import gpu_zarr.bench.write as w

    def broken(*a, **k):
        return lambda p: (_ for _ in ()).throw(RuntimeError("disk on fire"))

    monkeypatch.setattr(w, "_writer", broken)
    res = run(size_mib=1, chunks=(1, 64, 64), layouts=["plain"], writers=["zarr"], repeat=1, log=lambda s: None)
    assert res["layouts"]["plain"]["zarr"] == {"error": "RuntimeError: disk on fire"}
