"""What the writer reads from: a numpy array, a cupy array, a dask array of either, or any
region reader (``convert`` reads a stored array through it).

``read(regions)`` returns one block per region; a dask source computes all regions of one
batch in ONE ``dask.compute`` (shared tasks run once), so at most a batch of blocks is in
memory: blocks are written as they are computed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpu_zarr.errors import UsageError

__all__ = ["Source", "as_source", "free_bytes", "is_cupy", "is_dask"]


def is_cupy(a: Any) -> bool:
    return hasattr(a, "__cuda_array_interface__")


def is_dask(a: Any) -> bool:
    return hasattr(a, "dask") and hasattr(a, "compute") and hasattr(a, "chunks")


def free_bytes(on_gpu: bool) -> int | None:
    """Free bytes of the memory whole arrays would go to (the GPU's, or the host's available
    memory); None when unknown."""
    try:
        if on_gpu:
            from gpu_zarr.engine.fit import device_memory

            return int(device_memory()[0])
        from gpu_zarr.engine.fit import host_available_bytes

        avail = host_available_bytes()
        return None if avail is None else int(avail)
    except Exception:  # noqa: BLE001 - no answer: the caller takes the bounded path
        return None


class Source:
    """Blocks of an array, region by region.

    Attributes
    ----------
    shape : tuple of int
    dtype : numpy.dtype
    kind : str
        "numpy", "cupy", "dask" or "reader".
    on_gpu : bool
        Whether the blocks come as cupy arrays.
    """

    def __init__(self, shape: Sequence[int], dtype: Any, kind: str, on_gpu: bool,
                 read: Callable[[Sequence[tuple[slice, ...]]], list[Any]], array: Any = None) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.kind = kind
        self.on_gpu = on_gpu
        self._read = read
        self.array = array  # the whole array for numpy / cupy / dask sources

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def read(self, regions: Sequence[tuple[slice, ...]]) -> list[Any]:
        return self._read(regions)


def as_source(data: Any) -> Source:
    """The :class:`Source` of a numpy, cupy or dask array (a Source is returned as it is).

    Raises
    ------
    UsageError
        Anything else, or an array of Python objects / strings.
    """
    if isinstance(data, Source):
        return data
    if is_dask(data):
        import dask

        meta = getattr(data, "_meta", None)
        on_gpu = is_cupy(meta) if meta is not None else False

        def read_dask(regions: Sequence[tuple[slice, ...]]) -> list[Any]:
            return list(dask.compute(*[data[r] for r in regions]))

        src = Source(data.shape, data.dtype, "dask", on_gpu, read_dask, data)
    elif is_cupy(data):
        src = Source(data.shape, data.dtype, "cupy", True, lambda rs: [data[r] for r in rs], data)
    elif isinstance(data, np.ndarray):
        src = Source(data.shape, data.dtype, "numpy", False, lambda rs: [data[r] for r in rs], data)
    else:
        raise UsageError(f"cannot write a {type(data).__name__}: expected a numpy array, a cupy array or a "
                         "dask array of either (np.asarray(x) first for other array-likes)")
    if src.dtype.kind not in "biufc":
        raise UsageError(f"cannot write dtype {src.dtype}: expected a bool, integer, float or complex dtype")
    return src
