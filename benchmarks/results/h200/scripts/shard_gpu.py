"""Whole reads of the sharded bench volume on the GPU path (as the benchmark's GPU reader),
the size of a decode group varied (``remote_read.GROUP_BYTES``, patched in this probe only),
TensorStore's in turns (fourteenth session). Prints per reader min/median ms, and for ours
the median fetch time and inner chunks taken before their shard was in.

    python shard_gpu.py WORKDIR VOLUME LATENCY_MS ROUNDS MIB,MIB,...
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
    import cupy

    import gpu_zarr.engine.remote_read as rr
    from gpu_zarr.engine.pipeline import _last

    wd, rel, lat, rounds = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    groups = [int(c) for c in sys.argv[5].split(",")]
    cupy.asarray(np.zeros(1, np.uint8)).get()
    with ServerProcess(wd, latency=lat / 1000) as srv:
        url = f"{srv.url}/{rel}"
        _warm(srv.url, wd, rel)
        ours = _ours("gpu")(url)
        ts = _tensorstore(url)
        ours((0,))
        ts((0,))
        times: dict[str, list[float]] = {f"group={g}MiB": [] for g in groups}
        times["tensorstore"] = []
        extra: dict[str, list[tuple[float, int]]] = {k: [] for k in times}
        for _ in range(rounds):
            for g in groups:
                rr.GROUP_BYTES = g << 20
                _clear()
                t = time.perf_counter()
                res = ours(Ellipsis)
                cupy.cuda.get_current_stream().synchronize()
                times[f"group={g}MiB"].append(time.perf_counter() - t)
                del res
                st = _last.stats
                extra[f"group={g}MiB"].append((st.get("fetch_s", 0.0), st.get("taken_early", 0)))
            _clear()
            t = time.perf_counter()
            ts(Ellipsis)
            times["tensorstore"].append(time.perf_counter() - t)
        for name, tt in times.items():
            e = extra[name]
            f = (f" fetch med {statistics.median([x for x, _ in e]) * 1e3:5.1f} early med "
                 f"{statistics.median([y for _, y in e]):4.0f}") if e else ""
            print(f"{rel} {lat:.0f} ms {name:13s} min {min(tt) * 1e3:6.1f} med {statistics.median(tt) * 1e3:6.1f}{f}  "
                  + " ".join(f"{x * 1e3:.1f}" for x in tt))


if __name__ == "__main__":
    main()
