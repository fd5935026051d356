import builtins
import os
import sys
import time

import numpy as np

pc = time.perf_counter_ns
marks = []
builtins.M = lambda lab: marks.append((lab, pc()))
sys.path.insert(0, "/work/main/benchmarks/results/2026-12-02-cpu-e/scripts")
from _xserver import XServer  # noqa: E402

import gpu_zarr.engine.native_http as nh  # noqa: E402
from gpu_zarr.bench.remote import _clear, _ours  # noqa: E402

lib = nh._lib()[0]
real = lib.gz_http_fetch


class F:
    def __call__(self, *a):
        marks.append(("NATIVE", pc()))
        return real(*a)


lib.gz_http_fetch = F()
srv = XServer("/tmp/gzr", 0.02)
f = _ours("cpu")(f"http://127.0.0.1:{srv.port}/{sys.argv[1] if len(sys.argv) > 1 else 'remote-full-0'}")
for z in range(8):
    f((z,))
rows = {}
IDLE = float(os.environ.get("IDLE_S", "0.01"))
for k in range(40):
    _clear()
    time.sleep(IDLE)
    marks.clear()
    t = pc()
    M("call")  # noqa: F821
    f(((7 * k + 3) % 64,))
    prev = t
    seen = set()
    for lab, v in marks:
        if lab in seen:
            continue
        seen.add(lab)
        rows.setdefault(lab, []).append(((v - t) / 1e3, (v - prev) / 1e3))
        prev = v
        if lab == "NATIVE":
            break
srv.close()
for lab, v in sorted(rows.items(), key=lambda kv: np.median([a for a, _ in kv[1]])):
    a = np.array(v)
    print(f"{np.median(a[:, 0]):8.1f}  +{np.median(a[:, 1]):6.1f} us  {lab}")
