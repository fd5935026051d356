"""One plane of an open array: when its requests reach the server (its own process; a shared
monotonic clock), when the last answer left it, when the read was done; ours against
TensorStore, 10 ms idle before each plane (a viewer's pace), medians of 40.
Usage: python plane_xarrival.py REL [LATENCY_MS]"""
import sys
import time

import numpy as np
from _xserver import XServer

from gpu_zarr.bench.remote import _clear, _ours, _tensorstore

rel = sys.argv[1]
lat = float(sys.argv[2]) if len(sys.argv) > 2 else 20
srv = XServer("/tmp/gzr", lat / 1000)
url = f"http://127.0.0.1:{srv.port}/{rel}"
readers = {"ours": _ours("cpu")(url), "ts": _tensorstore(url)}
for f in readers.values():
    for z in range(8):
        f((z,))
srv.dump()
rows: dict[str, list[tuple[float, ...]]] = {k: [] for k in readers}
for k in range(40):
    z = (7 * k + 3) % 64
    for name, f in readers.items():
        _clear()
        time.sleep(0.01)
        t = time.monotonic()
        f((z,))
        e = time.monotonic()
        log = srv.dump()
        rows[name].append((1e3 * (min(x["time"] for x in log) - t), 1e3 * (max(x["time"] for x in log) - t),
                           1e3 * (max(x["end"] for x in log) - t), 1e3 * (e - t)))
srv.close()
for name, v in rows.items():
    a = np.median(np.array(v), axis=0)
    print(f"{rel} {name}: first request at the server {a[0]:.2f} ms, last {a[1]:.2f}, last answer sent {a[2]:.2f}, "
          f"done {a[3]:.2f}")
