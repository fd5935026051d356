"""Whole reads of the sharded bench volume, readers in turns in one process (fourteenth session):
ours with CPU decode (engine read, device cpu), ours on the GPU as the benchmark reads
(EngineBackend: nvCOMP groups), ours decoded on the host into page-locked memory then copied
to the GPU (the route a GPU read could take), and TensorStore's http kvstore.

    python shard_whole.py WORKDIR VOLUME LATENCY_MS ROUNDS
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

from gpu_zarr.bench.remote import _clear, _ours, _tensorstore, _warm
from gpu_zarr.bench.remote_server import ServerProcess


def main() -> None:
    wd, rel, lat, rounds = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    readers = sys.argv[5].split(",") if len(sys.argv) > 5 else ["cpu", "gpu", "host-gpu", "tensorstore"]
    from gpu_zarr.engine import read
    from gpu_zarr.engine.metadata import layout_of
    from gpu_zarr.engine.ops import CpuOps
    from gpu_zarr.engine.pipeline import EngineOptions
    from gpu_zarr.engine.runtime import get_runtime
    from gpu_zarr.store import open_array

    cupy = None
    if "gpu" in readers or "host-gpu" in readers:
        import cupy

        cupy.asarray(np.zeros(1, np.uint8)).get()
    with ServerProcess(wd, latency=lat / 1000) as srv:
        url = f"{srv.url}/{rel}"
        _warm(srv.url, wd, rel)
        opened = {}
        if "cpu" in readers:
            opened["cpu"] = _ours("cpu")(url)
        if "gpu" in readers:
            opened["gpu"] = _ours("gpu")(url)
        if "host-gpu" in readers:
            arr = open_array(url)
            lay = layout_of(arr)
            opts = EngineOptions()
            ops = CpuOps(get_runtime().pool("cpu-decode", opts.threads), opts.threads, fast=True)
            nbytes = int(np.prod(lay.shape)) * lay.out_dtype.itemsize
            mem = cupy.cuda.alloc_pinned_memory(nbytes)
            box = np.frombuffer(mem, lay.out_dtype, int(np.prod(lay.shape))).reshape(lay.shape)
            box[...] = 0
            dev = cupy.empty(lay.shape, lay.out_dtype)

            def host_gpu(sel, box=box, dev=dev, arr=arr, opts=opts, ops=ops, lay=lay):
                if sel is not Ellipsis:  # (the first plane)
                    return read(arr, sel, device="cpu", options=opts, ops=ops, layout=lay).data
                read(arr, sel, device="cpu", options=opts, ops=ops, layout=lay, out=box)
                dev.set(box)
                cupy.cuda.get_current_stream().synchronize()
                return dev
            opened["host-gpu"] = host_gpu
        if "tensorstore" in readers:
            opened["tensorstore"] = _tensorstore(url)
        for r in opened.values():
            r((0,))
        times = {k: [] for k in opened}
        for _ in range(rounds):
            for name, r in opened.items():
                _clear()
                t = time.perf_counter()
                out = r(Ellipsis)
                if cupy is not None and hasattr(out, "device"):
                    cupy.cuda.get_current_stream().synchronize()
                times[name].append(time.perf_counter() - t)
                del out
        for name, ts in times.items():
            print(f"{rel} {lat:.0f} ms {name:12s} min {min(ts) * 1e3:6.1f} med {statistics.median(ts) * 1e3:6.1f}  "
                  + " ".join(f"{x * 1e3:.1f}" for x in ts))


if __name__ == "__main__":
    main()
