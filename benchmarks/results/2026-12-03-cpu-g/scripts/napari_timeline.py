"""napari's reader on a remote OME-Zarr (4 levels, with or without labels) at 20 ms a request,
the server in a process of its own (its request log on the same monotonic clock: the fifth
session's XServer): time to the coarsest level's first plane, and the requests of the median
run on one timeline (ms from the call: reached the server, answered).
Usage: python napari_timeline.py {0.4|0.5} {labels|plain} [runs]"""
import pathlib
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "2026-12-02-cpu-e" / "scripts"))
from _xserver import XServer  # noqa: E402

from gpu_zarr.bench.remote import _clear  # noqa: E402
from gpu_zarr.location import clear_metadata_cache  # noqa: E402
from gpu_zarr.napari_plugin._reader import napari_get_reader  # noqa: E402
from gpu_zarr.sample import write_sample_omezarr  # noqa: E402

ver, kind = sys.argv[1], sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 9
d = pathlib.Path(tempfile.mkdtemp())
write_sample_omezarr(d / "a.ome.zarr", version=ver, shape=(2, 4, 256, 256), levels=4, labels=kind == "labels",
                     compressor="zstd" if ver == "0.5" else "blosc", chunks=(1, 4, 64, 64))
res = []
for it in range(runs + 1):
    srv = XServer(str(d), 0.02)
    try:
        _clear()
        clear_metadata_cache()
        url = f"http://127.0.0.1:{srv.port}/a.ome.zarr"
        t = time.monotonic()
        layers = napari_get_reader(url)(url)
        data = layers[0][0]
        coarsest = data[-1] if isinstance(data, list) else data
        np.asarray(coarsest[(0,) * (coarsest.ndim - 2)])
        done = time.monotonic()
        time.sleep(0.3)
        log = sorted(srv.dump(), key=lambda e: e["time"])
    finally:
        srv.close()
    if it:  # (the first run imports)
        res.append((1e3 * (done - t), [(1e3 * (e["time"] - t), 1e3 * ((e.get("end") or np.nan) - t),
                                        e["path"].split("/a.ome.zarr", 1)[1]) for e in log]))
res.sort(key=lambda r: r[0])
ms = [r[0] for r in res]
print(f"OME-Zarr {ver} {kind}: first plane median {np.median(ms):.1f} ms [{min(ms):.1f}-{max(ms):.1f}] of {runs}")
print("the median run's requests (ms from the call: sent -> answered):")
for s, e, p in res[len(res) // 2][1]:
    print(f"  {s:7.1f} -> {e:7.1f}  {p}")
