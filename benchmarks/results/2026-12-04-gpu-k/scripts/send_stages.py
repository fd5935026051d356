"""When a plane's requests leave: ms from the read's call to the native HTTP call, to the
first request's arrival at the server (its log's monotonic time, a process of its own), to the
read's setup while the requests travel (the output made: CpuOps.empty), and to the result;
medians of N, 10 ms idle before each plane (a viewer's pace; IDLE_S sets it). The CPU backend's host path,
or the GPU path's small read with the copy to the GPU left out.
Usage: python send_stages.py WORKDIR REL [N] [LATENCY_S] [host|gpu]"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../2026-12-02-cpu-e/scripts"))
from _xserver import XServer  # noqa: E402

import gpu_zarr.backends as backends  # noqa: E402
import gpu_zarr.engine.native_http as nh  # noqa: E402
from gpu_zarr.bench.remote import _clear, _ours  # noqa: E402
from gpu_zarr.engine.ops import CpuOps  # noqa: E402

work, rel = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 40
lat = float(sys.argv[4]) if len(sys.argv) > 4 else 0.02
kind = sys.argv[5] if len(sys.argv) > 5 else "host"
IDLE = float(os.environ.get("IDLE_S", 0.01))  # idle before each plane
marks: dict[str, float] = {}
lib = nh._lib()[0]
real_fetch = lib.gz_http_fetch


class Fetch:
    def __call__(self, *a):
        marks.setdefault("native call", time.perf_counter())
        return real_fetch(*a)


lib.gz_http_fetch = Fetch()
real_empty = CpuOps.empty


def empty(self, *a, **k):
    marks.setdefault("output made", time.perf_counter())
    return real_empty(self, *a, **k)


CpuOps.empty = empty
srv = XServer(work, lat)
url = f"http://127.0.0.1:{srv.port}/{rel}"
if kind == "gpu":
    from gpu_zarr.engine.layout import layout_of
    from gpu_zarr.engine.plan import normalize_selection
    from gpu_zarr.engine.runtime import get_runtime
    from gpu_zarr.store import open_array

    get_runtime().pinned_alloc = lambda n: np.empty(n, np.uint8)
    backends._to_gpu = lambda h: h
    arr = open_array(url)
    lay = layout_of(arr)
    be = backends.EngineBackend(lay)

    def f(sel):
        return be.read(arr, normalize_selection(lay.shape, sel), sel, options=None, progress=None, cancel=None,
                       where="device")[0]
else:
    f = _ours("cpu")(url)
for z in range(8):
    f((z,))
srv.dump()
rows = []
for k in range(N):
    _clear()
    time.sleep(IDLE)
    marks.clear()
    t = time.perf_counter()
    f(((7 * k + 3) % 64,))
    end = time.perf_counter()
    log = srv.dump()
    row = {m: (v - t) * 1e3 for m, v in marks.items()}
    row["first request at the server"] = (min(e["time"] for e in log) - t) * 1e3
    row["last request at the server"] = (max(e["time"] for e in log) - t) * 1e3
    row["result"] = (end - t) * 1e3
    rows.append(row)
srv.close()
print(f"{rel} ({kind}, {lat * 1e3:g} ms a request): ms from the call (medians of {N})")
for m in sorted(rows[0], key=lambda m: np.median([r[m] for r in rows])):
    print(f"  {m:30s} {np.median([r[m] for r in rows]):8.3f}")
