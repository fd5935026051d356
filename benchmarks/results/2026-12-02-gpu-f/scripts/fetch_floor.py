"""The transfer floor of a whole read of the remote sharded array (8 shards): the native HTTP
client fetching the shards' bytes into touched buffers, one native call against several calls
on threads, a call's receiving threads (agents), and shards cut into ranges; TensorStore's whole read beside. Nothing decoded.
Usage: python fetch_floor.py WORKDIR [LATENCY_MS]"""
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from gpu_zarr.bench.remote import _clear, _host, _tensorstore, _volumes, _write
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.engine.native_http import HttpClient, new_requests

wd = Path(sys.argv[1])
lat = float(sys.argv[2]) if len(sys.argv) > 2 else 20
i = 1
vname, spec = list(_volumes("full").items())[i]
rel = f"remote-full-{i}"
_write(wd / rel, spec)
shards = sorted(p for p in (wd / rel).rglob("*") if p.is_file() and p.name != "zarr.json")
sizes = [p.stat().st_size for p in shards]
print(vname, len(shards), "shards,", sum(sizes) >> 20, "MiB", flush=True)
cli = HttpClient()
bufs = [np.ones(s + 1, np.uint8) for s in sizes]


def fetch(urls, parts, calls, agents=None):
    jobs = []  # (url, start, end, dest)
    for u, s, b in zip(urls, sizes, bufs):
        cut = np.linspace(0, s, parts + 1).astype(np.int64)
        for a, e in zip(cut[:-1], cut[1:]):
            jobs.append((u, int(a), int(e), b[a:e + 1]))
    groups = [jobs[k::calls] for k in range(calls)]

    def one(g):
        reqs = new_requests(len(g))
        reqs["start"] = [j[1] for j in g]
        reqs["end"] = [j[2] for j in g]
        cli.fetch([j[0] for j in g], reqs, [j[3] for j in g], 64, agents=agents)
        assert (reqs["status"] == 206).all(), reqs["status"]
    if calls == 1:
        one(groups[0])
    else:
        list(pool.map(one, groups))


pool = ThreadPoolExecutor(16)
with ServerProcess(wd, latency=lat / 1000) as srv:
    urls = [f"{srv.url}/{p.relative_to(wd).as_posix()}" for p in shards]
    ts = _tensorstore(f"{srv.url}/{rel}")
    _host(ts((0,)))
    for parts, calls, agents in ((1, 1, 1), (1, 2, 1), (1, 4, 1), (1, 8, 1), (2, 1, 1), (4, 1, 1), (4, 4, 1), (8, 8, 1),
                                 (1, 1, 2), (1, 1, 4), (1, 1, 8), (4, 1, 4), (1, 1, None), (1, 1, 1)):
        fetch(urls, parts, calls, agents)
        ms = []
        for rep in range(7):
            t = time.perf_counter()
            fetch(urls, parts, calls, agents)
            ms.append(1e3 * (time.perf_counter() - t))
        print(f"{lat:.0f} ms: {parts} ranges a shard, {calls} native calls of {agents or 'auto'} threads: "
              + " ".join(f"{m:.0f}" for m in ms)
              + f" median {np.median(ms):.1f}", flush=True)
    tms = []
    for rep in range(7):
        _clear()
        t = time.perf_counter()
        ts(Ellipsis)
        tms.append(1e3 * (time.perf_counter() - t))
    print(f"{lat:.0f} ms: tensorstore whole read: median {np.median(tms):.1f}", flush=True)
