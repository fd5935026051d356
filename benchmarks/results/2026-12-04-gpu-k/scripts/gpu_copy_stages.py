"""The GPU plane's last step, cold (10 ms idle before each, a viewer's pace): the copy of a
2 MiB plane from page-locked memory to a new cupy array, in stages (cupy.empty, the stream,
set, synchronize), and the whole _to_gpu of the engine backend; then the engine backend's GPU
plane read with _to_gpu timed inside it. Medians of N, microseconds.
Usage: python gpu_copy_stages.py WORKDIR REL [N]"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../2026-12-02-cpu-e/scripts"))
import cupy  # noqa: E402
from _xserver import XServer  # noqa: E402

import gpu_zarr.backends as backends  # noqa: E402
from gpu_zarr.bench.remote import _clear  # noqa: E402
from gpu_zarr.engine.runtime import get_runtime  # noqa: E402

work, rel = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 40
rt = get_runtime()
host = rt.pinned_alloc(2 << 20).view(np.uint16).reshape(1, 1024, 1024)
host[...] = 7
rows = []
for k in range(N + 3):
    time.sleep(0.01)
    t0 = time.perf_counter()
    dev = cupy.empty(host.shape, host.dtype)
    t1 = time.perf_counter()
    stream = cupy.cuda.get_current_stream()
    t2 = time.perf_counter()
    dev.set(host, stream=stream)
    t3 = time.perf_counter()
    stream.synchronize()
    t4 = time.perf_counter()
    del dev
    rows.append([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0])
r = np.median(np.array(rows[3:]) * 1e6, axis=0)
print(f"copy stages, us: empty {r[0]:.1f} | stream {r[1]:.1f} | set {r[2]:.1f} | synchronize {r[3]:.1f} | all {r[4]:.1f}")
real = backends._to_gpu
spent: list[float] = []


def timed(h):
    t = time.perf_counter()
    try:
        return real(h)
    finally:
        spent.append(time.perf_counter() - t)


backends._to_gpu = timed
srv = XServer(work, 0.02)
from gpu_zarr.engine.layout import layout_of  # noqa: E402
from gpu_zarr.engine.plan import normalize_selection  # noqa: E402
from gpu_zarr.store import open_array  # noqa: E402

arr = open_array(f"http://127.0.0.1:{srv.port}/{rel}")
lay = layout_of(arr)
be = backends.EngineBackend(lay)
total = []
for k in range(N + 8):
    _clear()
    time.sleep(0.01)
    sel = ((7 * k + 3) % 64,)
    t = time.perf_counter()
    be.read(arr, normalize_selection(lay.shape, sel), sel, options=None, progress=None, cancel=None, where="device")
    total.append(time.perf_counter() - t)
srv.close()
print(f"{rel}: plane {np.median(total[8:]) * 1e3:.2f} ms, of which _to_gpu {np.median(spent[8:]) * 1e6:.1f} us")
