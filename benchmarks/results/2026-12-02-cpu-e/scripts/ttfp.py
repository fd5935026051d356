"""Time to the first plane (open + metadata + plane 0) from a new server in its own process,
ours and TensorStore alternated; median of N. Usage: python ttfp.py REL LATENCY_MS [N]"""
import sys
import time

import numpy as np

from gpu_zarr.bench.remote import _clear, _ours, _tensorstore
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.location import clear_metadata_cache

rel, lat = sys.argv[1], float(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 8
got: dict[str, list[float]] = {"ours": [], "ts": []}
for it in range(n + 1):  # the first round warms the process up
    for name in got:
        with ServerProcess("/tmp/gzr", latency=lat / 1000) as srv:
            _clear()
            clear_metadata_cache()
            url = f"{srv.url}/{rel}"
            t = time.perf_counter()
            f = _ours("cpu")(url) if name == "ours" else _tensorstore(url)
            f((0,))
            if it:
                got[name].append(1e3 * (time.perf_counter() - t))
print(rel, lat, " ".join(f"{k} {np.median(v):.1f} [{min(v):.1f}-{max(v):.1f}]" for k, v in got.items()))
