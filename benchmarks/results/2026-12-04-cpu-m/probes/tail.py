"""A remote plane's tail: from the last body's end (the native client's last `done` report) and
from the native call's return to the read's return, 10 ms idle before each plane (ms, medians).
Usage: python tail.py VOLUME [PLANES]."""

import builtins
import sys
import time

import numpy as np

sys.path.insert(0, "/work/main/benchmarks/results/2026-12-02-cpu-e/scripts")
from _xserver import XServer  # noqa: E402

import gpu_zarr.engine.native_http as nh  # noqa: E402
from gpu_zarr.bench.remote import _clear, _ours  # noqa: E402

pc = time.perf_counter_ns
lib = nh._lib()[0]
real = lib.gz_http_fetch
marks: dict[str, int] = {}
builtins.M = lambda lab: marks.__setitem__(lab, pc())  # (marks of tailmarks.py's copy of src, when it runs)
orig_dispatch = nh._dispatch


def dispatch(i: int) -> None:
    if i >= 0:
        marks.setdefault("first report", pc())
        marks["last report in"] = pc()
    orig_dispatch(i)
    if i >= 0:
        marks["last report out"] = pc()


class F:
    def __call__(self, *a):
        marks["native call"] = pc()
        rc = real(*a)
        marks["native return"] = pc()
        return rc


lib.gz_http_fetch = F()
nh._THUNK = nh._DONE(dispatch)
srv = XServer("/tmp/gzr", 0.02)
f = _ours("cpu")(f"http://127.0.0.1:{srv.port}/{sys.argv[1]}")
for z in range(8):
    f((z,))
rows = []
tails: list[dict[str, float]] = []
for k in range(int(sys.argv[2]) if len(sys.argv) > 2 else 40):
    _clear()
    time.sleep(0.01)
    marks.clear()
    t = pc()
    f(((7 * k + 3) % 64,))
    end = pc()
    rows.append([(marks[m] - t) / 1e6 for m in ("native call", "first report", "last report in", "last report out",
                                                  "native return")] + [(end - t) / 1e6])
    tails.append({m: (v - marks["native return"]) / 1e3 for m, v in marks.items() if v >= marks["native return"]})
srv.close()
a = np.median(np.array(rows), axis=0)
print("ms from the call: native call | first report | last report in | out | native return | read returns")
print(" | ".join(f"{v:.3f}" for v in a))
print(f"tail: last report in -> return {a[5] - a[2]:.3f} ms; native return -> return {a[5] - a[4]:.3f} ms")
for m in sorted(tails[0], key=lambda m: np.median([x.get(m, np.nan) for x in tails])):
    print(f"  {np.median([x.get(m, np.nan) for x in tails]):8.1f} us after the native return: {m}")
