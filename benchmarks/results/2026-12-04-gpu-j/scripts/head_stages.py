"""A plane's head, layer by layer: ms from the read's call to each layer's entry, up to the
native HTTP call that sends the requests, medians of N, 10 ms idle before each plane (a
viewer's pace: the code runs cold). The CPU backend's host path (``bench --remote``'s
``ours`` reader), and the GPU path's small read with the copy to the GPU left out.
Usage: python head_stages.py WORKDIR REL [N] [host|gpu]"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../2026-12-02-cpu-e/scripts"))
from _xserver import XServer  # noqa: E402

import gpu_zarr.backends as backends  # noqa: E402
import gpu_zarr.engine.native_http as nh  # noqa: E402
import gpu_zarr.engine.pipeline as pl  # noqa: E402
import gpu_zarr.engine.remote as remote  # noqa: E402
import gpu_zarr.engine.remote_fetch as rf  # noqa: E402
import gpu_zarr.engine.remote_read as rr  # noqa: E402
from gpu_zarr.bench.remote import _clear, _ours  # noqa: E402

work, rel = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 40
kind = sys.argv[4] if len(sys.argv) > 4 else "host"
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


if kind == "gpu":
    from gpu_zarr.engine.runtime import get_runtime

    get_runtime().pinned_alloc = lambda n: np.empty(n, np.uint8)
    backends._to_gpu = lambda h: h
    wrap(backends.EngineBackend, "read", "backend.read")
wrap(pl, "_read", "_read")
wrap(pl, "stage_for", "stage_for", "stage_for returned")
wrap(pl, "check_fits", "check_fits", "check_fits returned")
wrap(pl, "plan_pieces", "plan_pieces", "plan_pieces returned")
from gpu_zarr.engine.ops import CpuOps  # noqa: E402

wrap(CpuOps, "empty", "ops.empty", "ops.empty returned")
wrap(pl, "run_remote_stream", "run_remote_stream")
wrap(rr, "arena_for", "arena_for")
wrap(rf, "stream_remote", "stream_remote")
wrap(rf, "_stream_chunks", "_stream_chunks")
wrap(remote.RemoteSource, "stream", "source.stream")
wrap(remote.RemoteSource, "_native", "_native")
wrap(nh.HttpClient, "fetch", "http.fetch")
wrap(nh, "new_requests", "new_requests", "new_requests returned")
lib = nh._lib()[0]
real_fetch = lib.gz_http_fetch


class Fetch:
    def __call__(self, *a):
        marks.append(("native call", time.perf_counter()))
        return real_fetch(*a)


lib.gz_http_fetch = Fetch()
srv = XServer(work, 0.02)
url = f"http://127.0.0.1:{srv.port}/{rel}"
if kind == "gpu":
    from gpu_zarr.engine.layout import layout_of
    from gpu_zarr.engine.plan import normalize_selection
    from gpu_zarr.store import open_array

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
order: list[str] = []
rows = []
for k in range(N):
    _clear()
    time.sleep(0.01)
    marks.clear()
    t = time.perf_counter()
    f(((7 * k + 3) % 64,))
    first = {}
    for m, v in marks:
        first.setdefault(m, v)
        if m not in order:
            order.append(m)
    rows.append({m: (v - t) * 1e3 for m, v in first.items()})
srv.close()
print(f"{rel} ({kind}): ms from the call to each layer's first entry (medians of {N})")
for m in order:
    print(f"  {m:20s} {np.median([r[m] for r in rows if m in r]):7.3f}")
