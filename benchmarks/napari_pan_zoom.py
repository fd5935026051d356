"""Pan, zoom and scroll in a real napari: our reader against napari-ome-zarr on the same store.

One OME-Zarr 0.4 store (zarr v2, zstd, a pyramid; written by ``gpu_zarr.sample``) is opened in
a shown napari viewer by each reader in turn. Each step changes the camera or the z slider as a
user does and times napari's own reaction to it: the canvas's draw handler (``on_draw``: the
level and region napari picks, widened to whole chunks on napari 0.9) and the slicing of every
layer it triggers, until the new data are handed to vispy. Steps:

- ``open``: ``viewer.open`` and the first draw;
- ``zoom in``: from the whole image (coarsest level) to level 0 at the centre;
- ``pan``: a quarter of the view at a time at level 0 (some pans stay inside the chunks napari
  already read: those take no read at all);
- ``scroll``: the z slider one plane at a time at level 0;
- ``zoom out``: back to the whole image.

The readers run in turns, twice (the first round warms Qt, vispy, imports and the page cache);
the second round is reported. Run under a display (``xvfb-run -a``) from the repository root;
it prints a Markdown table of median (max) ms per step::

    xvfb-run -a python benchmarks/napari_pan_zoom.py [--shape 2,16,2048,2048] [--chunk 256] [--steps 12]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

READERS = ("napari-gpu-zarr", "napari-ome-zarr")


def _events() -> None:
    from qtpy.QtWidgets import QApplication

    for _ in range(5):
        QApplication.processEvents()


def _draw(viewer) -> float:
    """One draw of the canvas as vispy runs it after a camera change; seconds."""
    _events()  # the camera's change reaches vispy through Qt events (not timed: no reading there)
    t0 = time.perf_counter()
    viewer.window._qt_viewer.canvas.on_draw(None)
    return time.perf_counter() - t0


def _center(viewer, layer, pixel) -> None:
    viewer.camera.center = (0, *(np.asarray(pixel, dtype=float) * layer.scale[-2:] + layer.translate[-2:]))


def run_reader(path: Path, plugin: str, steps: int) -> dict[str, list[float]]:
    """Every step's times (s) for one reader, in a fresh viewer."""
    import napari

    viewer = napari.Viewer(show=True)
    try:
        viewer.window._qt_window.resize(1200, 900)
        _events()
        t0 = time.perf_counter()
        layers = viewer.open(str(path), plugin=plugin)
        opened = time.perf_counter() - t0 + _draw(viewer)
        image = next(ly for ly in layers if ly.multiscale and type(ly).__name__ == "Image")
        ny, nx = image.level_shapes[0][-2:]
        times: dict[str, list[float]] = {"open": [opened], "zoom in": [], "pan": [], "scroll": [], "zoom out": []}
        rng = np.random.default_rng(0)
        for _ in range(3):
            viewer.camera.zoom = 0.02
            times["zoom out"].append(_draw(viewer))
            centre = np.array([ny / 2, nx / 2]) + rng.integers(-ny // 8, ny // 8, 2)
            _center(viewer, image, centre)
            viewer.camera.zoom = 4.0 / float(image.scale[-1])  # a level-0 pixel is 4 screen pixels
            times["zoom in"].append(_draw(viewer))
            view = np.asarray(viewer.window._qt_viewer.canvas._current_viewbox_size[::-1]) / 4  # pixels seen
            for i in range(steps):
                step = view / 4 * (1 if i % 8 < 4 else -1)
                centre = np.clip(centre + step, view / 2, [ny - view[0] / 2, nx - view[1] / 2])
                _center(viewer, image, centre)
                times["pan"].append(_draw(viewer))
            nz = int(viewer.dims.nsteps[0])
            for i in range(steps):
                t0 = time.perf_counter()
                viewer.dims.set_current_step(0, (i + 1) % nz)  # slices every layer at once
                times["scroll"].append(time.perf_counter() - t0)
        return times
    finally:
        viewer.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="2,16,2048,2048", help="c,z,y,x of level 0 (uint16)")
    ap.add_argument("--chunk", type=int, default=256, help="chunk side in y and x (one plane thick)")
    ap.add_argument("--levels", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12, help="pans and scroll steps per round (3 rounds)")
    ap.add_argument("--workdir", default=None, help="where the store is written (default: a temporary folder)")
    args = ap.parse_args(argv)
    import napari

    from gpu_zarr.sample import write_sample_omezarr

    shape = tuple(int(s) for s in args.shape.split(","))
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gz-pan-zoom-"))
    path = work / "pan-zoom.ome.zarr"
    if not path.exists():
        write_sample_omezarr(path, version="0.4", shape=shape, levels=args.levels,
                             chunks=(1, 1, args.chunk, args.chunk), seed=0)
    # a first round warms what the first viewer of a process pays for (Qt, vispy's shaders, the
    # readers' imports and thread pools, the page cache); the second round is reported
    results = {}
    for _round in range(2):
        results = {plugin: run_reader(path, plugin, args.steps) for plugin in READERS}
    print(f"napari {napari.__version__}, store {shape} uint16, chunks (1, 1, {args.chunk}, {args.chunk}), "
          f"{args.levels} levels, OME-Zarr 0.4; ms median (max)\n")
    print("| step | " + " | ".join(READERS) + " |")
    print("|---|" + "---|" * len(READERS))
    for step in results[READERS[0]]:
        cells = []
        for plugin in READERS:
            t = [x * 1e3 for x in results[plugin][step]]
            cells.append(f"{statistics.median(t):.1f} ({max(t):.1f})")
        print(f"| {step} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
