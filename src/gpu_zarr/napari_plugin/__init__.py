"""napari integration: reader, dock widget and sample data (contributed in napari.yaml).

This subpackage is the only part of :mod:`gpu_zarr` that imports napari, magicgui or
qtpy; nothing imports it unless napari loads the plugin.
"""

__all__: list[str] = []
