"""The writer: zarr and OME-Zarr from numpy, cupy or dask arrays, encoded on the GPU (nvCOMP)
or on CPU threads (numcodecs, the CPU twin running the same planning and batching code).

- :func:`write_zarr` — one array: v3 sharded (crc32c shard index) by default, v3 unsharded, v2.
- :func:`write_ome_zarr` — an OME-Zarr 0.5 (or 0.4) image with its pyramid, channels and labels.
- :func:`convert` — any zarr or OME-Zarr the reader opens, into sharded OME-Zarr 0.5.
"""

from __future__ import annotations

import importlib

__all__ = ["WriteResult", "convert", "write_ome_zarr", "write_zarr"]

_EXPORTS = {
    "WriteResult": "gpu_zarr.write.api",
    "write_zarr": "gpu_zarr.write.api",
    "write_ome_zarr": "gpu_zarr.write.omezarr",
    "convert": "gpu_zarr.write.convert",
}


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'gpu_zarr.write' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)


def __dir__():
    return __all__
