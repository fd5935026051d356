import sys
import time
from pathlib import Path

from gpu_zarr.bench.remote import _clear, _host, _ours, _tensorstore, _volumes
from gpu_zarr.bench.remote_server import ServerProcess

wd = Path("/tmp/gzr")  # the volumes `gpu-zarr bench --remote --workdir /tmp/gzr` writes
lat = float(sys.argv[1])
vols = list(_volumes("full").items())
for i, (vname, spec) in enumerate(vols):
    rel = f"remote-full-{i}" + ("-v2" if spec["fmt"] == 2 else "")
    res = {"ours": [], "ts": []}
    for rep in range(4):
        with ServerProcess(wd, latency=lat / 1000) as srv:
            for name, mk in (("ours", _ours("cpu")), ("ts", _tensorstore)):
                _clear()
                t = time.perf_counter()
                r = mk(f"{srv.url}/{rel}")
                t1 = time.perf_counter()
                _host(r((0,)))
                res[name].append((1e3 * (t1 - t), 1e3 * (time.perf_counter() - t)))
    print(vname, {k: [f"{a:.0f}/{b:.0f}" for a, b in v] for k, v in res.items()})
