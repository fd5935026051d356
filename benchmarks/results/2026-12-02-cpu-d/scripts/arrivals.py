"""When the answers of a whole-array read arrive (stream_remote alone, no decode), ms from the
start: the sharded volume's 8 answers come within a few ms of each other at the end of the
transfer. Usage: python arrivals.py REL MS_PER_REQUEST"""
import sys
import time

from gpu_zarr.bench.remote import _clear
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.engine.layout import layout_of
from gpu_zarr.engine.plan import plan_pieces
from gpu_zarr.engine.remote import BodyArena
from gpu_zarr.engine.remote_fetch import stream_remote
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.store import open_array

rel = sys.argv[1]
with ServerProcess("/tmp/gzr", latency=float(sys.argv[2]) / 1000) as srv:
    arr = open_array(f"{srv.url}/{rel}")
    lay = layout_of(arr)
    assert lay.source is not None
    pieces = plan_pieces(lay, (0,) * len(lay.shape), lay.shape)
    for _ in range(3):
        _clear()
        ts: list[float] = []
        t0 = time.perf_counter()
        with BodyArena(get_runtime().host_scratch, 256 << 20) as arena:
            stream_remote(lay, pieces, lay.source, lambda a: ts.append(time.perf_counter() - t0), arena)
        step = max(1, len(ts) // 16)
        print(f"total {1e3 * (time.perf_counter() - t0):.1f} ms, {len(ts)} answers at",
              " ".join(f"{1e3 * t:.1f}" for t in ts[::step]))
