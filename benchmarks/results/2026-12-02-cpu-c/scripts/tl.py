import sys
import time
from pathlib import Path

import gpu_zarr.engine.native_http as nh
from gpu_zarr.bench.remote import _clear, _volumes
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.engine import read
from gpu_zarr.engine.ops import CpuOps
from gpu_zarr.engine.pipeline import EngineOptions
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.store import open_array

wd = Path("/tmp/gzr")  # the volumes `gpu-zarr bench --remote --workdir /tmp/gzr` writes
i = int(sys.argv[1])
lat = float(sys.argv[2])
vols = list(_volumes("full").items())
opts = EngineOptions()
ops = CpuOps(get_runtime().pool("cpu-decode", opts.threads), opts.threads, fast=True)
vname, spec = vols[i]
rel = f"remote-full-{i}" + ("-v2" if spec["fmt"] == 2 else "")
T = []
orig = nh.HttpClient.fetch


def fetch(self, urls, reqs, bufs, inflight, done):
    T.append(("fetch-start", time.perf_counter()))

    def d(k):
        T.append((f"done{k}", time.perf_counter()))
        done(k)

    r = orig(self, urls, reqs, bufs, inflight, d)
    T.append(("fetch-end", time.perf_counter()))
    return r


nh.HttpClient.fetch = fetch
with ServerProcess(wd, latency=lat / 1000) as srv:
    arr = open_array(f"{srv.url}/{rel}")
    rows = []
    for k in range(30):
        _clear()
        T.clear()
        t0 = time.perf_counter()
        res = read(arr, ((7 * k + 3) % 64,), device="cpu", options=opts, ops=ops)
        t1 = time.perf_counter()
        rows.append([(n, 1e3 * (t - t0)) for n, t in T] + [("end", 1e3 * (t1 - t0))])
    print({k: round(v * 1e3, 2) for k, v in res.stats.items() if k.endswith("_s")})
    for r in rows[-5:]:
        print("  ".join(f"{n} {v:.1f}" for n, v in r))
