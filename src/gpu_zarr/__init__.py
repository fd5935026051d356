"""napari-gpu-zarr: Zarr and OME-Zarr volumes onto an NVIDIA GPU, fast."""
