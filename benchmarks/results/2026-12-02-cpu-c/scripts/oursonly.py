import ctypes
import os
import sys
import time
from pathlib import Path

from gpu_zarr.bench.remote import _clear, _tensorstore, _volumes
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.engine import read
from gpu_zarr.engine.ops import CpuOps
from gpu_zarr.engine.pipeline import EngineOptions
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.store import open_array

if os.environ.get("MALLOPT"):
    libc = ctypes.CDLL("libc.so.6")
    print(libc.mallopt(-1, 512 << 20), libc.mallopt(-3, 64 << 20))
wd = Path("/tmp/gzr")  # the volumes `gpu-zarr bench --remote --workdir /tmp/gzr` writes
i = int(sys.argv[1])
who = sys.argv[2]
vols = list(_volumes("full").items())
opts = EngineOptions()
ops = CpuOps(get_runtime().pool("cpu-decode", opts.threads), opts.threads, fast=True)
vname, spec = vols[i]
rel = f"remote-full-{i}" + ("-v2" if spec["fmt"] == 2 else "")
with ServerProcess(wd, latency=0) as srv:
    url = f"{srv.url}/{rel}"
    if who == "ours":
        arr = open_array(url)
        f = lambda z: read(arr, (z,), device="cpu", options=opts, ops=ops)
    else:
        t = _tensorstore(url)
        f = lambda z: t((z,))
    for k in range(10):
        f(k)
    print("go", flush=True)
    open("/tmp/go", "w").close()
    c0 = time.process_time()
    for k in range(300):
        z = (7 * k + 3) % spec["shape"][0]
        _clear()
        f(z)
    print(who, "cpu/plane ms", 1e3 * (time.process_time() - c0) / 300)
