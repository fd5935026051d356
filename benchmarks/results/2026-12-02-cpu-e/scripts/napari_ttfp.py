"""napari's reader: time to the first plane (the coarsest level's first plane, as the remote
open test reads it) of a remote OME-Zarr with 4 levels and labels, a new server each time
(20 ms a request), median of 5; and how many obstore stores an open built.
Usage: python napari_ttfp.py {0.4|0.5}"""
import pathlib
import sys
import tempfile
import time

import numpy as np

import gpu_zarr.location as location
from gpu_zarr.bench.remote import _clear
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.napari_plugin._reader import napari_get_reader
from gpu_zarr.sample import write_sample_omezarr

ver = sys.argv[1] if len(sys.argv) > 1 else "0.5"
d = pathlib.Path(tempfile.mkdtemp())
write_sample_omezarr(d / "a.ome.zarr", version=ver, shape=(2, 4, 256, 256), levels=4, labels=True,
                     compressor="zstd" if ver == "0.5" else "blosc", chunks=(1, 4, 64, 64))
built = [0]
make = location._make_store


def counting(loc: location.Location) -> object:
    built[0] += 1
    return make(loc)


location._make_store = counting
res = []
for it in range(6):
    with ServerProcess(d, latency=0.02) as srv:
        _clear()
        location.clear_metadata_cache()
        built[0] = 0
        url = f"{srv.url}/a.ome.zarr"
        t = time.perf_counter()
        layers = napari_get_reader(url)(url)
        data = layers[0][0]
        coarsest = data[-1] if isinstance(data, list) else data
        np.asarray(coarsest[(0,) * (coarsest.ndim - 2)])
        if it:
            res.append(1e3 * (time.perf_counter() - t))
print(f"OME-Zarr {ver} napari first plane: median {np.median(res):.1f} ms [{min(res):.1f}-{max(res):.1f}], "
      f"obstore stores built per open: {built[0]}")
