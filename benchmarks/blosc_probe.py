"""Quick throughput probe of the GPU Blosc path on a real-world layout (not the full benchmark).

Writes zarr v2 uint16 volumes with 1x1024x1024 chunks (as bioformats2raw writes 2-D planes),
Blosc lz4 + byte shuffle and/or zstd + bitshuffle, smooth structure plus noise, then reads each
through ``read_zarr(path, prefer="kvikio")`` (warm cache, median of ``--repeat``), checks it
equal to zarr's CPU read, and prints GiB/s with the engine's per-stage stats.

    python benchmarks/blosc_probe.py --gib 2 --codecs lz4-shuffle zstd-bitshuffle --dir /tmp/probe
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numcodecs
import numpy as np

CODECS = {
    "lz4-shuffle": {"cname": "lz4", "clevel": 5, "shuffle": numcodecs.Blosc.SHUFFLE},
    "zstd-bitshuffle": {"cname": "zstd", "clevel": 5, "shuffle": numcodecs.Blosc.BITSHUFFLE},
    "zstd-shuffle": {"cname": "zstd", "clevel": 5, "shuffle": numcodecs.Blosc.SHUFFLE},
}


def write_volume(path: Path, planes: int, codec: dict, threads: int = 16) -> float:
    """A v2 array written by zarr (metadata) with its chunks encoded by numcodecs in threads."""
    import zarr

    comp = numcodecs.Blosc(**codec)
    zarr.create_array(str(path), shape=(planes, 1024, 1024), chunks=(1, 1024, 1024), dtype="<u2",
                      zarr_format=2, compressors=comp, fill_value=0, overwrite=True)
    yy, xx = np.mgrid[0:1024, 0:1024]
    base = (2000 + 800 * np.sin(xx / 37.0) * np.cos(yy / 53.0)).astype(np.int64)

    def one(z: int) -> int:
        rng = np.random.default_rng(z)
        plane = (base + (z % 97) * 3 + rng.integers(0, 48, (1024, 1024))).astype("<u2")
        enc = comp.encode(plane)
        (path / f"{z}.0.0").write_bytes(enc)
        return len(enc)

    with ThreadPoolExecutor(threads) as pool:
        sizes = list(pool.map(one, range(planes)))
    return planes * 2 * 1024 * 1024 / sum(sizes)


def decode_only(path: Path, planes: int, batch_chunks: int = 96, repeat: int = 3) -> dict:
    """GPU time of the Blosc stage alone (parse excluded): chunks already on the device."""
    import cupy

    from gpu_zarr.engine.codecs.blosc import BloscStage, parse_batch
    from gpu_zarr.engine.ops import ops_for
    from gpu_zarr.engine.runtime import get_runtime

    ops = ops_for("gpu", 3, 1, get_runtime())
    stage = BloscStage()
    nbytes = 2 * 1024 * 1024
    batches = []
    t_parse = 0.0
    for first in range(0, planes, batch_chunks):
        blobs = [(path / f"{z}.0.0").read_bytes() for z in range(first, min(planes, first + batch_chunks))]
        sizes = np.array([len(b) for b in blobs], np.int64)
        offs = np.cumsum(sizes) - sizes
        host = np.frombuffer(b"".join(blobs), np.uint8)
        t = time.perf_counter()
        plan = parse_batch(host, offs, sizes, nbytes)
        t_parse += time.perf_counter() - t
        batches.append((cupy.asarray(host), plan, np.arange(len(blobs), dtype=np.int64) * nbytes))
    out = cupy.empty(batch_chunks * nbytes, np.uint8)
    cupy.cuda.Device().synchronize()  # the uploads (default stream) before work on the engine's stream
    times = []
    for _ in range(repeat):
        ops.sync()
        start = ops.stream.record()
        t = time.perf_counter()
        for src, plan, dst_off in batches:
            stage.decode(ops, src, None, plan, out, dst_off, None, None, 0, None)
        host_s = time.perf_counter() - t
        end = ops.stream.record()
        end.synchronize()
        times.append((cupy.cuda.get_elapsed_time(start, end) / 1e3, host_s))
    gib = planes * nbytes / 2**30
    best = min(times)
    return {"decode_only_gib_s": round(gib / best[0], 1), "decode_only_s": round(best[0], 4),
            "decode_host_s": round(best[1], 4), "parse_s_total": round(t_parse, 4),
            "batch_chunks": batch_chunks}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--codecs", nargs="+", default=["lz4-shuffle"])
    ap.add_argument("--dir", default="/tmp/blosc_probe")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu-check", action="store_true", help="also time zarr's CPU read + cupy.asarray")
    args = ap.parse_args()
    import cupy
    import zarr

    from gpu_zarr.zarr_io import read_zarr

    planes = int(args.gib * 1024 // 2)
    report = {}
    for name in args.codecs:
        path = Path(args.dir) / f"{name}.zarr"
        t = time.perf_counter()
        ratio = write_volume(path, planes, CODECS[name])
        print(f"{name}: wrote {planes} planes, ratio {ratio:.2f}, {time.perf_counter() - t:.1f} s", flush=True)
        arr = zarr.open_array(str(path), mode="r")
        t = time.perf_counter()
        want = arr[...]
        cpu_s = time.perf_counter() - t
        t = time.perf_counter()
        want_gpu = cupy.asarray(want)
        cupy.cuda.Device().synchronize()
        cpu_gpu_s = cpu_s + time.perf_counter() - t
        del want
        res = read_zarr(str(path), prefer="kvikio")  # warm-up (kernels, nvCOMP codecs, pinned memory)
        ok = bool(cupy.array_equal(res.data, want_gpu))
        del res
        times, stats = [], None
        for _ in range(args.repeat):
            res = read_zarr(str(path), prefer="kvikio")
            times.append(res.seconds)
            stats = res.stats
            reason = res.reason
            del res
        gib = planes * 2 / 1024
        med = statistics.median(times)
        row = {"ratio": round(ratio, 2), "gib": gib, "equal": ok, "engine_gib_s": round(gib / med, 2),
                   "engine_s": [round(x, 3) for x in times], "zarr_cpu_gib_s": round(gib / cpu_s, 2),
                   "zarr_cpu_cupy_gib_s": round(gib / cpu_gpu_s, 2), "reason": reason,
                   "stats": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in (stats or {}).items()}}
        try:
            row["decode_only"] = decode_only(path, planes)
        except Exception as exc:  # noqa: BLE001 - a probe: report and go on
            row["decode_only"] = f"failed: {type(exc).__name__}: {exc}"
        print(json.dumps({name: row}, indent=1, default=str), flush=True)
        report[name] = row
        del want_gpu
        cupy.get_default_memory_pool().free_all_blocks()
    print("SUMMARY", json.dumps({k: (v["engine_gib_s"], v["zarr_cpu_cupy_gib_s"], v["equal"]) for k, v in report.items()}))


if __name__ == "__main__":
    main()
