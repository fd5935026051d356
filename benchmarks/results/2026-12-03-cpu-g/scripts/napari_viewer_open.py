"""A real napari.Viewer (under Xvfb) opening a remote OME-Zarr 0.5 (4 levels of (c, z, y, x) =
(2, 16, 512, 512), 128^2 chunks of one plane; with or without labels) at 20 ms a request, the
server in a process of its own: how long viewer.open takes (napari slices the first layer at
step 0, then every visible layer at the middle step) and how many requests it made, a new
server each time, and how long of it the plugin's reader took (the layers' data and metadata;
napari then builds the layers and slices them). Run it with PYTHONPATH pointing at the code to
measure.
Usage: xvfb-run -a python napari_viewer_open.py {labels|plain} [rounds]"""
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
kind = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
d = pathlib.Path(tempfile.mkdtemp())
write_sample_omezarr(d / "a.ome.zarr", version="0.5", shape=(2, 16, 512, 512), levels=4, labels=kind == "labels",
                     compressor="zstd", chunks=(1, 1, 128, 128))
res: list[float] = []
took: list[float] = []
read_for_napari = reader.read_for_napari


def timed(*a: object) -> object:
    t0 = time.perf_counter()
    try:
        return read_for_napari(*a)  # type: ignore[arg-type]
    finally:
        took.append(1e3 * (time.perf_counter() - t0))


reader.read_for_napari = timed  # (napari_get_reader binds it when napari asks for a reader)
reqs = 0
viewer = napari.Viewer(show=False)
for it in range(rounds + 1):
    with ServerProcess(d, latency=0.02) as srv:
        _clear()
        clear_metadata_cache()
        srv.reset_counters()
        url = f"{srv.url}/a.ome.zarr"
        t = time.perf_counter()
        viewer.open(url, plugin="napari-gpu-zarr")
        ms = 1e3 * (time.perf_counter() - t)
        time.sleep(0.3)  # (requests asked for ahead and still under way are counted too)
        if it:  # (the first round imports)
            res.append(ms)
        else:
            took.clear()
            reqs = srv.requests
        layers = [(layer.name, type(layer).__name__) for layer in viewer.layers]
        viewer.layers.clear()
viewer.close()
print(f"{kind}: viewer.open median {statistics.median(res):.1f} ms [{min(res):.1f}-{max(res):.1f}] of {rounds} "
      f"(the reader {statistics.median(took):.1f} ms [{min(took):.1f}-{max(took):.1f}]), {reqs} requests, layers {layers}")
