"""Whole-array remote reads, ours (the CPU host path) and TensorStore alternated 6 times over
loopback HTTP: wall and process CPU time, median and best. Arguments: ms added per request, and
"each" to print every read's wall/CPU ms too.
Needs the volumes `gpu-zarr bench --remote --workdir /tmp/gzr` writes. Run with PYTHONPATH=src."""

import sys
import time
from pathlib import Path

import numpy as np

from gpu_zarr.bench import remote as R
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.engine import EngineOptions, read
from gpu_zarr.engine.ops import CpuOps
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.store import open_array


def timed(f):
    t, c = time.perf_counter(), time.process_time()
    f()
    return (time.perf_counter() - t) * 1e3, (time.process_time() - c) * 1e3


lat = float(sys.argv[1])
for i, (vname, spec) in enumerate(R._volumes("full").items()):
    rel = f"remote-full-{i}" + ("-v2" if spec["fmt"] == 2 else "")
    with ServerProcess(Path("/tmp/gzr"), latency=lat / 1000) as srv:
        url = f"{srv.url}/{rel}"
        arr = open_array(url)
        opts = EngineOptions()
        ops = CpuOps(get_runtime().pool("cpu-decode", opts.threads), opts.threads, fast=True)
        read(arr, (0,), device="cpu", options=opts, ops=ops)
        ts_read = R._tensorstore(url)
        ts_read((0,))
        res: dict[str, list[tuple[float, float]]] = {"ours": [], "tensorstore": []}
        for _ in range(6):
            R._clear()
            res["ours"].append(timed(lambda: read(arr, Ellipsis, device="cpu", options=opts, ops=ops)))
            res["tensorstore"].append(timed(lambda: ts_read(Ellipsis)))
        if sys.argv[2:] == ["each"]:  # every (wall, CPU) pair too: first reads of a process stand out
            for name, v in res.items():
                print(f"{vname:30s} {name:12s} " + " ".join(f"{w:.0f}/{c:.0f}" for w, c in v))
        for name, v in res.items():
            wall, cpu = np.array(v).T
            print(f"{vname:30s} {name:12s} wall median {np.median(wall):6.0f} best {wall.min():6.0f} ms, "
                  f"CPU median {np.median(cpu):6.0f} ms")
