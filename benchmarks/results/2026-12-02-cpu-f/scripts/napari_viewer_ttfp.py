"""A real napari viewer (napari.Viewer(show=False), under xvfb-run) opening a remote OME-Zarr
0.5 (c, z, y, x; 4 levels; 20 ms a request, the server in its own process): the time until
viewer.open returns, by when napari has sliced the first layer at step 0 and then at the middle
of every axis (what the user sees first) and every channel layer there, and the chunk requests
it made. Three ways, alternated: as shipped (napari's tile of a level read lazily, the middle
plane asked for ahead), without the middle plane ahead, and the levels as plain GpuLazyArrays
with nothing ahead (before). Usage: xvfb-run -a python napari_viewer_ttfp.py [ROUNDS]"""
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
from gpu_zarr.lazy import GpuLazyArray
from gpu_zarr.location import clear_metadata_cache
from gpu_zarr.sample import write_sample_omezarr

_initialize_plugins()  # (a ViewerModel alone has not discovered the plugins' manifests)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
d = pathlib.Path(tempfile.mkdtemp())
write_sample_omezarr(d / "a.ome.zarr", version="0.5", shape=(2, 16, 512, 512), levels=4, labels=False,
                     compressor="zstd", chunks=(1, 1, 128, 128))
middle_ahead, level_kind = reader._middle_ahead, reader.ViewerLevel
modes = ("shipped", "no middle ahead", "before")
res: dict[str, list[float]] = {m: [] for m in modes}
reqs: dict[str, int] = {}
viewer = napari.Viewer(show=False)
for it in range((rounds + 1) * len(modes)):
    mode = modes[it % len(modes)]
    reader._middle_ahead = middle_ahead if mode == "shipped" else (lambda *a: None)
    reader.ViewerLevel = level_kind if mode != "before" else GpuLazyArray
    with ServerProcess(d, latency=0.02) as srv:
        _clear()
        clear_metadata_cache()
        srv.reset_counters()
        url = f"{srv.url}/a.ome.zarr"
        t = time.perf_counter()
        viewer.open(url, plugin="napari-gpu-zarr")
        ms = 1e3 * (time.perf_counter() - t)
        step = viewer.dims.current_step
        time.sleep(0.3)  # (a prefetch under way is counted too)
        if it >= len(modes):
            res[mode].append(ms)
            reqs[mode] = srv.requests
        viewer.layers.clear()
viewer.close()
for mode, v in res.items():
    print(f"{mode:16s} viewer.open (the first layer at step 0, then every layer at the middle step {step}): median "
          f"{statistics.median(v):.1f} ms [{min(v):.1f}-{max(v):.1f}], {reqs[mode]} requests")
