"""Where a GPU-decoded whole read of a remote sharded array spends its time (per-stage stats),
next to the CPU-decoded read and TensorStore, at 0 and 20 ms a request.
Usage: python gpu_whole_stats.py WORKDIR [VOLUME_INDEX ...]"""
import json
import sys
import time
from pathlib import Path

import numpy as np

from gpu_zarr.bench.remote import _clear, _host, _ours, _tensorstore, _volumes, _write
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.engine.pipeline import last_read_stats

wd = Path(sys.argv[1])
which = [int(a) for a in sys.argv[2:]] or [1]
vols = list(_volumes("full").items())
for i in which:
    vname, spec = vols[i]
    rel = f"remote-full-{i}" + ("-v2" if spec["fmt"] == 2 else "")
    _write(wd / rel, spec)
    for lat in (0, 20):
        with ServerProcess(wd, latency=lat / 1000) as srv:
            for name, mk in (("gpu", _ours("gpu")), ("cpu", _ours("cpu")), ("ts", _tensorstore)):
                r = mk(f"{srv.url}/{rel}")
                try:
                    _host(r((0,)))
                except Exception as exc:  # noqa: BLE001 - no GPU here: the other readers still run
                    print(name, "skipped:", type(exc).__name__, str(exc)[:100])
                    continue
                ms = []
                for rep in range(5):
                    _clear()
                    t = time.perf_counter()
                    out = r(Ellipsis)
                    if hasattr(out, "get"):
                        import cupy
                        cupy.cuda.Device().synchronize()
                    ms.append(1e3 * (time.perf_counter() - t))
                    st = last_read_stats() if name != "ts" else None
                print(f"{vname} {lat} ms {name}: " + " ".join(f"{m:.0f}" for m in ms) + f"  median {np.median(ms):.0f}")
                if st:
                    print("   ", json.dumps({k: (round(v * 1e3, 1) if isinstance(v, float) else v) for k, v in st.items()
                                             if isinstance(v, (int, float, str))}))
