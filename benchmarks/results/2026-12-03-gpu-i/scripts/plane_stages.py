"""One plane of an open remote array, timed in stages on a shared monotonic clock: when its
requests reach the server (a process of its own), when the last answer left it, when the
host's part was done, when the result was ready; ours on the GPU (the engine backend, as the
lazy arrays read a plane), ours on the host, TensorStore, and TensorStore's plane copied to
the GPU (``cupy.asarray``: how a TensorStore user gets a GPU array; ninth session); 10 ms idle before each plane (a
viewer's pace), medians of N. Also: the native call's start, and one 2 MiB copy to the GPU
from pageable and from pinned memory.
Usage: python plane_stages.py WORKDIR REL LATENCY_MS [N]"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../2026-12-02-cpu-e/scripts"))
from _xserver import XServer  # noqa: E402

from gpu_zarr.bench.remote import _clear, _ours, _tensorstore  # noqa: E402
from gpu_zarr.engine import native_http  # noqa: E402

work, rel, lat = sys.argv[1], sys.argv[2], float(sys.argv[3])
N = int(sys.argv[4]) if len(sys.argv) > 4 else 40
srv = XServer(work, lat / 1000)
url = f"http://127.0.0.1:{srv.port}/{rel}"
marks: dict[str, float] = {}
readers = {"ts": _tensorstore(url), "ours-host": _ours("cpu")(url)}
try:
    import cupy

    cupy.asarray(np.zeros(1, np.uint8)).get()
    readers["ours-gpu"] = _ours("gpu")(url)
    _ts = _tensorstore(url)
    readers["ts-gpu"] = lambda sel: cupy.asarray(_ts(sel))
    real_asarray = cupy.asarray

    def asarray(a, *k, **kw):
        marks.setdefault("upload", time.monotonic())
        r = real_asarray(a, *k, **kw)
        cupy.cuda.get_current_stream().synchronize()
        marks["uploaded"] = time.monotonic()
        return r
    cupy.asarray = asarray
except ImportError:
    cupy = None
lib = native_http._lib()[0]
real_fetch = lib.gz_http_fetch


class Fetch:
    def __call__(self, *a):
        marks.setdefault("native", time.monotonic())
        return real_fetch(*a)


lib.gz_http_fetch = Fetch()
for f in readers.values():
    for z in range(8):
        f((z,))
srv.dump()
rows: dict[str, list[list[float]]] = {k: [] for k in readers}
for k in range(N):
    z = (7 * k + 3) % 64
    for name, f in readers.items():
        _clear()
        time.sleep(0.01)
        marks.clear()
        t = time.monotonic()
        r = f((z,))
        if cupy is not None and isinstance(r, cupy.ndarray):
            cupy.cuda.get_current_stream().synchronize()
        e = time.monotonic()
        log = srv.dump()
        ms = lambda v: 1e3 * (v - t)  # noqa: E731
        rows[name].append([ms(marks.get("native", t)), ms(min(x["time"] for x in log)),
                           ms(max(x["time"] for x in log)), ms(max(x["end"] for x in log)),
                           ms(marks.get("upload", e)), ms(marks.get("uploaded", e)), ms(e)])
srv.close()
print(f"{rel} at {lat:.0f} ms, medians of {N} (ms from the call): native call | first request at the server | "
      "last | last answer sent | upload starts | upload done | result")
for name, v in rows.items():
    a = np.median(np.array(v), axis=0)
    print(f"  {name:10s} " + " | ".join(f"{x:6.2f}" for x in a))
if cupy is not None:
    host = np.ones(2 << 20, np.uint8)
    pinned = cupy.cuda.alloc_pinned_memory(2 << 20)
    pin = np.frombuffer(pinned, np.uint8, 2 << 20)
    pin[:] = 1
    for name, src in (("pageable", host), ("pinned", pin)):
        ts = []
        for _ in range(50):
            t = time.perf_counter()
            d = real_asarray(src)
            cupy.cuda.get_current_stream().synchronize()
            ts.append(time.perf_counter() - t)
        print(f"  2 MiB to the GPU from {name} memory: {1e3 * np.median(ts):.3f} ms")
