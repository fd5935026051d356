import statistics
import time
from pathlib import Path

import numpy as np

import gpu_zarr.engine.native_http as nh
from gpu_zarr.bench.remote_server import ServerProcess

wd = Path("/tmp/gzr")  # the volumes `gpu-zarr bench --remote --workdir /tmp/gzr` writes
with ServerProcess(wd, latency=0) as srv:
    keys = [f"remote-full-1/c/{z}/0/0" for z in range(8)]
    cl = nh.client_for("http", {})
    sizes = [(wd / k).stat().st_size for k in keys]
    bufs = [np.empty(s + 64, np.uint8) for s in sizes]
    w, c = [], []
    for rep in range(30):
        reqs = nh.new_requests(8)
        reqs["start"][:] = 0
        reqs["end"][:] = -1
        t = time.perf_counter()
        p = time.process_time()
        cl.fetch([f"{srv.url}/{k}" for k in keys], reqs, bufs, 64, lambda i: None)
        w.append(time.perf_counter() - t)
        c.append(time.process_time() - p)
    print(
        f"{sum(sizes) / 2**20:.0f} MiB: wall median {1e3 * statistics.median(w):.1f} ms best {1e3 * min(w):.1f}, "
        f"cpu median {1e3 * statistics.median(c):.1f}"
    )
