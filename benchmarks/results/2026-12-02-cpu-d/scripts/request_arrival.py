"""When the requests of one plane reach the server, ours against TensorStore's (a loopback server
in this process, whose request log has arrival times; 20 ms a request; median of 30 planes, ms
from the start of the read). Usage: python request_arrival.py REL"""
import sys
import time

import numpy as np

from gpu_zarr.bench.remote import _clear, _tensorstore
from gpu_zarr.bench.remote_server import RangeServer
from gpu_zarr.engine import read
from gpu_zarr.engine.layout import layout_of
from gpu_zarr.engine.ops import CpuOps
from gpu_zarr.engine.pipeline import EngineOptions
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.store import open_array

rel = sys.argv[1]
with RangeServer("/tmp/gzr", latency=0.02) as srv:
    arr = open_array(f"{srv.url}/{rel}")
    lay = layout_of(arr)
    opts = EngineOptions()
    ops = CpuOps(get_runtime().pool("cpu-decode", opts.threads), opts.threads, fast=True)
    ts = _tensorstore(f"{srv.url}/{rel}")
    readers = {"ours": lambda z: read(arr, (z,), device="cpu", options=opts, ops=ops, layout=lay),
               "tensorstore": lambda z: ts((z,))}
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in readers}
    for k in range(30):
        z = (7 * k + 3) % 64
        for name, f in readers.items():
            _clear()
            srv.log.clear()
            t = time.monotonic()
            f(z)
            t1 = time.monotonic()
            at = sorted(e["time"] for e in srv.log)
            rows[name].append((1e3 * (t1 - t), 1e3 * (at[0] - t), 1e3 * (at[-1] - t)))
    for name, v in rows.items():
        print("{}: total {:.1f}, first request at the server {:.2f}, last {:.2f}".format(
            name, *np.median(np.array(v), axis=0)))
