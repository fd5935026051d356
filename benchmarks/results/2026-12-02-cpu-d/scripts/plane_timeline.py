"""One plane of an open remote array on the CPU path, 20 ms a request: when the requests leave,
when the first and last answers arrive, when the read returns (median of 30 planes, ms from the
start of the read). Usage: python plane_timeline.py REL"""
import sys
import time

import numpy as np

import gpu_zarr.engine.remote as remote
from gpu_zarr.bench.remote import _clear
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.engine import read
from gpu_zarr.engine.layout import layout_of
from gpu_zarr.engine.ops import CpuOps
from gpu_zarr.engine.pipeline import EngineOptions
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.store import open_array

rel = sys.argv[1]
marks: list[tuple[str, float]] = []
_stream = remote.RemoteSource.stream


def stream(self, jobs, on_done, cap=None, arena=None):  # noqa: ANN001, ANN201 - a probe's wrapper
    marks.append(("stream", time.perf_counter()))

    def cb(i, got):  # noqa: ANN001, ANN202
        marks.append(("answer", time.perf_counter()))
        on_done(i, got)
    r = _stream(self, jobs, cb, cap, arena)
    marks.append(("end", time.perf_counter()))
    return r


remote.RemoteSource.stream = stream  # type: ignore[method-assign]
with ServerProcess("/tmp/gzr", latency=0.02) as srv:
    arr = open_array(f"{srv.url}/{rel}")
    lay = layout_of(arr)
    opts = EngineOptions()
    ops = CpuOps(get_runtime().pool("cpu-decode", opts.threads), opts.threads, fast=True)
    rows = []
    for k in range(30):
        _clear()
        marks.clear()
        t = time.perf_counter()
        read(arr, ((7 * k + 3) % 64,), device="cpu", options=opts, ops=ops, layout=lay)
        t1 = time.perf_counter()
        m: dict[str, list[float]] = {}
        for name, tt in marks:
            m.setdefault(name, []).append(1e3 * (tt - t))
        rows.append((1e3 * (t1 - t), m["stream"][0], m["answer"][0], m["answer"][-1], m["end"][0]))
    print("total {:.1f} | requests {:.2f} | first answer {:.2f} | last answer {:.2f} | stream end {:.2f}".format(
        *np.median(np.array(rows), axis=0)))
