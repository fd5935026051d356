"""The benchmark harness end to end on tiny volumes, CPU device (runs in CI, no GPU)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from gpu_zarr.bench import BenchResult, run
from gpu_zarr.bench import cli as bench_cli
from gpu_zarr.bench import volumes as bv
from gpu_zarr.bench.browse import index_of, plane_patterns, time_planes
from gpu_zarr.bench.readers import fingerprint

CHAIN_LAYOUTS = ("sharded-zstd-crc32c-v3", "numcodecs-zstd-v3-1MiB", "delta-zstd-v2", "shuffle-lz4-v2",
                 "blosc-lz4-shuffle-big-endian-v2", "sharded-zstd-64KiB-v3")
THROUGHPUT_LAYOUTS = {
    "raw-v3-32MiB",
    "raw-v2-8MiB",
    "zstd-v3-32MiB",
    "zstd-v3-4MiB",
    "zstd-v3-1MiB",
    "sharded-zstd-v3-64MiB-1MiB",
    "blosc-lz4-shuffle-v2",
    "blosc-zstd-bitshuffle-v2",
    "sharded-blosc-zstd-v3",
    "gzip-v2",
    "gzip-u8-64x64x64-v2",
    "blosc-zstd-u8-64x64x64-v3",
    "blosc-lz4-1x256x256-v2",
    *CHAIN_LAYOUTS,
}
SMALL_CHUNK_LAYOUTS = ("gzip-u8-64x64x64-v2", "blosc-zstd-u8-64x64x64-v3", "blosc-lz4-1x256x256-v2")
BROWSE_LAYOUTS = {
    "zstd-32x256x256",
    "zstd-1x512x1024",
    "sharded-zstd-64MiB-1MiB",
    "blosc-lz4-shuffle-v2",
    "blosc-zstd-bitshuffle-v2",
    "sharded-blosc-zstd-v3",
    "gzip-v2",
    *SMALL_CHUNK_LAYOUTS,
    *CHAIN_LAYOUTS,
}
# the chain layouts some peers cannot read (TensorStore: numcodecs.* names, v2 filters and v2 lz4; zarrs:
# big-endian)
PEER_CANNOT = {("tensorstore", "numcodecs-zstd-v3-1MiB"), ("tensorstore", "delta-zstd-v2"), ("tensorstore", "shuffle-lz4-v2"),
               ("zarrs", "blosc-lz4-shuffle-big-endian-v2")}
HAVE_TS = bool(__import__("importlib").util.find_spec("tensorstore"))
HAVE_ZARRS = bool(__import__("importlib").util.find_spec("zarrs"))


def _ok(rec: dict) -> bool:
    """A reader that ran and was right, or that declined the array (our engine, said why)."""
    return "declined" in rec or ("error" not in rec and rec.get("correct") is True)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bench-work")


def _run(workdir: Path, out: Path, *extra: str) -> int:
    return bench_cli.main(
        ["--size", "tiny", "--device", "cpu", "--repeat", "1", "--workdir", str(workdir),
         "--out", str(out), "--no-progress", *extra]
    )


def test_throughput_tiny_cpu(workdir, tmp_path):
    out = tmp_path / "out"
    rc = _run(workdir, out)
    data = json.loads((out / "throughput-tiny-cpu.json").read_text())
    assert rc == 0, data
    assert data["complete"] is True
    assert data["device"] == "cpu"
    assert data["shape"] == [16, 128, 128]
    assert {lay["name"] for lay in data["layouts"]} == THROUGHPUT_LAYOUTS
    for lay in data["layouts"]:
        assert lay["stored_bytes"] > 0
        readers = lay["readers"]
        assert {"zarr-cpu", "ours-cpu", "ours-engine-cpu", "tensorstore", "czarr"} <= set(readers)
        for name, rec in readers.items():
            if "skipped" in rec:
                assert name in ("czarr", "tensorstore", "zarrs", "zarr-fused"), (name, rec)
                continue
            if (name, lay["name"]) in PEER_CANNOT:  # the peer says why it cannot; ours read it
                assert "error" in rec, (lay["name"], name, rec)
                continue
            assert _ok(rec), (lay["name"], name, rec)
            if "declined" in rec:
                assert name == "ours-engine-cpu" and lay["codec"].split("-")[0] in ("blosc", "gzip")
                continue
            assert rec["gib_per_s"] > 0 and rec["median_s"] > 0
            assert len(rec["warm_s"]) == 1
            assert rec["output_bytes"] == lay["nbytes"] == 16 * 128 * 128 * np.dtype(lay["dtype"]).itemsize
        assert readers["ours-cpu"]["correct"] is True  # every layout, read equal to zarr's CPU read
        assert lay["ratios"]["ours-cpu"]["zarr-cpu"] > 0
        assert readers["ours-cpu"]["backend"] == "cpu"
        if lay["codec"] != "raw":
            assert 1.1 < lay["compression_ratio"] < 2.0, lay
        if "stages" in readers["ours-engine-cpu"]:
            eng = readers["ours-engine-cpu"]
            assert eng["stages"][0]["decoded_bytes"] == lay["nbytes"]
            assert eng["bound_by"] in eng["stages_ms"] and eng["engine_total_ms"] > 0
        if HAVE_TS and ("tensorstore", lay["name"]) not in PEER_CANNOT:
            assert readers["tensorstore"]["correct"] is True
        if HAVE_ZARRS and ("zarrs", lay["name"]) not in PEER_CANNOT:
            assert readers["zarrs"]["correct"] is True
    md = (out / "throughput-tiny-cpu.md").read_text()
    assert "ours-cpu / zarr-cpu" in md and "Cold page cache" in md
    png = (out / "throughput-tiny-cpu.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_cold_cache_against_the_disk_rate(workdir, tmp_path):
    out = tmp_path / "out"
    rc = _run(workdir, out, "--cold", "--layouts", "raw-v3-32MiB,zstd-v3-1MiB", "--readers", "zarr-cpu,ours-cpu")
    data = json.loads((out / "throughput-tiny-cpu.json").read_text())
    assert rc == 0, data
    # cold: the cache was dropped (or why not is said) once per layout, the disk rate measured once
    cold = data["cold"]
    assert cold["requested"] is True and cold["reader"] == "ours-cpu"
    disk = cold["disk"]
    assert disk.get("gib_per_s", 0) > 0 or disk.get("error"), disk
    for lay in data["layouts"]:
        rec = lay["readers"]["ours-cpu"]
        assert ("cold_gib_per_s" in rec) != ("cold_error" in rec), rec
        if "cold_gib_per_s" in rec and disk.get("gib_per_s"):
            assert rec["cold_limit_gib_per_s"] == pytest.approx(disk["gib_per_s"] * lay["compression_ratio"],
                                                                rel=1e-3)
    assert "Cold page cache: one read of `ours-cpu`" in (out / "throughput-tiny-cpu.md").read_text()


def test_volumes_reused_and_equal_to_the_generator(workdir, tmp_path):
    rc = _run(workdir, tmp_path / "a", "--layouts", "zstd-v3-1MiB,blosc-lz4-shuffle-v2")
    assert rc == 0
    rc = _run(workdir, tmp_path / "b", "--layouts", "zstd-v3-1MiB,blosc-lz4-shuffle-v2")
    assert rc == 0
    data = json.loads((tmp_path / "b" / "throughput-tiny-cpu.json").read_text())
    assert [lay["reused"] for lay in data["layouts"]] == [True, True]
    assert data["cold"]["requested"] is False
    shape = (16, 128, 128)
    want = {dt: bv.make_slab(shape, 0, 16, dtype=dt) for dt in ("uint16", "uint8")}
    for lay in bv.scaled_layouts(bv.THROUGHPUT_LAYOUTS, bv.THROUGHPUT_SHAPES["full"], shape):
        path = workdir / "throughput" / "16x128x128" / f"{lay.name}.zarr"
        arr = zarr.open_array(str(path), mode="r")
        assert arr.metadata.zarr_format == lay.zarr_format
        assert arr.dtype == lay.np_dtype
        assert np.array_equal(arr[...], want[lay.dtype]), lay.name  # every layout written and read equal


def test_layout_metadata_is_what_the_writers_write(workdir):
    base = workdir / "throughput" / "16x128x128"
    meta = json.loads((base / "blosc-lz4-shuffle-v2.zarr" / ".zarray").read_text())
    assert meta["compressor"]["id"] == "blosc" and meta["compressor"]["cname"] == "lz4"
    assert meta["compressor"]["shuffle"] == 1 and meta["compressor"]["clevel"] == 5
    meta = json.loads((base / "blosc-zstd-bitshuffle-v2.zarr" / ".zarray").read_text())
    assert meta["compressor"]["cname"] == "zstd" and meta["compressor"]["shuffle"] == 2
    meta = json.loads((base / "gzip-v2.zarr" / ".zarray").read_text())
    assert meta["compressor"]["id"] == "gzip"
    meta = json.loads((base / "sharded-blosc-zstd-v3.zarr" / "zarr.json").read_text())
    (shard,) = [c for c in meta["codecs"] if c["name"] == "sharding_indexed"]
    inner = [c["name"] for c in shard["configuration"]["codecs"]]
    assert inner == ["bytes", "blosc"]
    assert shard["configuration"]["codecs"][1]["configuration"]["cname"] == "zstd"


def test_browse_tiny_cpu_both_patterns(workdir, tmp_path):
    out = tmp_path / "out"
    rc = _run(workdir, out, "--mode", "browse", "--planes", "4")
    data = json.loads((out / "browse-tiny-cpu.json").read_text())
    assert rc == 0, data
    assert data["complete"] is True
    assert {lay["name"] for lay in data["layouts"]} == BROWSE_LAYOUTS
    for lay in data["layouts"]:
        assert len(lay["patterns"]["random"]) == 4
        scroll = [z for (z,) in lay["patterns"]["scroll"]]
        assert len(scroll) == 7 and scroll == sorted(scroll[:4]) + sorted(scroll[:3], reverse=True)
        assert all(b - a == 1 for a, b in zip(scroll[:3], scroll[1:4], strict=True))
        readers = lay["readers"]
        assert {"zarr-cpu", "ours-lazy-cpu", "ours-engine-cpu", "ours-resident-cpu", "tensorstore",
                "zarrs", "dask-zarr", "czarr"} <= set(readers)
        for name, rec in readers.items():
            if "skipped" in rec:
                assert name in ("dask-zarr", "czarr", "tensorstore", "zarrs", "zarr-fused")
                continue
            if (name, lay["name"]) in PEER_CANNOT:
                assert "error" in rec, (lay["name"], name, rec)
                continue
            assert _ok(rec), (lay["name"], name, rec)
            if "declined" in rec:
                continue
            for pat in ("random", "scroll"):
                pr = rec["patterns"][pat]
                assert 0 < pr["p50_ms"] <= pr["p95_ms"], (name, pat, pr)
            assert len(rec["patterns"]["scroll"]["ms"]) == 6 and rec["patterns"]["scroll"]["first_ms"] > 0
        assert readers["ours-lazy-cpu"]["correct"] is True
        assert readers["ours-resident-cpu"]["load_s"] > 0
        for pat in ("random", "scroll"):  # which engine stage bounds each of our figures
            pr = readers["ours-lazy-cpu"]["patterns"][pat]
            assert pr["bound_by"] in pr["stages_ms"] and pr["engine_reads"] >= 1, pr
        assert "stages_ms" not in readers["ours-resident-cpu"]["patterns"]["random"]
    md = (out / "browse-tiny-cpu.md").read_text()
    assert "| zstd-1x512x1024 | scroll |" in md and "| gzip-v2 | random |" in md
    assert "| blosc-lz4-1x256x256-v2 | scroll |" in md and "| gzip-u8-64x64x64-v2 | random |" in md
    assert "Where our time goes" in md and "| zstd-1x512x1024 | random | ours-lazy-cpu |" in md
    assert (out / "browse-tiny-cpu.png").read_bytes()[:4] == b"\x89PNG"


def _tree_digest(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() + str(p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*")) if p.is_file()
    }


@pytest.fixture
def user_store(tmp_path) -> Path:
    """A zarr-python 2-style store (v2, Blosc lz4) the user owns."""
    import numcodecs

    path = tmp_path / "mine.zarr"
    a = zarr.create_array(store=str(path), shape=(6, 40, 72), chunks=(2, 16, 32), dtype="uint16",
                          zarr_format=2, compressors=numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1))
    a[:] = bv.make_slab((6, 40, 72), 0, 6, seed=3)
    return path


def test_user_store_throughput_and_no_writes(user_store, tmp_path, capsys):
    before = _tree_digest(user_store)
    rc = bench_cli.main([str(user_store), "--device", "cpu", "--repeat", "2", "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "ours-cpu / zarr-cpu" in text and "mine.zarr" in text
    assert _tree_digest(user_store) == before  # nothing written into the user's store
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.zarr"]  # nor beside it

    res = run(user_store, device="cpu", repeat=1, out=tmp_path / "res")
    assert isinstance(res, BenchResult) and not res.failed
    (lay,) = res.data["layouts"]
    assert lay["shape"] == [6, 40, 72] and lay["zarr_format"] == 2 and "blosc" in lay["codec"]
    assert lay["readers"]["ours-cpu"]["correct"] is True
    assert lay["readers"]["zarr-cpu"]["gib_per_s"] > 0
    assert sorted(res.files) == ["json", "md", "png"]
    assert json.loads(res.files["json"].read_text())["store"] == str(user_store)
    assert _tree_digest(user_store) == before
    with pytest.raises(ValueError, match="inside the store"):
        run(user_store, device="cpu", repeat=1, out=user_store / "results")
    assert _tree_digest(user_store) == before


def test_user_store_ome_level_browse(tmp_path):
    from gpu_zarr.sample import write_sample_omezarr

    path = Path(write_sample_omezarr(str(tmp_path / "img.ome.zarr")))
    before = _tree_digest(path)
    res = run(path, level=1, mode="browse", device="cpu", planes=3, readers=["zarr-cpu", "ours-lazy-cpu"])
    (lay,) = res.data["layouts"]
    assert lay["ome_level"] == 1
    arr = zarr.open_group(str(path), mode="r")
    assert lay["readers"]["ours-lazy-cpu"]["correct"] is True
    assert len(lay["shape"]) == arr[next(iter(arr.array_keys()))].ndim
    assert all(len(i) == len(lay["shape"]) - 2 for i in lay["patterns"]["random"])
    assert _tree_digest(path) == before


def test_user_store_bad_path_is_a_clear_error(tmp_path, capsys):
    rc = bench_cli.main([str(tmp_path / "nope.zarr"), "--device", "cpu", "--no-progress"])
    assert rc == 2
    assert "does not exist" in capsys.readouterr().err


def test_repr_html_has_table_and_png(user_store):
    res = run(user_store, device="cpu", repeat=1, readers=["zarr-cpu", "ours-cpu"])
    html = res._repr_html_()
    assert "<table>" in html and "<th>ours-cpu / zarr-cpu</th>" in html
    assert 'src="data:image/png;base64,' in html
    import base64

    b64 = html.split('src="data:image/png;base64,')[1].split('"')[0]
    assert base64.b64decode(b64)[:4] == b"\x89PNG"
    assert "throughput" in repr(res) and "ok" in repr(res)


def test_repr_html_without_matplotlib(user_store, monkeypatch):
    res = run(user_store, device="cpu", repeat=1, readers=["zarr-cpu", "ours-cpu"])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    html = res._repr_html_()
    assert "<table>" in html and "data:image/png" not in html and "no chart" in html


def _fake_czarr(root: Path, body: str) -> None:
    (root / "czarr").mkdir(parents=True)
    (root / "czarr" / "__init__.py").write_text(body)


def test_czarr_failure_is_recorded_not_fatal(user_store, tmp_path, monkeypatch):
    fake = tmp_path / "fake"
    _fake_czarr(fake, "raise RuntimeError('czarr needs a GPU: no CUDA device here')\n")
    monkeypatch.syspath_prepend(str(fake))
    monkeypatch.setenv("PYTHONPATH", str(fake) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = run(user_store, device="cpu", repeat=1, readers=["zarr-cpu", "ours-cpu", "czarr"])
    rec = res.data["layouts"][0]["readers"]["czarr"]
    assert "czarr needs a GPU" in rec["error"] and rec["error"].startswith("import czarr")
    assert not res.failed  # a peer's failure is its record, not ours
    assert "czarr on mine.zarr: import czarr: RuntimeError: czarr needs a GPU" in res.markdown
    res = run(user_store, mode="browse", device="cpu", planes=2, readers=["zarr-cpu", "czarr"])
    assert "czarr needs a GPU" in res.data["layouts"][0]["readers"]["czarr"]["error"]


def test_tensorstore_missing_is_skipped_with_reason(user_store, monkeypatch):
    import importlib.util as iu

    real = iu.find_spec
    monkeypatch.setattr(iu, "find_spec", lambda name, *a: None if name == "tensorstore" else real(name, *a))
    res = run(user_store, device="cpu", repeat=1, readers=["zarr-cpu", "tensorstore"])
    rec = res.data["layouts"][0]["readers"]["tensorstore"]
    assert "tensorstore is not installed" in rec["skipped"] and "pip install" in rec["skipped"]


@pytest.mark.skipif(not HAVE_TS, reason="tensorstore is not installed")
def test_tensorstore_reads_every_layout_equal(workdir):
    from gpu_zarr.bench.readers import throughput_readers

    (ts_reader,) = [r for r in throughput_readers("cpu") if r.name == "tensorstore"]
    base = workdir / "throughput" / "16x128x128"
    want = {dt: bv.make_slab((16, 128, 128), 0, 16, dtype=dt) for dt in ("uint16", "uint8")}
    for path in sorted(base.iterdir()):
        if ("tensorstore", path.name.removesuffix(".zarr")) in PEER_CANNOT:
            continue
        dtype = zarr.open_array(str(path), mode="r").dtype.name
        assert np.array_equal(ts_reader.read(str(path)), want[dtype]), path.name


def test_fingerprint_sees_moves_and_changes():
    a = np.arange(1000, dtype=np.uint16).reshape(10, 100)
    b = a.copy()
    b[[0, 1]] = b[[1, 0]]  # same values, moved
    c = a.copy()
    c[5, 5] += 1
    assert fingerprint(a) == fingerprint(a.copy())
    assert fingerprint(a) != fingerprint(b) and fingerprint(a) != fingerprint(c)
    assert fingerprint(a, block=7) == fingerprint(a)


def test_plane_patterns():
    warm, pats = plane_patterns((20, 8, 8), 5, seed=1)
    assert len(pats["random"]) == 5 and len(warm) == 1
    fwd = [i[0] for i in pats["scroll"][:5]]
    assert fwd == list(range(fwd[0], fwd[0] + 5))
    assert [i[0] for i in pats["scroll"][5:]] == fwd[-2::-1]
    _, pats = plane_patterns((2, 3, 8, 8), 10, seed=0)  # 6 planes over two leading axes
    assert len(pats["scroll"]) == 11 and {len(i) for i in pats["scroll"]} == {2}
    with pytest.raises(ValueError, match="unknown browse pattern"):
        plane_patterns((4, 8, 8), 2, 0, ("zigzag",))
    # tiles: random positions of random planes, clipped to the plane when it is smaller
    _, pats = plane_patterns((20, 100, 90), 50, seed=2, patterns=("tile",), tile=32)
    assert len(pats["tile"]) == 50 and len({k[0] for k in pats["tile"]}) > 5
    for z, (y0, y1), (x0, x1) in pats["tile"]:
        assert 0 <= z < 20 and y1 - y0 == 32 and x1 - x0 == 32 and y1 <= 100 and x1 <= 90
    assert len({(k[1][0], k[2][0]) for k in pats["tile"]}) > 40
    _, pats = plane_patterns((3, 40, 2000), 4, seed=0, patterns=("tile",))
    assert {(k[1], k[2][1] - k[2][0]) for k in pats["tile"]} == {((0, 40), 1024)}
    assert index_of((2, (0, 40), (5, 1029))) == (2, slice(0, 40), slice(5, 1029))
    # the other patterns draw the same keys whether or not tiles come after them
    assert plane_patterns((20, 8, 8), 5, 1)[1]["random"] == plane_patterns(
        (20, 8, 8), 5, 1, ("random", "scroll", "tile"))[1]["random"]


def test_volume_data_is_deterministic_and_scaled():
    shape = (16, 128, 128)
    whole = bv.make_slab(shape, 0, 16)
    parts = np.concatenate([bv.make_slab(shape, 0, 5), bv.make_slab(shape, 5, 16)])
    assert np.array_equal(whole, parts)
    full = bv.THROUGHPUT_SHAPES["full"]
    assert [lay.chunk_bytes for lay in bv.THROUGHPUT_LAYOUTS] == [
        32 << 20, 8 << 20, 32 << 20, 4 << 20, 1 << 20, 1 << 20, 2 << 20, 2 << 20, 1 << 20, 2 << 20,
        256 << 10, 256 << 10, 128 << 10,
        1 << 20, 1 << 20, 2 << 20, 2 << 20, 2 << 20, 64 << 10,  # the chain layouts
    ]
    # small chunks are kept at every size, only clipped to the array
    small = {lay.name: lay for lay in bv.scaled_layouts(bv.BROWSE_LAYOUTS, bv.BROWSE_SHAPES["full"], shape)}
    assert small["gzip-u8-64x64x64-v2"].chunks == (16, 64, 64)
    assert small["blosc-lz4-1x256x256-v2"].chunks == (1, 128, 128)
    small = {lay.name: lay for lay in bv.scaled_layouts(bv.BROWSE_LAYOUTS, bv.BROWSE_SHAPES["full"], (64, 1024, 512))}
    assert small["blosc-zstd-u8-64x64x64-v3"].chunks == (64, 64, 64)
    assert small["blosc-lz4-1x256x256-v2"].chunks == (1, 256, 256)
    assert small["zstd-32x256x256"].chunks == (8, 256, 64)  # the others scale as before
    u8 = bv.make_slab(shape, 3, 5, dtype="uint8")
    assert u8.dtype == np.uint8 and np.array_equal(u8, bv.make_slab(shape, 3, 5) >> 4)
    with pytest.raises(ValueError, match="dtype"):
        bv.Layout("x", "x", 3, (1, 1, 1), "raw", dtype="float32")
    assert bv.THROUGHPUT_LAYOUTS[5].shard_bytes == 64 << 20
    for lay in bv.scaled_layouts(bv.THROUGHPUT_LAYOUTS, full, shape):
        if lay.shards is not None:
            assert all(s % c == 0 for s, c in zip(lay.shards, lay.chunks, strict=True))
    with pytest.raises(ValueError):
        bv.parse_shape("huge", bv.THROUGHPUT_SHAPES)
    assert bv.parse_shape("4,8,8", bv.THROUGHPUT_SHAPES) == (4, 8, 8)
    with pytest.raises(ValueError, match="codec"):
        bv.Layout("x", "x", 3, (1, 1, 1), "snappy")


def test_list_and_bad_arguments(capsys):
    assert bench_cli.main(["--list", "--size", "tiny"]) == 0
    text = capsys.readouterr().out
    for name in ("sharded-zstd-v3-64MiB-1MiB", "kvikio-gds", "tensorstore+cupy", "czarr", "gzip-v2"):
        assert name in text
    assert bench_cli.main(["--size", "tiny", "--device", "cpu", "--layouts", "nope"]) == 2
    assert "unknown layout" in capsys.readouterr().err
    assert bench_cli.main(["--size", "tiny", "--device", "cpu", "--readers", "nope"]) == 2


def test_gpu_zarr_bench_help_and_module_entry():
    for cmd in ([sys.executable, "-m", "gpu_zarr.cli", "bench", "--help"],
                [sys.executable, "-m", "gpu_zarr.bench", "--help"]):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "--cold" in out.stdout and "--level" in out.stdout and "path" in out.stdout
        assert "--remote" in out.stdout


def test_no_sys_path_hacks_and_light_import():
    src = Path(__file__).resolve().parents[1] / "src" / "gpu_zarr"
    for p in list(src.rglob("*.py")):
        assert "sys.path.insert" not in p.read_text(), p
    bench_dir = Path(__file__).resolve().parents[1] / "benchmarks"
    for p in bench_dir.glob("*.py"):
        assert "sys.path.insert" not in p.read_text(), p
    code = ("import sys, gpu_zarr.bench, gpu_zarr.bench.cli; "
            "bad=[m for m in ('cupy','kvikio','tensorstore','czarr','matplotlib','dask') if m in sys.modules]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_gpu_mode_harness_with_stand_ins(tmp_path):
    """GPU-mode bookkeeping (device reference, fingerprints, czarr's child, --cold) with
    numpy-backed stand-ins for cupy and czarr (tests/fake_gpu), in a subprocess."""
    fake = Path(__file__).resolve().parent / "fake_gpu"
    src = Path(__file__).resolve().parents[1] / "src"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), str(src), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "gpu_zarr.bench", "--size", "tiny", "--device", "gpu", "--repeat", "2",
           "--peer-repeat", "1", "--workdir", str(tmp_path / "w"), "--out", str(tmp_path / "o"), "--no-progress",
           "--layouts", "zstd-v3-1MiB,blosc-lz4-shuffle-v2", "--readers", "zarr-cpu+cupy,tensorstore+cupy,czarr"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads((tmp_path / "o" / "throughput-tiny-gpu.json").read_text())
    assert data["device"] == "gpu" and data["peer_repeat"] == 1
    for lay in data["layouts"]:
        recs = lay["readers"]
        assert recs["zarr-cpu+cupy"]["correct_detail"] == "is the reference"
        assert recs["czarr"]["correct"] is True, recs["czarr"]
        assert recs["czarr"]["correct_detail"].startswith("fingerprint equals")
        assert len(recs["czarr"]["warm_s"]) == 1
        if HAVE_TS:
            assert recs["tensorstore+cupy"]["correct"] is True
    browse = [sys.executable, "-m", "gpu_zarr.bench", "--mode", "browse", "--size", "tiny", "--device", "gpu",
              "--planes", "3", "--workdir", str(tmp_path / "w"), "--out", str(tmp_path / "o"), "--no-progress",
              "--layouts", "zstd-1x512x1024,blosc-lz4-shuffle-v2", "--readers", "zarr-cpu,czarr"]
    out = subprocess.run(browse, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads((tmp_path / "o" / "browse-tiny-gpu.json").read_text())
    for lay in data["layouts"]:
        assert lay["readers"]["czarr"]["correct"] is True, lay["readers"]["czarr"]


def test_cold_drop_falls_back_to_the_arrays_files(user_store, monkeypatch):
    from gpu_zarr.bench import env

    monkeypatch.setattr(env, "_drop_system", lambda: (False, "writing /proc/sys/vm/drop_caches: not permitted"))
    cache = env.ColdCache()
    done, how = cache.drop(user_store)
    assert done and "posix_fadvise" in how and "not permitted" in how
    disk = cache.measure_disk(user_store)
    assert disk["gib_per_s"] > 0 and disk["files"] == len(env.store_files(user_store))
    monkeypatch.setattr(env, "_drop_files", lambda path: (False, "posix_fadvise(DONTNEED) failed: EPERM"))
    done, why = env.ColdCache().drop(user_store)
    assert not done and "not permitted" in why and "EPERM" in why


def test_small_chunk_layouts_written_and_read_equal(tmp_path):
    """The 64^3 uint8 (gzip v2, Blosc zstd v3) and 256x256 uint16 (Blosc lz4 v2) volumes: what
    the writers write, equal to the generator, and read equal by ours and zarr."""
    from gpu_zarr.zarr_io import read_zarr

    shape = (8, 96, 160)  # several chunks per axis; 64^3 clipped to 8x64x64, edge chunks partial
    lays = bv.scaled_layouts(bv.SMALL_CHUNK_LAYOUTS, bv.BROWSE_SHAPES["full"], shape)
    vols = bv.ensure_volumes(tmp_path, "browse", lays, shape, log=lambda _m: None)
    assert [v.name for v in vols] == list(SMALL_CHUNK_LAYOUTS)
    for v in vols:
        lay = v.layout
        assert lay is not None and v.dtype == lay.dtype and not v.reused
        arr = zarr.open_array(str(v.path), mode="r")
        assert arr.dtype == np.dtype(lay.dtype) and arr.chunks == lay.chunks
        want = bv.make_slab(shape, 0, shape[0], dtype=lay.dtype)
        assert np.array_equal(arr[...], want), v.name
        assert np.array_equal(read_zarr(v.path, prefer="cpu").data, want), v.name
        assert 1.1 < v.ratio < 2.0, (v.name, v.ratio)
    assert vols[0].to_json()["chunks"] == [8, 64, 64] and vols[0].to_json()["chunk_bytes"] == 8 * 64 * 64
    meta = json.loads((vols[0].path / ".zarray").read_text())
    assert meta["compressor"]["id"] == "gzip" and meta["dtype"] == "|u1"
    meta = json.loads((vols[1].path / "zarr.json").read_text())
    blosc = [c for c in meta["codecs"] if c["name"] == "blosc"]
    assert meta["data_type"] == "uint8" and blosc[0]["configuration"]["cname"] == "zstd"
    meta = json.loads((vols[2].path / ".zarray").read_text())
    assert meta["chunks"] == [1, 96, 160]  # 1x256x256 clipped to the plane
    assert meta["compressor"]["cname"] == "lz4" and meta["dtype"] == "<u2"
    again = bv.ensure_volumes(tmp_path, "browse", lays, shape, log=lambda _m: None)
    assert all(v.reused for v in again)


def test_tile_pattern_with_every_cpu_plane_reader(tmp_path):
    """Tiles smaller than the plane, through every CPU plane reader (zarrs and TensorStore
    when installed, skipped with the reason when not), equal to zarr's read."""
    from gpu_zarr.bench.readers import browse_readers

    shape = (8, 96, 160)
    lays = bv.scaled_layouts(bv.SMALL_CHUNK_LAYOUTS, bv.BROWSE_SHAPES["full"], shape)
    vols = bv.ensure_volumes(tmp_path, "browse", lays, shape, log=lambda _m: None)
    for v in vols:
        rec = time_planes(v, browse_readers("cpu"), planes=3, seed=1, log=lambda _m: None, advance=lambda: None,
                          patterns=("tile", "random"), tile=48)
        assert rec["tile_shape"] == [48, 48]
        assert all(k[1][1] - k[1][0] == 48 and k[2][1] - k[2][0] == 48 for k in rec["patterns"]["tile"])
        readers = rec["readers"]
        for name, r in readers.items():
            if "skipped" in r:
                assert name in ("czarr", "dask-zarr", "tensorstore", "zarrs"), (name, r)
                assert "not installed" in r["skipped"]
                continue
            assert _ok(r), (v.name, name, r)
            pr = r["patterns"]["tile"]
            assert 0 < pr["p50_ms"] <= pr["p95_ms"] and len(pr["ms"]) == 3
            assert pr["gib_per_s_p50"] == pytest.approx(48 * 48 * np.dtype(v.dtype).itemsize / pr["p50_ms"] * 1e3
                                                        / 2**30)
        assert readers["ours-lazy-cpu"]["correct"] is True
        assert readers["ours-lazy-cpu"]["patterns"]["tile"]["bound_by"]
        assert ("skipped" in readers["zarrs"]) != HAVE_ZARRS
        assert ("skipped" in readers["tensorstore"]) != HAVE_TS
        if HAVE_ZARRS:
            assert readers["zarrs"]["correct"] is True
            assert readers["zarrs"]["codec_pipeline"] == "zarrs.ZarrsCodecPipeline"
        if HAVE_TS:
            assert readers["tensorstore"]["correct"] is True


def test_zarrs_missing_is_skipped_with_reason(user_store, monkeypatch):
    import importlib.util as iu

    real = iu.find_spec
    monkeypatch.setattr(iu, "find_spec", lambda name, *a: None if name == "zarrs" else real(name, *a))
    res = run(user_store, mode="browse", device="cpu", planes=2, readers=["zarr-cpu", "zarrs"])
    rec = res.data["layouts"][0]["readers"]["zarrs"]
    assert "zarrs is not installed" in rec["skipped"] and "pip install zarrs" in rec["skipped"]
    assert not res.failed


def test_browse_tile_pattern_end_to_end(workdir, tmp_path):
    out = tmp_path / "out"
    rc = _run(workdir, out, "--mode", "browse", "--planes", "3", "--patterns", "tile,random",
              "--layouts", ",".join(SMALL_CHUNK_LAYOUTS), "--readers", "zarr-cpu,ours-lazy-cpu,tensorstore,zarrs")
    data = json.loads((out / "browse-tiny-cpu.json").read_text())
    assert rc == 0, data
    assert data["browse_patterns"] == ["tile", "random"] and data["dtype"] == "uint8+uint16"
    for lay in data["layouts"]:
        assert lay["tile_shape"] == [128, 128]  # clipped to the tiny plane
        for name, r in lay["readers"].items():
            assert "skipped" in r or _ok(r), (lay["name"], name, r)
    md = (out / "browse-tiny-cpu.md").read_text()
    assert "`tile` over 3 random 128x128 tiles" in md and "| blosc-lz4-1x256x256-v2 | tile |" in md


def test_stage_summary_names_the_bound_and_what_the_engine_does_not_time():
    from gpu_zarr.bench.browse import stage_summary
    from gpu_zarr.bench.report import stages_markdown

    # the CPU path: sequential stages; the rest of the total is `untimed` (e.g. cached chunks placed)
    cached = [{"plan_s": 0.001, "locate_s": 0.004, "alloc_s": 0.0, "fused_s": 0.001, "total_s": t,
               "cache_hits": 1024} for t in (0.017, 0.018, 0.030)]
    st = stage_summary(cached)
    assert st["engine_reads"] == 3 and st["engine_total_ms"] == pytest.approx(18.0)
    assert st["stages_ms"]["untimed"] == pytest.approx(12.0) and st["bound_by"] == "untimed"
    assert st["cache_hits_median"] == 1024
    # the fused executor bounds a plane read from disk
    fused = stage_summary([{"plan_s": 0.0, "locate_s": 0.001, "fused_s": 0.010, "total_s": 0.012}])
    assert fused["bound_by"] == "fused" and fused["stages_ms"]["untimed"] == pytest.approx(1.0)
    # the pipelined (GPU) path: stages overlap, no `untimed`
    piped = stage_summary([{"setup_s": 0.001, "read_s": 0.040, "wait_read_s": 0.002, "decode_s": 0.005,
                            "total_s": 0.030}])
    assert "untimed" not in piped["stages_ms"] and piped["bound_by"] == "read"
    assert stage_summary([]) == {}
    md = stages_markdown({"mode": "browse", "layouts": [{"name": "L", "readers": {
        "ours-lazy-cpu": {"kind": "ours", "patterns": {"random": {"p50_ms": 19.0, **st}}},
        "zarr-cpu": {"kind": "peer", "patterns": {"random": {"p50_ms": 9.0}}}}}]})
    assert "| L | random | ours-lazy-cpu | 19.00 | 18.00 | untimed | untimed 12.00, locate 4.00" in md
    assert "zarr-cpu" not in md
