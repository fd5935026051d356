"""Whole-array reads of a remote volume, ours and TensorStore's alternating: wall time, the
process's CPU time (user + system, every thread) and the server's (its own process).
Usage: python whole_cpu.py VOLUME [ROUNDS] [in-flight for ours]."""

import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, "/work/main/benchmarks/results/2026-12-02-cpu-e/scripts")
from _xserver import XServer  # noqa: E402

from gpu_zarr.bench.remote import _clear, _ours, _tensorstore  # noqa: E402

vol = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
if len(sys.argv) > 3:
    os.environ["GPU_ZARR_REMOTE_REQUESTS"] = sys.argv[3]
srv = XServer("/tmp/gzr", 0.02)
url = f"http://127.0.0.1:{srv.port}/{vol}"
readers = {"ours": _ours("cpu")(url), "ts": _tensorstore(url)}
rows: dict[str, list[tuple[float, float, float]]] = {k: [] for k in readers}


def server_cpu() -> float:
    with open(f"/proc/{srv.p.pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

for k, f in readers.items():
    f(...)
for _ in range(rounds):
    for k, f in readers.items():
        _clear()
        s0, r0, t0 = server_cpu(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        f(...)
        t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        time.sleep(0.05)  # (the server's last answers and its accounting)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        rows[k].append(((t1 - t0) * 1e3, cpu * 1e3, (server_cpu() - s0) * 1e3))
srv.close()
for k, v in rows.items():
    a = np.array(v)
    print(f"{vol} {k:5s} wall {np.median(a[:, 0]):6.0f} ms (min {a[:, 0].min():.0f})  cpu {np.median(a[:, 1]):6.0f} ms  "
          f"server cpu {np.median(a[:, 2]):6.0f} ms  [{' '.join(f'{w:.0f}/{c:.0f}/{x:.0f}' for w, c, x in v)}]")
