"""zarr v2 compressed chunks decoded on the GPU inside :func:`gpu_zarr.zarr_io.gpu_zarr_context`.

zarr-python 3.4's ``enable_gpu()`` hands the compressed bytes of a zarr v2 chunk to its
numcodecs compressor as a device array, which numcodecs cannot read ("Unable to avoid
copy"): every OME-Zarr 0.4 image fails. While the context is active, zarr's v2 codec
decodes its batches through the direct engine's codec stages instead (the same host check
and batched nvCOMP decode as :func:`gpu_zarr.engine.read`: one implementation): zstd,
Blosc, gzip and zlib on the GPU. Any other numcodecs codec (or filters) round-trips
through the host, with one warning that names it. zarr's own configuration (``enable_gpu``)
is process-wide, and so is this switch; it is restored when the outermost context exits.
"""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from gpu_zarr.engine import decode_chunks
from gpu_zarr.engine.layout import chunk_layout, codec_of_v2_compressor
from gpu_zarr.errors import UnsupportedArrayError

__all__ = ["gpu_v2_decoding"]

_lock = threading.Lock()
_depth = 0
_original: Any = None
_warned: set[str] = set()


def _is_gpu(spec: Any) -> bool:
    return bool(spec.prototype.buffer.__module__.endswith(".gpu"))


def _host_round_trip(codec: Any, items: list[tuple[Any, Any]]) -> list[Any]:
    """numcodecs on the host, then one copy per chunk to the device."""
    import cupy

    name = codec.compressor.codec_id if codec.compressor is not None else "none"
    what = f"compressor {name!r}" + (f" with filters {[f.codec_id for f in codec.filters]}" if codec.filters else "")
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"gpu_zarr_context: {what} has no GPU decoder; its chunks are decoded on the host and "
                      "copied to the GPU", stacklevel=3)
    out: list[Any] = []
    for chunk_bytes, spec in items:
        if chunk_bytes is None:
            out.append(None)
            continue
        data: Any = chunk_bytes.as_numpy_array()
        if codec.compressor is not None:
            data = codec.compressor.decode(data)
        for f in reversed(codec.filters or ()):
            data = f.decode(data)
        arr = np.frombuffer(memoryview(np.ascontiguousarray(data)).cast("B"), np.uint8)
        dtype = np.dtype(spec.dtype.to_native_dtype())
        host = arr.view(dtype).reshape(spec.shape, order=spec.order)
        if not dtype.isnative:
            host = host.astype(dtype.newbyteorder("="))
        out.append(spec.prototype.nd_buffer.from_ndarray_like(cupy.asarray(host)))
    return out


def _decode_on_gpu(codec: Any, items: list[tuple[Any, Any]], stage: str, params: dict[str, Any]) -> list[Any]:
    present = [k for k, (b, _) in enumerate(items) if b is not None]
    out: list[Any] = [None] * len(items)
    if not present:
        return out
    spec = items[present[0]][1]
    dtype = np.dtype(spec.dtype.to_native_dtype())
    lay = chunk_layout(tuple(spec.shape), dtype, stage, params)
    encoded = [items[k][0].as_numpy_array() for k in present]
    buf, offsets = decode_chunks(lay, encoded, names=[f"chunk {k} of the batch" for k in present])
    n = lay.inner_nbytes
    for k, off in zip(present, offsets.tolist()):
        arr = buf[off:off + n].view(dtype).reshape(items[k][1].shape, order=items[k][1].order)
        out[k] = items[k][1].prototype.nd_buffer.from_ndarray_like(arr)
    return out


async def _decode(self: Any, chunks_and_specs: Iterable[tuple[Any, Any]]) -> Iterable[Any]:
    items = list(chunks_and_specs)
    if not items or not _is_gpu(items[0][1]):
        return await _original(self, items)
    dtype = np.dtype(items[0][1].dtype.to_native_dtype())
    shapes = {tuple(s.shape) for _, s in items}
    try:
        if self.filters or not dtype.isnative or dtype.kind not in "biufc" or len(shapes) != 1:
            raise UnsupportedArrayError("not for the engine's stages")
        stage, params = codec_of_v2_compressor(self.compressor, dtype)
    except UnsupportedArrayError:
        return await asyncio.to_thread(_host_round_trip, self, items)
    return await asyncio.to_thread(_decode_on_gpu, self, items, stage, params)


@contextmanager
def gpu_v2_decoding() -> Iterator[None]:
    """While active, zarr v2 compressed chunks read with GPU buffers decode through the engine."""
    global _depth, _original
    from zarr.codecs._v2 import V2Codec

    with _lock:
        if _depth == 0:
            _original = V2Codec.decode
            V2Codec.decode = _decode  # type: ignore[method-assign]
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                V2Codec.decode = _original  # type: ignore[method-assign]
