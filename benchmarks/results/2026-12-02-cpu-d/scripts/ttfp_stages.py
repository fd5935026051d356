"""Time to the first plane of a remote array, by stage: resolve the URL, build the obstore store,
zarr's open (one round trip), parse the layout, read plane 0 on the CPU path. A new server (a new
URL: nothing cached) each time, 20 ms a request. Usage: python ttfp_stages.py REL (a volume that
``gpu-zarr bench --remote --workdir /tmp/gzr`` wrote, e.g. remote-full-1)."""
import sys
import time

import zarr

from gpu_zarr.bench.remote import _clear
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.engine import read
from gpu_zarr.engine.layout import layout_of
from gpu_zarr.engine.ops import CpuOps
from gpu_zarr.engine.pipeline import EngineOptions
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.location import resolve

rel = sys.argv[1]
for _ in range(5):
    with ServerProcess("/tmp/gzr", latency=0.02) as srv:
        _clear()
        t0 = time.perf_counter()
        loc = resolve(f"{srv.url}/{rel}")
        t1 = time.perf_counter()
        st = loc.zarr_store()
        t2 = time.perf_counter()
        arr = zarr.open(st, mode="r")
        t3 = time.perf_counter()
        lay = layout_of(arr)
        t4 = time.perf_counter()
        opts = EngineOptions()
        ops = CpuOps(get_runtime().pool("cpu-decode", opts.threads), opts.threads, fast=True)
        read(arr, (0,), device="cpu", options=opts, ops=ops, layout=lay)
        t5 = time.perf_counter()
        ms = [1e3 * (b - a) for a, b in ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5), (t0, t5))]
        print("resolve {:.1f} store {:.1f} zarr.open {:.1f} layout {:.1f} plane {:.1f} total {:.1f}".format(*ms))
