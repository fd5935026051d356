import sys
import time

import numpy as np

sys.path.insert(0, "/work/main/benchmarks/results/2026-12-02-cpu-e/scripts")
from _xserver import XServer

import gpu_zarr.engine.native_http as nh

srv = XServer("/tmp/gzr", 0.02)
base = f"http://127.0.0.1:{srv.port}/remote-full-0"
cli = nh.HttpClient()


def one(z, pre):
    urls = [f"{base}/c/{z}/{j // 2}/{j % 2}" for j in range(4)]
    reqs = nh.new_requests(4)
    reqs["end"] = -1
    dests = [np.empty(1 << 21, np.uint8) for _ in range(4)]
    for d in dests:
        d[:] = 0
    marks = {}
    time.sleep(0.01)
    t = time.perf_counter()
    if pre:
        pre()
    cli.fetch(urls, reqs, dests, 64, lambda i: None, on_sent=lambda: marks.setdefault("sent", time.perf_counter()))
    e = time.perf_counter()
    log = srv.dump()
    return [
        (marks["sent"] - t) * 1e3,
        (min(x["time"] for x in log) - t) * 1e3,
        (max(x["time"] for x in log) - t) * 1e3,
        (e - t) * 1e3,
    ]


for z in range(5):
    one(z, None)
srv.dump()
print(
    "fetch() only: sent | server first | last | end",
    np.round(np.median([one((7 * k + 3) % 64, None) for k in range(30)], axis=0), 3),
)
from gpu_zarr.engine.plan import normalize_selection  # noqa: E402


def busy():  # ~ some python work
    for _ in range(1):
        normalize_selection((64, 1024, 1024), (5,))


print("+normalize:", np.round(np.median([one((7 * k + 3) % 64, busy) for k in range(30)], axis=0), 3))
srv.close()
