"""Stand-in for czarr (tests only): configure_gpu() is a no-op, reads go through zarr."""
import contextlib

__version__ = "0.0.1-fake"
def configure_gpu():
    return contextlib.nullcontext()
