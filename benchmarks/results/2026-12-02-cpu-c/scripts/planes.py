import statistics
import sys
import time
from pathlib import Path

from gpu_zarr.bench.remote import _clear, _tensorstore, _volumes, _write
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.engine import read
from gpu_zarr.engine.ops import CpuOps
from gpu_zarr.engine.pipeline import EngineOptions
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.store import open_array

wd = Path("/tmp/gzr")  # the volumes `gpu-zarr bench --remote --workdir /tmp/gzr` writes
lat = float(sys.argv[1])
which = sys.argv[2:] or ["0", "1", "2"]
vols = list(_volumes("full").items())
opts = EngineOptions()
ops = CpuOps(get_runtime().pool("cpu-decode", opts.threads), opts.threads, fast=True)
for i in map(int, which):
    vname, spec = vols[i]
    rel = f"remote-full-{i}" + ("-v2" if spec["fmt"] == 2 else "")
    _write(wd / rel, spec)
    with ServerProcess(wd, latency=lat / 1000) as srv:
        url = f"{srv.url}/{rel}"
        arr = open_array(url)
        t = _tensorstore(url)
        for rep in range(3):
            o, s = [], []
            for k in range(15):
                z = (7 * k + 3) % spec["shape"][0]
                _clear()
                t0 = time.perf_counter()
                res = read(arr, (z,), device="cpu", options=opts, ops=ops)
                o.append(time.perf_counter() - t0)
                _clear()
                t0 = time.perf_counter()
                t((z,))
                s.append(time.perf_counter() - t0)
            print(f"{vname} lat {lat}: ours {1e3 * statistics.median(o):.1f} ts {1e3 * statistics.median(s):.1f}")
        print({k: (round(v * 1e3, 2) if isinstance(v, float) else v) for k, v in res.stats.items()})
