"""Time to the first plane of a remote array (open + metadata + one plane), ours against
TensorStore, on a shared monotonic clock with the server in a process of its own: when the
metadata answers left the server, when the plane's requests reached it, when the read was
done; every cache cleared before each (our metadata cache too), medians of N.
Usage: python first_plane_stages.py WORKDIR REL LATENCY_MS [N]"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../2026-12-02-cpu-e/scripts"))
from _xserver import XServer  # noqa: E402

from gpu_zarr.bench.remote import _clear, _ours, _tensorstore  # noqa: E402
from gpu_zarr.location import clear_metadata_cache  # noqa: E402

work, rel, lat = sys.argv[1], sys.argv[2], float(sys.argv[3])
N = int(sys.argv[4]) if len(sys.argv) > 4 else 8
srv = XServer(work, lat / 1000)
base = f"http://127.0.0.1:{srv.port}"
makers = {"ts": _tensorstore, "ours": _ours("cpu")}
for mk in makers.values():  # imports, the runtime's threads, TensorStore's context
    mk(f"{base}/{rel}")((1,))
rows: dict[str, list[list[float]]] = {k: [] for k in makers}
for _ in range(N):
    for name, mk in makers.items():
        _clear()
        clear_metadata_cache()
        srv.dump()
        t = time.monotonic()
        mk(f"{base}/{rel}")((0,))
        e = time.monotonic()
        log = srv.dump()
        meta = [x for x in log if x["path"].rsplit("/", 1)[-1] in ("zarr.json", ".zarray", ".zattrs", ".zgroup",
                                                                    ".zmetadata")]
        data = [x for x in log if x not in meta]
        ms = lambda v: 1e3 * (v - t)  # noqa: E731
        rows[name].append([len(meta), ms(max(x["end"] for x in meta)), ms(min(x["time"] for x in data)), ms(e)])
srv.close()
print(f"{rel} at {lat:.0f} ms, medians of {N} (ms from the open): metadata requests | last metadata answer sent | "
      "first plane request at the server | first plane done")
for name, v in rows.items():
    a = np.median(np.array(v), axis=0)
    print(f"  {name:6s} {a[0]:3.0f} | {a[1]:6.2f} | {a[2]:6.2f} | {a[3]:6.2f}")
