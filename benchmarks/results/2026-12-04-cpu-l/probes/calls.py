"""Every function called (Python and C) between a plane read's call and the native HTTP call."""

import sys, time  # noqa: E401, F401, I001

sys.path.insert(0, "/work/main/benchmarks/results/2026-12-02-cpu-e/scripts")
from _xserver import XServer  # noqa: I001
from gpu_zarr.bench.remote import _clear, _ours
import gpu_zarr.engine.native_http as nh

lib = nh._lib()[0]
real = lib.gz_http_fetch
state = {"on": False, "calls": []}


class F:
    def __call__(self, *a):
        state["on"] = False
        return real(*a)


lib.gz_http_fetch = F()


def prof(frame, event, arg):
    if not state["on"]:
        return
    if event == "call":
        c = frame.f_code
        state["calls"].append(f"py  {c.co_filename.split('site-packages/')[-1].split('src/')[-1]}:{c.co_name}")
    elif event == "c_call":
        state["calls"].append(f"c   {getattr(arg, '__qualname__', arg)}")


srv = XServer("/tmp/gzr", 0.0)
f = _ours("cpu")(f"http://127.0.0.1:{srv.port}/{sys.argv[1] if len(sys.argv) > 1 else 'remote-full-0'}")
for z in range(4):
    f((z,))  # noqa: E701
_clear()
sys.setprofile(prof)
state["on"] = True
f((9,))
sys.setprofile(None)
srv.close()
import collections  # noqa: E402, I001

cnt = collections.Counter(state["calls"])
print(len(state["calls"]), "calls,", len(cnt), "distinct")
for k, v in cnt.most_common():
    print(f"{v:4d} {k}")
