"""Sweep the direct engine's knobs (batch size, slots, reader) on existing volumes.

Each configuration runs in a fresh process, so GPU memory is measured from before the
first read: the peak includes nvCOMP's decode scratch, which its codec keeps between
reads (cupy's pool does not see it). Prints one JSON line per (configuration, volume)
and a Markdown table.

    python benchmarks/sweep_engine.py VOLUME.zarr [...] [--configs 192x3,256x2,...] [--repeat 3]

A configuration is ``BATCHxSLOTS`` (batch in MiB) optionally followed by flags:
``:threads`` / ``:native`` / ``:kvikio`` (the reader), ``:staged`` (raw chunks through
pinned staging instead of straight into device memory), ``:budget=MIB`` (the read's GPU
memory budget), ``:lanes=N`` (GPU work streams), ``:nthreads=N`` (read threads),
``:pinned=MIB`` (the pinned staging bound) and ``:compat`` (kvikio's POSIX compat mode set ON
rather than found per file). The GiB/s-versus-budget curve of
``benchmarks/README.md``:

    python benchmarks/sweep_engine.py ZSTD_1MIB.zarr ZSTD_4MIB.zarr --png budget.png \
        --configs 4096x4:budget=512,4096x4:budget=1024,4096x4:budget=2048,4096x4:budget=3072,4096x4:budget=4096
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

GiB = 1 << 30

_CHILD = r"""
import json, sys, threading, time
import cupy
from gpu_zarr.zarr_io import read_zarr

GiB = 1 << 30
paths, repeat = sys.argv[1:-1], int(sys.argv[-1])
cupy.cuda.Device().synchronize()
pool = cupy.get_default_memory_pool()
free0, total = cupy.cuda.runtime.memGetInfo()
low = [free0]
stop = threading.Event()

def sample():
    while not stop.is_set():
        low[0] = min(low[0], cupy.cuda.runtime.memGetInfo()[0])
        time.sleep(0.001)

for path in paths:
    low[0] = cupy.cuda.runtime.memGetInfo()[0]
    base = free0  # before any read in this process: nvCOMP scratch counts
    t = threading.Thread(target=sample, daemon=True)
    stop.clear(); t.start()
    times, out_bytes = [], 0
    for i in range(repeat + 1):
        t0 = time.perf_counter()
        res = read_zarr(path, prefer="kvikio")
        a, st = res.data, res.stats
        cupy.cuda.Device().synchronize()
        dt = time.perf_counter() - t0
        out_bytes = a.nbytes
        if i:
            times.append(dt)
        del a, res  # the result too: else the next read's peak holds two outputs
        pool.free_all_blocks()
    stop.set(); t.join()
    times.sort()
    med = times[len(times) // 2]
    print(json.dumps({"path": path, "gib_per_s": out_bytes / GiB / med, "lanes": st.get("lanes"),
                      "budget_gib": st.get("budget_bytes", 0) / GiB,
                      "median_s": med, "peak_extra_gib": (base - low[0] - out_bytes) / GiB,
                      "stages_ms": {k: round(v * 1e3, 1) for k, v in st.items() if k.endswith("_s")},
                      "reader": st.get("reader")}), flush=True)
"""


def _env(config: str) -> dict:
    spec, *flags = config.split(":")
    batch, slots = spec.split("x")
    env = dict(os.environ, GPU_ZARR_BATCH_MIB=batch, GPU_ZARR_SLOTS=slots)
    for flag in flags:
        key, _, value = flag.partition("=")
        if key in ("threads", "native", "kvikio"):
            env["GPU_ZARR_READER"] = key
        elif key == "staged":
            env["GPU_ZARR_DIRECT_RAW"] = "0"
        elif key == "budget":
            env["GPU_ZARR_BUDGET_MIB"] = value
        elif key == "lanes":
            env["GPU_ZARR_LANES"] = value
        elif key == "nthreads":
            env["GPU_ZARR_THREADS"] = value
        elif key == "pinned":
            env["GPU_ZARR_PINNED_MIB"] = value
        elif key == "compat":  # kvikio's POSIX mode without its per-file cuFile probe (never OFF)
            env["KVIKIO_COMPAT_MODE"] = "ON"
        else:
            raise SystemExit(f"unknown flag {flag!r} in configuration {config!r}")
    return env


def _plot(rows: list[dict], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in sorted({os.path.basename(r["path"].rstrip("/")) for r in rows}):
        pts = sorted((r["budget_gib"], r["gib_per_s"]) for r in rows if r["path"].rstrip("/").endswith(name))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax.set_xlabel("GPU memory budget beyond the output (GiB)")
    ax.set_ylabel("GiB/s (decoded)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("volumes", nargs="+")
    p.add_argument("--configs", default="192x3,128x3,256x2,256x3,192x3:threads,192x3:staged")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--png", help="write the GiB/s-versus-budget curve here")
    args = p.parse_args(argv)
    rows = []
    for config in args.configs.split(","):
        out = subprocess.run([sys.executable, "-c", _CHILD, *args.volumes, str(args.repeat)],
                             capture_output=True, text=True, env=_env(config), timeout=600)
        if out.returncode != 0:
            print(f"{config}: FAILED\n{out.stderr[-2000:]}", flush=True)
            continue
        for line in out.stdout.splitlines():
            if line.startswith("{"):
                rec = dict(json.loads(line), config=config)
                rows.append(rec)
                print(json.dumps(rec), flush=True)
    print("\n| config | volume | budget (GiB) | lanes | GiB/s | peak GPU memory beyond output (GiB) | reader |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        name = os.path.basename(r["path"].rstrip("/"))
        print(f"| {r['config']} | {name} | {r['budget_gib']:.2f} | {r['lanes']} | {r['gib_per_s']:.1f} | "
              f"{r['peak_extra_gib']:.2f} | {r['reader']} |")
    if args.png and rows:
        _plot(rows, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
