"""The host floor and ours: native threads vs Python threads, and small reads vs the peers.

1. Many small files: N files of ~220 KB (page cache warm) read whole into ONE preallocated
   buffer: the native library (``gpu_zarr.engine.native.read``) vs Python threads
   (``os.preadv``, one job per thread) at 4 / 8 / 16 threads.
2. Small reads to host numpy (ms p50 / p95 over random planes or tiles):
   - a float32 plane of 64 Blosc lz4 chunks of 256 KiB (zarr v2, shuffle),
   - a 1024x1024 tile of 64^3 uint8 gzip chunks (zarr v3),
   ours (the engine's small-read path: native read+decode+place per chunk; and the same
   with GPU_ZARR_NATIVE=0), a numcodecs thread pool decoding into a preallocated output,
   and TensorStore.

Run (the H200 machine has 16 cores; here 2):
    PYTHONPATH=src python benchmarks/native_floor.py --dir /tmp/gz-floor
    PYTHONPATH=src python benchmarks/native_floor.py --files 2048 --quick   # smaller
Prints GiB/s, ms and ratios; ``--json PATH`` also writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

GiB = 1 << 30


def make_files(root: Path, n: int, seed: int = 0) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    sizes = rng.integers(200_000, 240_000, n)
    files = []
    blob = rng.integers(0, 256, int(sizes.max()), dtype=np.uint8).tobytes()
    for k, s in enumerate(sizes.tolist()):
        p = root / f"{k:05d}"
        if not p.exists() or p.stat().st_size != s:
            p.write_bytes(blob[:s])
        files.append(str(p))
    return files


def bench_files(files: list[str], threads_list: list[int], reps: int) -> list[dict]:
    from gpu_zarr.engine import native

    sizes = np.array([os.path.getsize(f) for f in files], np.int64)
    doff = np.concatenate([[0], np.cumsum(-(-sizes // 64) * 64)[:-1]]).astype(np.int64)
    dst = np.empty(int(doff[-1] + sizes[-1]), np.uint8)
    dst[::4096] = 0  # touched: page faults are not what is measured
    total = int(sizes.sum())
    rows = []

    def native_read(t: int) -> None:
        st, _ = native.read(files, np.arange(len(files)), np.zeros(len(files), np.int64), sizes, doff, dst, t)
        assert (st == 0).all()

    def python_read(t: int, pool: ThreadPoolExecutor) -> None:
        mv = memoryview(dst)
        so, sz = doff.tolist(), sizes.tolist()

        def job(j: int) -> None:
            for k in range(j, len(files), t):
                fd = os.open(files[k], os.O_RDONLY)
                try:
                    os.preadv(fd, [mv[so[k]:so[k] + sz[k]]], 0)
                finally:
                    os.close(fd)
        for f in [pool.submit(job, j) for j in range(t)]:
            f.result()

    for t in threads_list:
        res = {"threads": t}
        if native.available():
            native_read(t)
            res["native_gib_s"] = total / GiB / min(_time(lambda: native_read(t)) for _ in range(reps))
        with ThreadPoolExecutor(t) as pool:
            python_read(t, pool)
            res["python_gib_s"] = total / GiB / min(_time(lambda: python_read(t, pool)) for _ in range(reps))
        rows.append(res)
    return rows


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def make_plane_store(root: Path, planes: int) -> str:
    import numcodecs
    import zarr

    path = root / "plane-f32-blosc-lz4.zarr"
    if not (path / ".zarray").exists():
        arr = zarr.create_array(str(path), shape=(planes, 2048, 2048), chunks=(1, 256, 256), dtype="<f4",
                                zarr_format=2, compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE),
                                overwrite=True)
        yy, xx = np.mgrid[0:2048, 0:2048].astype(np.float32)
        rng = np.random.default_rng(0)
        for z in range(planes):
            arr[z] = np.sin(yy / 97 + z) * 1000 + xx / 3 + rng.normal(0, 4, (2048, 2048)).astype(np.float32)
    return str(path)


def make_tile_store(root: Path, depth: int) -> str:
    import zarr
    from zarr.codecs import GzipCodec

    path = root / "tile-u1-gzip-64.zarr"
    if not (path / "zarr.json").exists():
        arr = zarr.create_array(str(path), shape=(depth, 2048, 2048), chunks=(64, 64, 64), dtype="u1",
                                zarr_format=3, compressors=[GzipCodec(level=5)], overwrite=True)
        rng = np.random.default_rng(1)
        for z0 in range(0, depth, 64):
            z = np.arange(z0, z0 + 64, dtype=np.float32)[:, None, None]
            y = np.arange(2048, dtype=np.float32)[None, :, None]
            x = np.arange(2048, dtype=np.float32)[None, None, :]
            block = (np.sin(y / 50 + z / 20) * 60 + np.cos(x / 70) * 60 + 128).astype(np.uint8)
            block += rng.integers(0, 8, block.shape, dtype=np.uint8)
            arr[z0:z0 + 64] = block
    return str(path)


def _stats(times: list[float]) -> dict:
    ms = sorted(t * 1000 for t in times)
    return {"p50_ms": statistics.median(ms), "p95_ms": ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]}


def bench_small(path: str, selections: list, threads: int) -> dict:
    import zarr

    from gpu_zarr import settings
    from gpu_zarr.engine import native
    from gpu_zarr.engine.metadata import layout_of
    from gpu_zarr.engine.ops import CpuOps
    from gpu_zarr.engine.pipeline import EngineOptions, read

    arr = zarr.open_array(path, mode="r")
    lay = layout_of(arr)
    want = [np.asarray(arr[s]) for s in selections[:3]]
    out: dict = {}
    pool = ThreadPoolExecutor(threads)
    opts = EngineOptions(threads=threads)

    def ours(sel):
        return read(arr, sel, device="cpu", ops=CpuOps(pool, threads, fast=True), options=opts, layout=lay).data

    def timed(name, fn):
        for s, w in zip(selections[:3], want):
            np.testing.assert_array_equal(fn(s), w)
        out[name] = _stats([_time(lambda s=s: fn(s)) for s in selections])

    if native.available():
        timed("ours (native)", ours)
    with settings.set(native=False):
        timed("ours (Python, GPU_ZARR_NATIVE=0)", ours)
    timed("numcodecs thread pool", lambda sel: _numcodecs_pool(arr, lay, sel, pool, threads))
    try:
        import tensorstore as ts

        driver = "zarr" if arr.metadata.zarr_format == 2 else "zarr3"
        t = ts.open({"driver": driver, "kvstore": {"driver": "file", "path": path}}, read=True).result()
        timed("TensorStore", lambda sel: t[sel].read().result())
    except ImportError:
        pass
    pool.shutdown()
    return out


def _numcodecs_pool(arr, lay, sel, pool, threads):
    """The best plain Python can do: one task per thread reads its chunks, decodes them with
    numcodecs and copies them into a preallocated output."""
    from gpu_zarr.engine.plan import normalize_selection, plan_pieces
    from gpu_zarr.engine.sources.locate import locate

    region = normalize_selection(lay.shape, sel)
    pieces = plan_pieces(lay, region.start, region.stop)
    loc = locate(lay, pieces, pool)
    out = np.empty(region.box_shape, lay.out_dtype)
    if arr.metadata.zarr_format == 2:
        codec = arr.metadata.compressor
    else:
        import numcodecs

        codec = numcodecs.GZip()
    tab = pieces.table

    def job(j):
        for k in range(j, len(pieces), threads):
            with open(loc.files[loc.file_id[k]], "rb") as f:
                dec = np.frombuffer(codec.decode(f.read()), lay.disk_dtype).reshape(lay.inner_shape)
            t = tab[k]
            out[tuple(slice(a, a + n) for a, n in zip(t[:, 3], t[:, 2]))] = \
                dec[tuple(slice(a, a + n) for a, n in zip(t[:, 1], t[:, 2]))]
    for f in [pool.submit(job, j) for j in range(threads)]:
        f.result()
    return out[region.post] if not region.is_box else out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/gz-native-floor")
    ap.add_argument("--files", type=int, default=8192)
    ap.add_argument("--threads", default="4,8,16")
    ap.add_argument("--small-threads", type=int, default=min(16, os.cpu_count() or 4))
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and planes")
    ap.add_argument("--json")
    args = ap.parse_args()
    root = Path(args.dir)
    reps = 2 if args.quick else 3
    from gpu_zarr.engine import native

    print(f"native library: {native.status().summary()}; cores: {os.cpu_count()}")
    result: dict = {"cores": os.cpu_count(), "native": native.status().summary()}

    files = make_files(root / "files", args.files)
    rows = bench_files(files, [int(t) for t in args.threads.split(",")], reps)
    result["files"] = {"count": len(files), "rows": rows}
    print(f"\n{len(files)} files of ~220 KB into one buffer (warm), GiB/s")
    print("| threads | native | Python threads | native / Python |\n|---|---|---|---|")
    for r in rows:
        nat = r.get("native_gib_s")
        print(f"| {r['threads']} | {nat:.1f} | {r['python_gib_s']:.1f} | {nat / r['python_gib_s']:.1f}x |" if nat
              else f"| {r['threads']} | - | {r['python_gib_s']:.1f} | - |")

    rng = np.random.default_rng(0)
    nplanes = 8 if args.quick else 16
    plane = make_plane_store(root, nplanes)
    sels = [(int(z), slice(None), slice(None)) for z in rng.integers(0, nplanes, 12 if args.quick else 30)]
    depth = 64 if args.quick else 128
    tile = make_tile_store(root, depth)
    tsel = [(int(z), slice(int(y), int(y) + 1024), slice(int(x), int(x) + 1024))
            for z, y, x in zip(rng.integers(0, depth, 20), rng.integers(0, 16, 20) * 64, rng.integers(0, 16, 20) * 64)]
    for name, path, sel in (("float32 plane of 64 Blosc lz4 chunks of 256 KiB", plane, sels),
                            ("1024^2 tile of 64^3 uint8 gzip chunks", tile, tsel)):
        res = bench_small(path, sel, args.small_threads)
        result[name] = res
        best = res.get("ours (native)", res["ours (Python, GPU_ZARR_NATIVE=0)"])["p50_ms"]
        print(f"\n{name}, {args.small_threads} threads, ms p50 (p95), ratio = theirs / ours (native)")
        print("| reader | p50 | p95 | ratio |\n|---|---|---|---|")
        for reader, st in res.items():
            print(f"| {reader} | {st['p50_ms']:.1f} | {st['p95_ms']:.1f} | {st['p50_ms'] / best:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
