"""A real napari viewer (headless ViewerModel, synchronous slicing) opening a remote OME-Zarr
0.5 (c, z, y, x; 4 levels; 20 ms a request, the server in its own process): the time until
viewer.open returns, by when napari has sliced the first layer at step 0 and then at the middle
of every axis (what the user sees first) and every channel layer there; with the reader's
middle-plane prefetch and without it (alternated). Usage: python napari_viewer_ttfp.py [ROUNDS]"""
import pathlib
import statistics
import sys
import tempfile
import time

import napari
from napari.plugins import _initialize_plugins

import gpu_zarr.napari_plugin._reader as reader
from gpu_zarr.bench.remote import _clear
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.location import clear_metadata_cache
from gpu_zarr.sample import write_sample_omezarr

_initialize_plugins()  # (a ViewerModel alone has not discovered the plugins' manifests)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
d = pathlib.Path(tempfile.mkdtemp())
write_sample_omezarr(d / "a.ome.zarr", version="0.5", shape=(2, 16, 512, 512), levels=4, labels=False,
                     compressor="zstd", chunks=(1, 1, 128, 128))
middle_ahead = reader._middle_ahead
res: dict[str, list[float]] = {"prefetch": [], "none": []}
for it in range(rounds * 2 + 2):
    mode = "prefetch" if it % 2 else "none"
    reader._middle_ahead = middle_ahead if mode == "prefetch" else (lambda *a: None)
    with ServerProcess(d, latency=0.02) as srv:
        _clear()
        clear_metadata_cache()
        viewer = napari.components.ViewerModel()
        url = f"{srv.url}/a.ome.zarr"
        t = time.perf_counter()
        viewer.open(url, plugin="napari-gpu-zarr")
        ms = 1e3 * (time.perf_counter() - t)
        step = viewer.dims.current_step
        if it >= 2:
            res[mode].append(ms)
        viewer.layers.clear()
time.sleep(0.2)
for mode, v in res.items():
    print(f"{mode:9s} viewer.open (first layer at step 0, then every layer at the middle step {step}): median "
          f"{statistics.median(v):.1f} ms [{min(v):.1f}-{max(v):.1f}]")
