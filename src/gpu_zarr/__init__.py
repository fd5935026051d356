"""napari-gpu-zarr: Zarr and OME-Zarr volumes onto an NVIDIA GPU, fast.

Headless API (importing this package imports no napari, Qt, cupy, kvikio or nvCOMP):

- :func:`read_zarr_to_gpu` — a whole array onto the GPU by the fastest path.
- :func:`read_region` — ``array[selection]`` through a backend (cupy or numpy).
- :func:`read_zarr` — a read with its measurements (backend, reason, GiB/s).
- :func:`choose_backend` — which backend serves an array here, and why.
- :func:`gpu_zarr_context` — zarr-python returning cupy, zstd decoded by nvCOMP.
- :func:`read_omezarr` — an OME-Zarr level as a zarr array, with its resolution.
- :func:`probe` — what this machine offers (GPU, kvikio, GDS, nvCOMP).
- :func:`write_zarr` / :func:`write_ome_zarr` — write zarr (v3 sharded, v3, v2) and OME-Zarr
  (0.5, 0.4) with pyramids, channels and labels, encoded on the GPU (nvCOMP) or CPU threads.
- :func:`to_dask` — a dask array (one per OME-Zarr level) read block by block on the
  workers' GPUs (needs the ``dask`` extra).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "read_zarr_to_gpu": "gpu_zarr.zarr_io",
    "read_zarr_via_zarr_gpu": "gpu_zarr.zarr_io",
    "read_zarr": "gpu_zarr.zarr_io",
    "choose_backend": "gpu_zarr.zarr_io",
    "gpu_zarr_context": "gpu_zarr.zarr_io",
    "read_region": "gpu_zarr.zarr_io",
    "read_omezarr": "gpu_zarr.omezarr",
    "probe": "gpu_zarr.capabilities",
    "to_dask": "gpu_zarr.dask_array",
    "write_zarr": "gpu_zarr.write.api",
    "write_ome_zarr": "gpu_zarr.write.omezarr",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'gpu_zarr' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
