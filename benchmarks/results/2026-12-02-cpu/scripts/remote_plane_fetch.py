"""Where a remote plane's time goes on loopback (0 ms added per request, 2-core machine): the
engine's stages, then one obstore GET through our event-loop thread and called directly.
Run from the repository root with PYTHONPATH=src."""

import time
from pathlib import Path

import numpy as np
import obstore

from gpu_zarr.bench import remote as R
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.engine import EngineOptions, read
from gpu_zarr.engine.ops import CpuOps
from gpu_zarr.engine.remote import _LOOP
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.store import open_array

wd = Path("/tmp/rp/w")
wd.mkdir(parents=True, exist_ok=True)
spec = R._volumes("small")["zstd v3, 512 KiB chunks"]
R._write(wd / "remote-small-0", spec)
with ServerProcess(wd, latency=0) as srv:
    url = f"{srv.url}/remote-small-0"
    arr = open_array(url)
    opts = EngineOptions()
    ops = CpuOps(get_runtime().pool("cpu-decode", opts.threads), opts.threads, fast=True)
    read(arr, (0,), device="cpu", options=opts, ops=ops)
    agg: dict[str, list[float]] = {}
    for k in range(30):
        R._clear()
        res = read(arr, ((7 * k + 3) % 16,), device="cpu", options=opts, ops=ops)
        for key, v in res.stats.items():
            if isinstance(v, float):
                agg.setdefault(key, []).append(v * 1e3)
    print({k: round(float(np.median(v)), 3) for k, v in agg.items()})
    store = obstore.store.HTTPStore.from_url(url, client_options={"allow_http": True})

    async def one() -> bytes:
        r = await obstore.get_async(store, "c/3/0/0")
        return bytes(await r.bytes_async())
    ts = []
    for _ in range(30):
        t = time.perf_counter()
        _LOOP.run(one())
        ts.append(time.perf_counter() - t)
    print("one GET through the loop thread", round(float(np.median(ts)) * 1e3, 3), "ms")
    ts = []
    for _ in range(30):
        t = time.perf_counter()
        obstore.get(store, "c/3/0/0").bytes()
        ts.append(time.perf_counter() - t)
    print("one GET, sync", round(float(np.median(ts)) * 1e3, 3), "ms")
    for reader in ("tensorstore", "zarr"):
        f = {"tensorstore": R._tensorstore, "zarr": R._zarr}[reader](url)
        f((0,))
        ts = []
        for k in range(30):
            t = time.perf_counter()
            f(((7 * k + 3) % 16,))
            ts.append(time.perf_counter() - t)
        print(reader, "plane p50", round(float(np.median(ts)) * 1e3, 2), "ms")
