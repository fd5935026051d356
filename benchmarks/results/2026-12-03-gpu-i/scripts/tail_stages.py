"""A plane's tail, stage by stage: ms from when the server (a process of its own, on a shared
monotonic clock) finished sending the plane's last answer to each layer's last entry or return,
medians of N, 10 ms idle before each plane. The read is the GPU path's small read (the engine
backend) with the page-locked staging and the copy to the GPU left out, so it runs anywhere.
Usage: WORK=DIR LAT=20 python tail_stages.py REL N"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../2026-12-02-cpu-e/scripts"))
from _xserver import XServer  # noqa: E402

import gpu_zarr.backends as backends  # noqa: E402
import gpu_zarr.engine.native as native  # noqa: E402
import gpu_zarr.engine.native_http as nh  # noqa: E402
import gpu_zarr.engine.pipeline as pl  # noqa: E402
import gpu_zarr.engine.plan as plan  # noqa: E402
import gpu_zarr.engine.remote as remote  # noqa: E402
import gpu_zarr.engine.remote_fetch as rf  # noqa: E402
import gpu_zarr.engine.remote_read as rr  # noqa: E402
from gpu_zarr.bench.remote import _clear  # noqa: E402
from gpu_zarr.engine.layout import layout_of  # noqa: E402
from gpu_zarr.engine.runtime import get_runtime  # noqa: E402
from gpu_zarr.store import open_array  # noqa: E402

rt = get_runtime()
rt.pinned_alloc = lambda n: np.empty(n, np.uint8)
backends._to_gpu = lambda h: h
rel, N = sys.argv[1], int(sys.argv[2])
srv = XServer(os.environ.get("WORK", "/tmp/gzr"), float(os.environ.get("LAT", "20")) / 1000)
url = f"http://127.0.0.1:{srv.port}/{rel}"
arr = open_array(url)
lay = layout_of(arr)
be = backends.EngineBackend(lay)
marks: list[tuple[str, float]] = []


def wrap(obj, name, label, after=None):
    real = getattr(obj, name)

    def w(*a, **k):
        marks.append((label, time.perf_counter()))
        try:
            return real(*a, **k)
        finally:
            if after:
                marks.append((after, time.perf_counter()))
    setattr(obj, name, w)


wrap(remote.RemoteSource, "_judge", "answer reported")
wrap(native.Arrivals, "add", "decode queued")
wrap(nh.HttpClient, "fetch", "fetch", "fetch returned")
wrap(remote.RemoteSource, "_native", "_native", "_native returned")
wrap(rf, "stream_remote", "stream_remote", "stream_remote returned")
wrap(rr, "_arrivals_done", "decodes awaited", "decodes done")
wrap(pl, "_read", "_read", "_read returned")
labels = ["answer reported", "decode queued", "fetch returned", "_native returned", "stream_remote returned",
          "decodes awaited", "decodes done", "_read returned", "result"]


def read(sel):
    return be.read(arr, plan.normalize_selection(lay.shape, sel), sel, options=None, progress=None, cancel=None,
                   where="device")[0]


for z in range(8):
    read((z,))
srv.dump()
rows = []
for k in range(N):
    _clear()
    time.sleep(0.01)
    marks.clear()
    read(((7 * k + 3) % lay.shape[0],))
    end = time.perf_counter()
    sent = max(x["end"] for x in srv.dump() if x["end"] is not None)
    last = dict(marks)  # each label's last mark
    last["result"] = end
    rows.append({m: (v - sent) * 1e3 for m, v in last.items()})
srv.close()
print(f"{rel} at {os.environ.get('LAT', '20')} ms: ms after the last answer left the server (medians of {N})")
for m in labels:
    print(f"  {m:24s} {np.median([r[m] for r in rows if m in r]):7.3f}")
