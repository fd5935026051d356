"""napari sample data: the synthetic OME-Zarr from :func:`gpu_zarr.sample.sample_path`."""

from __future__ import annotations

from gpu_zarr.napari_plugin._reader import LayerData, read_for_napari
from gpu_zarr.sample import sample_path

__all__ = ["make_sample_data"]


def make_sample_data() -> list[LayerData]:
    """Two-channel, three-level OME-Zarr 0.5 (zstd) with a label image.

    Written once to the cache folder (``$GPU_ZARR_CACHE`` or ``~/.cache/napari-gpu-zarr``;
    about 40 MiB on disk) and reused afterwards.
    """
    return read_for_napari(str(sample_path()))
