"""CPU and wall time of fetching a remote array's 256 chunks (81 MiB) and one plane's 4 chunks over
loopback HTTP: obstore through our event loop, the native client into fresh and into reused
(prefaulted) buffers, TensorStore's kvstore. Argument: seconds added per request. Needs the
volumes `gpu-zarr bench --remote --workdir /tmp/gzr` writes. Run with PYTHONPATH=src."""

import asyncio
import sys
import time
from pathlib import Path

import numpy as np
import obstore
import tensorstore as ts

from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.engine import native_http as nh
from gpu_zarr.engine.remote import _LOOP

with ServerProcess(Path("/tmp/gzr"), latency=float(sys.argv[1])) as srv:
    url = f"{srv.url}/remote-full-0"
    store = obstore.store.HTTPStore.from_url(url, client_options={"allow_http": True})
    keys = [f"c/{z}/{y}/{x}" for z in range(64) for y in (0, 1) for x in (0, 1)]
    kv = ts.KvStore.open({"driver": "http", "base_url": url}).result()
    client = nh.HttpClient()

    async def one(k, sem):
        async with sem:
            r = await obstore.get_async(store, k)
            return await r.bytes_async()

    async def obstore_all(ks):
        sem = asyncio.Semaphore(64)
        return await asyncio.gather(*(one(k, sem) for k in ks))

    def native(ks, bufs=None):
        reqs = nh.new_requests(len(ks))
        reqs["end"] = -1
        client.fetch([f"{url}/{k}" for k in ks], reqs, bufs or [np.empty(700000, np.uint8) for _ in ks], 64)
        assert (reqs["status"] == 200).all()

    reused = [np.zeros(700000, np.uint8) for _ in keys]

    def timed(f):
        t, c = time.perf_counter(), time.process_time()
        f()
        return round((time.perf_counter() - t) * 1e3, 1), round((time.process_time() - c) * 1e3)

    for _ in range(3):
        print("whole (wall ms, CPU ms): obstore", timed(lambda: _LOOP.run(obstore_all(keys))),
              "native", timed(lambda: native(keys)), "native, reused buffers", timed(lambda: native(keys, reused)),
              "tensorstore", timed(lambda: [f.result() for f in [kv.read(k) for k in keys]]))
    for _ in range(3):
        plane = keys[12:16]
        print("plane: obstore", timed(lambda: _LOOP.run(obstore_all(plane))), "native", timed(lambda: native(plane)),
              "tensorstore", timed(lambda: [f.result() for f in [kv.read(k) for k in plane]]))
