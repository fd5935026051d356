import subprocess
import sys

import numpy as np

sys.path.insert(0, "/work/main/benchmarks/results/2026-12-02-cpu-e/scripts")
from _xserver import XServer

srv = XServer("/tmp/gzr", 0.02)
base = f"http://127.0.0.1:{srv.port}/remote-full-0"
subprocess.run(
    ["/work/probe/drv", "/work/main/src/gpu_zarr/engine/_native/libgz_native.so", base, "5"], capture_output=True
)
srv.dump()
rows = []
p = subprocess.Popen(
    ["/work/probe/drv", "/work/main/src/gpu_zarr/engine/_native/libgz_native.so", base, "30"],
    stdout=subprocess.PIPE,
    text=True,
)
lines = []
for line in p.stdout:
    lines.append(line)
log = srv.dump()
srv.close()
# split log per iteration by time
for line in lines:
    t0, ts, t1, rc, st = line.split()
    t0, ts, t1 = float(t0), float(ts), float(t1)
    mine = [e["time"] for e in log if t0 <= e["time"] <= t1]
    rows.append([(ts - t0) * 1e3, (min(mine) - t0) * 1e3, (max(mine) - t0) * 1e3, (t1 - t0) * 1e3])
print("C driver (new connections first call only), medians ms: sent | server first | server last | end")
print(np.median(np.array(rows[1:]), axis=0))
