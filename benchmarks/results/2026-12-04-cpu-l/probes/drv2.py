import subprocess
import sys

import numpy as np

sys.path.insert(0, "/work/main/benchmarks/results/2026-12-02-cpu-e/scripts")
from _xserver import XServer

srv = XServer("/tmp/gzr", 0.02)
base = f"http://127.0.0.1:{srv.port}/remote-full-0"
for spin in ["0", "300", "0", "300"]:
    srv.dump()
    out = subprocess.run(
        ["/work/probe/drv2", "/work/main/src/gpu_zarr/engine/_native/libgz_native.so", base, "30", spin],
        capture_output=True,
        text=True,
    ).stdout
    log = srv.dump()
    rows = []
    for line in out.splitlines()[2:]:
        t0, ts, t1, rc, st = line.split()
        t0, ts, t1 = float(t0), float(ts), float(t1)
        mine = [e["time"] for e in log if t0 <= e["time"] <= t1]
        ends = [e["end"] for e in log if t0 <= e["time"] <= t1]
        rows.append(
            [(ts - t0) * 1e3, (min(mine) - t0) * 1e3, (max(mine) - t0) * 1e3, (max(ends) - t0) * 1e3, (t1 - t0) * 1e3]
        )
    print("spin", spin, "sent | first | last | last end | done", np.round(np.median(rows, axis=0), 3))
srv.close()
