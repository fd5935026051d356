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
    assert _without_write_mode(["--mode", "convert", "--layouts", "sharded"]) == [
        "--layouts", "convert", "--writers", "ours-gpu,ours-cpu,tensorstore", "--layouts", "sharded"]


def test_small_write_benchmark(tmp_path, capsys):
    pytest.importorskip("tensorstore")
    out = tmp_path / "results" / "w.json"  # a folder not made yet: the bench makes it
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
    # every writer that ran has its peak extra host memory, measured the same way, and a column for it
    ran = [r for recs in res["layouts"].values() for r in recs.values() if "gib_per_s" in r]
    assert ran and all("host_peak_bytes" in r and r["host_memory"] for r in ran)
    assert "peak extra MiB, host" in out.with_suffix(".md").read_text()
    # ours' stages (what bounds a write) are kept and shown; peers have none to show
    assert {"encode", "write", "copy"} <= set(sharded["ours-cpu"]["stages"]) and "stages" not in sharded["zarr"]
    row = next(line for line in out.with_suffix(".md").read_text().splitlines() if "| sharded | ours-cpu |" in line)
    assert "x the fastest peer; stages " in row and " s |" in row


def test_peers_can_be_timed_fewer_times(tmp_path):
    res = run(size_mib=1, chunks=(1, 64, 64), layouts=["plain"], writers=["ours-cpu", "zarr"], repeat=2,
              peer_repeat=0, log=lambda s: None, workdir=str(tmp_path))
    assert len(res["layouts"]["plain"]["ours-cpu"]["times"]) == 2
    zarr_rec = res["layouts"]["plain"]["zarr"]
    assert zarr_rec["times"] == [] and zarr_rec["seconds"] > 0  # the warm-up's time


def test_run_records_a_failing_writer(monkeypatch, tmp_path):
    import gpu_zarr.bench.write as w

    def broken(*a, **k):
        return lambda p: (_ for _ in ()).throw(RuntimeError("disk on fire"))

    monkeypatch.setattr(w, "_writer", broken)
    res = run(size_mib=1, chunks=(1, 64, 64), layouts=["plain"], writers=["zarr"], repeat=1, log=lambda s: None)
    assert res["layouts"]["plain"]["zarr"] == {"error": "RuntimeError: disk on fire"}


def test_small_convert_benchmark(tmp_path, capsys):
    """``--mode convert``: an OME-Zarr 0.4 (v2, Blosc) store into sharded OME-Zarr 0.5 zstd, ours
    against TensorStore; both results read back as the same pyramid shapes and level 0 pixels."""
    pytest.importorskip("tensorstore")
    pytest.importorskip("dask")
    import numpy as np
    import zarr

    import gpu_zarr.bench.write as w

    kept = {}
    real = w._convert_writer

    def keeping(name, src, *a):  # convert once more into a folder that stays, to compare the results
        fn = real(name, src, *a)
        if not isinstance(fn, str):
            fn(tmp_path / f"kept-{name}.zarr")
            kept[name] = tmp_path / f"kept-{name}.zarr"
        return fn

    import unittest.mock

    out = tmp_path / "c.json"
    with unittest.mock.patch.object(w, "_convert_writer", keeping):
        rc = main(["bench", "--mode", "convert", "--size-mib", "2", "--chunks", "1,64,128", "--shard-mib", "1",
                   "--repeat", "1", "--convert-levels", "2", "--out", str(out), "--workdir", str(tmp_path / "wd")])
    assert rc == 0
    res = json.loads(out.read_text())
    assert list(res["layouts"]) == ["convert"] and res["convert_levels"] == 2
    recs = res["layouts"]["convert"]
    assert recs["ours-cpu"]["gib_per_s"] > 0 and recs["tensorstore"]["gib_per_s"] > 0
    assert "skipped" in recs["ours-gpu"] or recs["ours-gpu"]["gib_per_s"] > 0
    assert "x the fastest peer" in capsys.readouterr().out
    ours, theirs = (zarr.open_group(kept[n], mode="r") for n in ("ours-cpu", "tensorstore"))
    assert ours.attrs["ome"]["multiscales"][0]["datasets"][1]["path"] == "1"
    for k in ("0", "1"):
        assert ours[k].shape == theirs[k].shape and ours[k].shards == theirs[k].shards
    np.testing.assert_array_equal(ours["0"][...], theirs["0"][...])
    assert not (tmp_path / "wd" / "convert-source-v04.ome.zarr").exists()


def test_a_writer_that_stores_other_bytes_gets_no_figures(monkeypatch, tmp_path):
    """Each writer's store is read back by zarr (first, last and some planes between): a writer
    that stores other bytes than the data (stale memory, as the GPU writer once did) is recorded
    as an error, with no GiB/s."""
    import numpy as np
    import zarr

    import gpu_zarr.bench.write as w

    def stale(name, layout, data, chunks, shards, level):
        def write(p):
            z = zarr.create_array(str(p), shape=data.shape, dtype=data.dtype, chunks=chunks, fill_value=0)
            z[...] = data
            z[data.shape[0] - 1] = np.zeros(data.shape[1:], data.dtype)  # the last plane never landed
        return write

    monkeypatch.setattr(w, "_writer", stale)
    res = run(size_mib=1, chunks=(1, 64, 64), layouts=["plain"], writers=["zarr"], repeat=1, log=lambda s: None,
              workdir=str(tmp_path))
    err = res["layouts"]["plain"]["zarr"]["error"]
    assert "read back by zarr: plane" in err and "differs from the data" in err
