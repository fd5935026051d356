"""Cold plane start timeline: marks at entry/exit of the steps before gz_http_fetch."""

import os
import sys
import time

import numpy as np

sys.path.insert(0, "/work/main/benchmarks/results/2026-12-02-cpu-e/scripts")
from _xserver import XServer

import gpu_zarr.engine.native as nat
import gpu_zarr.engine.native_http as nh
import gpu_zarr.engine.pipeline as pl
import gpu_zarr.engine.remote as rm
import gpu_zarr.engine.remote_fetch as rf
import gpu_zarr.engine.remote_read as rr
from gpu_zarr.bench.remote import _clear, _ours

marks = []
pc = time.perf_counter_ns


def wrap(obj, name, label=None):
    f = getattr(obj, name)
    lab = label or name

    def w(*a, **k):
        marks.append((lab + ">", pc()))
        try:
            return f(*a, **k)
        finally:
            marks.append(("<" + lab, pc()))

    setattr(obj, name, w)


for n in ["stage_for", "normalize_selection", "_budget", "check_fits", "plan_pieces", "run_remote_stream", "ops_for"]:
    if hasattr(pl, n):
        wrap(pl, n)
wrap(rf, "stream_remote")
wrap(rr, "_native_arrivals")
wrap(rf, "_stream_chunks")
wrap(rf, "Sink")
wrap(rm.RemoteSource, "stream")
wrap(rm.RemoteSource, "_native")
wrap(nh, "new_requests")
wrap(nh.HttpClient, "fetch")
wrap(nh.Carved, "addresses")
lib = nh._lib()[0]
real = lib.gz_http_fetch


class F:
    def __call__(self, *a):
        marks.append(("NATIVE", pc()))
        return real(*a)


lib.gz_http_fetch = F()
from gpu_zarr.engine.ops import CpuOps  # noqa: E402

wrap(CpuOps, "empty", "SENT(out made)")
wrap(CpuOps, "finish")
wrap(rr, "_arrivals_done")
import gpu_zarr.engine.cache as gc  # noqa: E402

for n in dir(gc):
    o = getattr(gc, n)
    if isinstance(o, type) and hasattr(o, "put"):
        wrap(o, "put", n + ".put")
wrap(nat.Arrivals, "close", "Arrivals.close")
srv = XServer("/tmp/gzr", 0.02)
rel = sys.argv[1] if len(sys.argv) > 1 else "remote-full-0"
f = _ours("cpu")(f"http://127.0.0.1:{srv.port}/{rel}")
for z in range(8):
    f((z,))
srv.dump()
rows = {}
N = int(os.environ.get("N", "30"))
IDLE = float(os.environ.get("IDLE_S", "0.01"))
for k in range(N):
    _clear()
    time.sleep(IDLE)
    marks.clear()
    t = pc()
    f(((7 * k + 3) % 64,))
    marks.append(("RET", pc()))
    log = srv.dump()
    seen = set()
    for lab, v in marks:
        if lab in seen:
            continue
        seen.add(lab)
        rows.setdefault(lab, []).append((v - t) / 1e3)
    rows.setdefault("SERVER first", []).append((min(e["time"] for e in log) * 1e9 - t) / 1e3)
    rows.setdefault("SERVER last", []).append((max(e["time"] for e in log) * 1e9 - t) / 1e3)
    rows.setdefault("END", []).append((pc() - t) / 1e3)
srv.close()
order = sorted(rows, key=lambda l: np.median(rows[l]))
for l in order:
    print(f"{np.median(rows[l]):8.1f} us  {l}")
