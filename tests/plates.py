"""HCS plates written by ome-zarr-py (the reference writer), for the plate tests and benchmark."""

from __future__ import annotations

import shutil
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
