"""Median ms from a cold plane read's call to the native HTTP call and to its first and last
request at the server (10 ms idle before each plane). Usage: native_t.py REL N"""
import sys
import time

import numpy as np

sys.path.insert(0, "/work/main/benchmarks/results/2026-12-02-cpu-e/scripts")
from _xserver import XServer  # noqa: E402

import gpu_zarr.engine.native_http as nh  # noqa: E402
from gpu_zarr.bench.remote import _clear, _ours  # noqa: E402

lib = nh._lib()[0]
real = lib.gz_http_fetch
mark = []


class F:
    def __call__(self, *a):
        mark.append(time.perf_counter())
        return real(*a)


lib.gz_http_fetch = F()
srv = XServer("/tmp/gzr", 0.02)
f = _ours("cpu")(f"http://127.0.0.1:{srv.port}/{sys.argv[1]}")
for z in range(8):
    f((z,))
srv.dump()
rows = []
for k in range(int(sys.argv[2])):
    _clear()
    time.sleep(0.01)
    mark.clear()
    t = time.perf_counter()
    f(((7 * k + 3) % 64,))
    e = time.perf_counter()
    log = srv.dump()
    rows.append([(mark[0] - t) * 1e3, (min(x["time"] for x in log) - t) * 1e3, (max(x["time"] for x in log) - t) * 1e3,
                 (e - t) * 1e3])
srv.close()
print(" ".join(f"{v:.3f}" for v in np.median(np.array(rows), axis=0)))
