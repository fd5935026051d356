"""What a plane read costs in Python before its first request: the native fetch is replaced by
one that raises at once (layout parsed once, as an open array's viewers read). Argument: the
volume (0 zstd, 1 sharded, 2 Blosc lz4 v2) of `gpu-zarr bench --remote --workdir /tmp/gzr`."""

import cProfile
import pstats
import sys
import time
from pathlib import Path

import gpu_zarr.engine.native_http as nh
from gpu_zarr.bench.remote import _clear, _volumes
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.engine import read
from gpu_zarr.engine.layout import layout_of
from gpu_zarr.engine.ops import CpuOps
from gpu_zarr.engine.pipeline import EngineOptions
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.store import open_array

i = int(sys.argv[1])
vname, spec = list(_volumes("full").items())[i]
rel = f"remote-full-{i}" + ("-v2" if spec["fmt"] == 2 else "")
opts = EngineOptions()
ops = CpuOps(get_runtime().pool("cpu-decode", opts.threads), opts.threads, fast=True)
orig = nh.HttpClient.fetch


class _Stop(Exception):
    pass


def fetch(self, *a, **k):
    raise _Stop()


with ServerProcess(Path("/tmp/gzr"), latency=0) as srv:
    arr = open_array(f"{srv.url}/{rel}")
    lay = layout_of(arr)
    read(arr, (0,), device="cpu", options=opts, ops=ops, layout=lay)
    nh.HttpClient.fetch = fetch
    pr = cProfile.Profile()
    ts = []
    for k in range(300):
        _clear()
        t = time.perf_counter()
        pr.enable()
        try:
            read(arr, ((7 * k + 3) % 64,), device="cpu", options=opts, ops=ops, layout=lay)
        except _Stop:
            pass
        pr.disable()
        ts.append(time.perf_counter() - t)
    ts.sort()
    print("pre-fetch median ms (with profiler)", 1e3 * ts[150])
    nh.HttpClient.fetch = fetch
    ts = []
    for k in range(300):
        _clear()
        t = time.perf_counter()
        try:
            read(arr, ((7 * k + 3) % 64,), device="cpu", options=opts, ops=ops, layout=lay)
        except _Stop:
            pass
        ts.append(time.perf_counter() - t)
    ts.sort()
    print("pre-fetch median ms", 1e3 * ts[150])
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)
