"""HCS plate benchmark: a 96-well plate (8 x 12 wells) written by ome-zarr-py, read level by level.

Run as::

    python3 benchmarks/bench_plate.py                      # 96 wells, 2 channels, 256x256 fields, 3 levels
    python3 benchmarks/bench_plate.py --field 64 --repeat 1 --out OUT   # CI size

For each level it times (median of ``--repeat``) the whole plate image of one channel, as
napari shows it when zoomed out: ours (``gpu_zarr.plate.open_plate(...).level(n)``, the
wells' chunks in one engine read) against napari-ome-zarr's pyramid (``get_pyramid_lazy``: one
dask array per well, concatenated, ``np.asarray``). Opening (metadata) is timed too. Every
result is checked equal to napari-ome-zarr's. Prints a Markdown table (and writes it and JSON
to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

CHANNELS = [
    {"label": "DAPI", "color": "0000FF", "window": {"start": 0, "end": 4000, "min": 0, "max": 65535}, "active": True},
    {"label": "GFP", "color": "00FF00", "window": {"start": 0, "end": 4000, "min": 0, "max": 65535}, "active": True},
]


def write_plate(path: Path, *, version: str = "0.5", rows: str = "AB", columns: tuple[str, ...] = ("1", "2", "3"),
                wells: tuple[str, ...] = ("A/1", "A/3", "B/2", "B/3"), fields: int = 2,
                shape: tuple[int, ...] = (2, 1, 64, 48), chunks: tuple[int, ...] = (1, 1, 32, 32),
                levels: int = 3, drop_well: str | None = "B/3", drop_field: str | None = "A/3/1",
                seed: int = 3) -> Path:
    """A plate (rows x columns, ``wells`` listed) of ``fields`` fields each, written by ome-zarr-py.

    ``drop_well`` is listed in the plate metadata but deleted afterwards, ``drop_field``
    listed in its well but deleted: readers must fill them, not fail.
    """
    import zarr
    from ome_zarr.format import FormatV04, FormatV05
    from ome_zarr.writer import write_image, write_plate_metadata, write_well_metadata
    from ome_zarr_models.common.omero import Omero

    fmt = FormatV04() if version == "0.4" else FormatV05()
    root = zarr.open_group(str(path), mode="w", zarr_format=2 if version == "0.4" else 3)
    write_plate_metadata(root, list(rows), list(columns), list(wells), fmt=fmt, field_count=fields,
                         name=path.name.removesuffix(".zarr"), acquisitions=[{"id": 0, "name": "first"}])
    rng = np.random.default_rng(seed)
    omero = Omero.model_validate({"channels": CHANNELS[: shape[0]]})
    for w in wells:
        r, c = w.split("/")
        wg = root.require_group(r).require_group(c)
        write_well_metadata(wg, [{"path": str(f), "acquisition": 0} for f in range(fields)], fmt=fmt)
        for f in range(fields):
            img = rng.integers(1, 4000, shape, dtype=np.uint16)
            write_image(img, wg.require_group(str(f)), scale_factors=tuple(2 ** k for k in range(1, levels)),
                        axes="czyx"[-len(shape):], fmt=fmt, storage_options={"chunks": chunks}, omero=omero)
    for gone in (drop_well, drop_field):
        if gone:
            shutil.rmtree(path / gone)
    return path



def _median(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def run(field: int = 256, repeat: int = 3, backend: str = "auto", workdir: Path | None = None,
        version: str = "0.4") -> list[dict]:
    """Rows of the benchmark (one per level, plus the open), checked against napari-ome-zarr."""
    import zarr
    from napari_ome_zarr.plate import get_pyramid_lazy

    from gpu_zarr.plate import open_plate

    base = Path(workdir or tempfile.mkdtemp(prefix="plate-bench-"))
    rows, cols = "ABCDEFGH", tuple(str(c) for c in range(1, 13))
    wells = tuple(f"{r}/{c}" for r in rows for c in cols)
    path = write_plate(base / f"plate96-{version}.zarr", version=version, rows=rows, columns=cols, wells=wells,
                       fields=1, shape=(2, 1, field, field), chunks=(1, 1, min(field, 256), min(field, 256)),
                       drop_well=None, drop_field=None)
    out = []
    t_ours, plate = _median(lambda: open_plate(path), repeat)
    t_ref, ref = _median(lambda: get_pyramid_lazy(zarr.open_group(str(path), mode="r")), repeat)
    out.append({"what": "open", "ours_ms": t_ours * 1e3, "ref_ms": t_ref * 1e3})
    for lv in range(plate.levels):
        view = plate.level(lv, backend=backend).index_axis(0, 0)  # as napari holds it: wells resolved on first read
        t0 = time.perf_counter()
        view[0]
        first = time.perf_counter() - t0
        t_ours, got = _median(lambda view=view: view[0], repeat)
        t_ref, want = _median(lambda lv=lv: np.asarray(ref[lv][0, 0]), repeat)
        np.testing.assert_array_equal(got, want)
        out.append({"what": f"level {lv} {tuple(want.shape)}", "ours_ms": t_ours * 1e3, "ref_ms": t_ref * 1e3,
                    "ours_first_ms": first * 1e3})
    return out


def markdown(rows: list[dict], field: int) -> str:
    lines = [f"96-well plate (8 x 12, 1 field of 2 x {field} x {field} uint16 each), one channel's plane, "
             "ms (median)", "", "| read | ours (gpu_zarr.plate) | ours, first read (wells' metadata read) "
             "| napari-ome-zarr (dask) "
             "| speed-up |", "|---|---|---|---|---|"]
    for r in rows:
        first = f"{r['ours_first_ms']:.1f}" if "ours_first_ms" in r else ""
        lines.append(f"| {r['what']} | {r['ours_ms']:.1f} | {first} | {r['ref_ms']:.1f} | {r['ref_ms'] / r['ours_ms']:.1f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--field", type=int, default=256, help="field size in pixels (square)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--version", default="0.4", choices=["0.4", "0.5"])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows = run(args.field, args.repeat, args.backend, version=args.version)
    md = markdown(rows, args.field)
    print(md)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "plate96.json").write_text(json.dumps(rows, indent=1))
        (args.out / "plate96.md").write_text(md + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
