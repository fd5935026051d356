"""napari's reader on a remote OME-Zarr 0.5 (4 levels; with or without labels), as a timeline:
when each request reached the server (its own process) and was answered, next to when the
reader, the layers and the first plane were done. Usage: python napari_xtimeline.py [labels]"""
import pathlib
import sys
import tempfile
import time

import numpy as np
from _xserver import XServer

from gpu_zarr.bench.remote import _clear
from gpu_zarr.location import clear_metadata_cache
from gpu_zarr.napari_plugin._reader import napari_get_reader
from gpu_zarr.sample import write_sample_omezarr

d = pathlib.Path(tempfile.mkdtemp())
write_sample_omezarr(d / "a.ome.zarr", version="0.5", shape=(2, 4, 256, 256), levels=4,
                     labels=sys.argv[1:] == ["labels"], compressor="zstd", chunks=(1, 4, 64, 64))
for it in range(4):
    srv = XServer(str(d), 0.02)
    url = f"http://127.0.0.1:{srv.port}/a.ome.zarr"
    _clear()
    clear_metadata_cache()
    t = time.monotonic()
    reader = napari_get_reader(url)
    t1 = time.monotonic()
    layers = reader(url)
    t2 = time.monotonic()
    data = layers[0][0]
    coarsest = data[-1] if isinstance(data, list) else data
    np.asarray(coarsest[(0,) * (coarsest.ndim - 2)])
    t3 = time.monotonic()
    time.sleep(0.1)  # the prefetches still under way
    log = sorted(srv.dump(), key=lambda e: e["time"])
    srv.close()
    if it < 2:
        continue
    print(f"get_reader {1e3 * (t1 - t):.1f} layers {1e3 * (t2 - t):.1f} plane {1e3 * (t3 - t):.1f} (ms)")
    for e in log:
        print(f"   {e['path'][12:]:28s} {e['range'][6:20]:12s} {1e3 * (e['time'] - t):6.1f} "
              f"{1e3 * ((e['end'] or e['time']) - t):6.1f}")
