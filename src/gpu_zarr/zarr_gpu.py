"""zarr-python on the GPU, through zarr's own extension points.

:class:`GpuCodecPipeline` is a zarr codec pipeline (selected with ``zarr.config``
``codec_pipeline.path``, the way zarrs-python plugs in): it decodes each batch of chunks
whose codec chain the direct engine knows (zarr v2 compressors zstd, Blosc, gzip, zlib or
none; zarr v3 ``[bytes]`` or ``[bytes, zstd | blosc | gzip]``, sharded inner chunks
included) with the engine's codec stages — the same host checks and ONE batched nvCOMP
call per batch as :func:`gpu_zarr.engine.read` — and hands every other chain to zarr's
own batched pipeline. Either way every decoded chunk is checked to have the chunk's shape
before zarr places it: a wrong-size, empty or undecodable chunk is a
:class:`~gpu_zarr.errors.CorruptChunkError` naming the chunk, never data.

:func:`gpu_decoding` is the scoped configuration (``enable_gpu()``, this pipeline, the
nvCOMP zstd codec) behind :func:`gpu_zarr.zarr_io.gpu_zarr_context`; nothing of zarr's is
patched, and zarr's configuration is restored on exit. With host buffers the same pipeline
decodes with the stages' CPU twins: that is what CI tests.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
from zarr.core.codec_pipeline import BatchedCodecPipeline
from zarr.registry import register_pipeline

from gpu_zarr import nvcomp_zstd, settings
from gpu_zarr.engine import choice
from gpu_zarr.engine.runtime import faults_as_errors, get_runtime
from gpu_zarr.errors import CorruptChunkError, GPUFault, UnsupportedArrayError
from gpu_zarr.nvcomp_zstd import is_gpu_prototype

__all__ = ["PIPELINE", "GpuCodecPipeline", "gpu_decoding", "read_on_gpu", "read_on_host", "to_native_order"]

#: the value of zarr's ``codec_pipeline.path`` that selects :class:`GpuCodecPipeline`
PIPELINE = "gpu_zarr.zarr_gpu.GpuCodecPipeline"

# the chunk keys of the batch being read (unsharded arrays), for error messages
_warned: set[str] = set()
_keys: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("gpu_zarr_chunk_keys", default=None)
#: the shard keys of the read in progress (their inner chunks have no keys of their own)
_shards: contextvars.ContextVar[list[tuple[str, str]] | None] = contextvars.ContextVar("gpu_zarr_shard_keys",
                                                                                      default=None)


def to_native_order(a: np.ndarray) -> np.ndarray:
    """``a`` with its values in native byte order (a copy only when it is not)."""
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def _engine_chain(pipe: BatchedCodecPipeline, dtype: np.dtype) -> tuple[str, dict[str, Any], str] | None:
    """(codec stage, parameters, memory order) when the engine's stages decode this chain
    to chunks in native byte order; None otherwise (zarr decodes it)."""
    from zarr.codecs import BytesCodec

    from gpu_zarr.engine.metadata import codec_of_chain, codec_of_v2_compressor

    if pipe.array_array_codecs or dtype.kind not in "biufc" or not (dtype.isnative or dtype.itemsize == 1):
        return None
    ab: Any = pipe.array_bytes_codec
    try:
        if type(ab).__name__ == "V2Codec":
            if getattr(ab, "filters", None):
                return None
            codec, params = codec_of_v2_compressor(ab.compressor, dtype)
            return codec, params, ""
        if isinstance(ab, BytesCodec):
            codec, endian, params = codec_of_chain((ab, *pipe.bytes_bytes_codecs), "array")
            if dtype.itemsize > 1 and endian not in ("little", None):
                return None
            return codec, params, "C"
    except UnsupportedArrayError:
        return None
    return None


def _refuse_pickle(codecs: Iterable[Any]) -> None:
    """zarr's own rule: the pickle codec executes code, so it is refused unless the user opted in."""
    import zarr

    if any(getattr(c, "codec_id", None) == "pickle" for c in codecs) and \
            zarr.config.get("array.allow_unsafe_pickle_decode", False) is not True:
        raise UnsupportedArrayError("refusing to decode chunks with the 'pickle' codec: unpickling data from a store "
                                    "can execute arbitrary code. Expected a numeric codec chain; found pickle.")


def _host_round_trip(codec: Any, items: list[tuple[Any, Any]], names: list[str]) -> list[Any]:
    """zarr v2 chunks whose compressor or filters have no GPU decoder: numcodecs on the host,
    one copy per chunk to the device (zarr would hand numcodecs device buffers it cannot read)."""
    import cupy

    _refuse_pickle((codec.compressor, *(codec.filters or ())))
    name = codec.compressor.codec_id if codec.compressor is not None else "none"
    what = f"compressor {name!r}" + (f" with filters {[f.codec_id for f in codec.filters]}" if codec.filters else "")
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"gpu_zarr_context: {what} has no GPU decoder; its chunks are decoded on the host and "
                      "copied to the GPU", stacklevel=3)
    out: list[Any] = []
    for (chunk_bytes, spec), label in zip(items, names):
        if chunk_bytes is None:
            out.append(None)
            continue
        data: Any = chunk_bytes.as_numpy_array()
        try:
            if codec.compressor is not None:
                data = codec.compressor.decode(data)
            for f in reversed(codec.filters or ()):
                data = f.decode(data)
        except Exception as exc:  # noqa: BLE001 - numcodecs' errors name no chunk
            raise CorruptChunkError(f"chunk {label}: {what} could not decode it: {type(exc).__name__}: {exc}") from exc
        arr = np.frombuffer(memoryview(np.ascontiguousarray(data)).cast("B"), np.uint8)
        dtype = np.dtype(spec.dtype.to_native_dtype())
        want = math.prod(spec.shape) * dtype.itemsize
        if arr.nbytes != want:
            raise CorruptChunkError(f"chunk {label}: expected {want} bytes decoded (shape {tuple(spec.shape)} {dtype}), "
                                    f"{what} gave {arr.nbytes}; the chunk is damaged or belongs to another array.")
        host = to_native_order(arr.view(dtype).reshape(spec.shape, order=spec.order))
        out.append(spec.prototype.nd_buffer.from_ndarray_like(cupy.asarray(host)))
    return out


def _where(byte_getter: Any) -> tuple[str, str]:
    """A chunk's key and its store (``("2.0.1", "file:///data/a.zarr")``), for messages."""
    path, store = getattr(byte_getter, "path", None), getattr(byte_getter, "store", None)
    if path is None:
        return str(byte_getter), ""
    return str(path), "" if store is None else str(store)


def _inner_name(what: str, shards: list[tuple[str, str]] | None) -> str:
    """``what`` (an inner chunk) of the shard it was read from, as the engine names it:
    ``"c/0/0 inner chunk (1, 3) of file:///data/a.zarr"``."""
    if not shards:
        return f"{what} of a shard"
    stores = {st for _, st in shards}
    store = f" of {shards[0][1]}" if len(stores) == 1 and shards[0][1] else ""
    if len(shards) == 1:
        return f"{shards[0][0]} {what}{store}"
    keys = ", ".join(k for k, _ in shards[:3]) + (" ..." if len(shards) > 3 else "")
    return f"{what} of one of the shards {keys}{store}"


def _key(byte_getter: Any) -> str:
    """A chunk's key and its store, for messages: ``"2.0.1 of file:///data/a.zarr"``; an inner
    chunk of a shard by the shard's key and its position there (zarr's sharding codec hands
    inner chunks to their pipeline with their coordinates in the shard, not a key)."""
    inner = getattr(byte_getter, "chunk_coords", None)
    if inner is not None and not hasattr(byte_getter, "path"):
        return _inner_name(f"inner chunk {tuple(int(c) for c in inner)}", _shards.get())
    path, store = _where(byte_getter)
    return f"{path} of {store}" if store else path


def _names(n: int) -> list[str]:
    keys = _keys.get()
    if keys is not None and len(keys) == n:
        return list(keys)
    shards = _shards.get()
    if shards:  # inner chunks decoded with no key of their own (older zarr's sharding codec)
        return [_inner_name(f"inner chunk #{k} of {n} read", shards) for k in range(n)]
    return [f"#{k} of a batch of {n} (inner chunks of a shard)" for k in range(n)]


def _check_shapes(out: list[Any], items: list[tuple[Any, Any]], names: list[str]) -> None:
    for got, (raw, spec), name in zip(out, items, names):
        if raw is None or got is None:
            continue
        if tuple(got.shape) != tuple(spec.shape):
            raise CorruptChunkError(f"chunk {name}: expected a chunk of shape {tuple(spec.shape)}, it decoded to shape "
                                    f"{tuple(got.shape)}; the chunk is damaged or belongs to another array.")


def _decode_with_stages(items: list[tuple[Any, Any]], codec: str, params: dict[str, Any], order: str,
                        names: list[str]) -> list[Any]:
    from gpu_zarr.engine import decode_chunks
    from gpu_zarr.engine.layout import chunk_layout

    present = [k for k, (b, _) in enumerate(items) if b is not None]
    out: list[Any] = [None] * len(items)
    if not present:
        return out
    spec = items[present[0]][1]
    dtype = np.dtype(spec.dtype.to_native_dtype())
    device = "gpu" if is_gpu_prototype(spec.prototype) else "cpu"
    lay = chunk_layout(tuple(spec.shape), dtype, codec, params)
    n = lay.inner_nbytes
    encoded = []
    for k in present:
        data = items[k][0].as_array_like()
        if device == "gpu" and hasattr(data, "__cuda_array_interface__"):
            data = data.get()  # the stages check encoded bytes on the host first
        data = np.frombuffer(memoryview(np.ascontiguousarray(data)).cast("B"), np.uint8)
        if codec == "raw" and data.nbytes != n:
            raise CorruptChunkError(f"chunk {names[k]}: expected {n} bytes of an uncompressed chunk of shape "
                                    f"{tuple(spec.shape)} {dtype}, found {data.nbytes}; the chunk is truncated, "
                                    "damaged or belongs to another array.")
        encoded.append(data)
    # a small batch (a viewer's tile) decodes on CPU threads, one copy to the GPU, when that is
    # estimated faster: nvCOMP's per-call latency costs more than it saves there (the engine's
    # choice, :mod:`gpu_zarr.engine.choice`)
    limit, on_gpu = settings.get("small_read"), device == "gpu"
    if on_gpu and limit and n * len(present) <= limit:
        est = choice.choose(choice.decode_rates(get_runtime()), choice.codec_key(lay), len(present), n * len(present),
                            settings.get("threads"), to_device=True, batch_bytes=settings.get("batch_bytes"))
        on_gpu = est.executor == "gpu"
    buf, offsets = decode_chunks(lay, encoded, names=[names[k] for k in present], device="gpu" if on_gpu else "cpu")
    if device == "gpu" and not on_gpu:
        import cupy

        buf = cupy.asarray(buf)
    for k, off in zip(present, offsets.tolist()):
        s = items[k][1]
        arr = buf[off:off + n].view(dtype).reshape(s.shape, order=order or s.order)
        out[k] = s.prototype.nd_buffer.from_ndarray_like(arr)
    return out


@dataclass(frozen=True)
class _Shards:
    """A sharding codec's index geometry (:class:`gpu_zarr.engine.sources.locate.ShardGeometry`)."""

    inner_per_shard: tuple[int, ...]
    index_crc: bool
    index_at_end: bool
    index_big_endian: bool


async def _check_shard_indexes(codec: Any, batch: list[Any]) -> None:
    """Check every shard's index of a batch as the engine does, before zarr reads the shards.

    zarr's sharding codec hands an inner chunk whatever bytes its index entry spans, cut at
    the shard's end: an entry whose size runs past the data gives Blosc, which ignores bytes
    after its stream, a chunk that decodes. The engine refuses such shards
    (:func:`~gpu_zarr.engine.sources.locate.index_entries`: entries inside the data, sizes not 0, the
    crc32c); so does this pipeline, for the price of the index read once more."""
    from zarr.abc.store import RangeByteRequest, SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype

    from gpu_zarr.engine.metadata import shard_index_format
    from gpu_zarr.engine.sources.locate import index_entries, index_nbytes

    try:
        index_at_end, index_crc, big = shard_index_format(codec)
    except UnsupportedArrayError:
        return  # an index format the engine does not parse (other index codecs): zarr's own checks only
    geo = _Shards(tuple(int(s) // int(c) for s, c in zip(batch[0][1].shape, codec.chunk_shape)),
                  index_crc, index_at_end, big)
    size = index_nbytes(geo)

    async def one(getter: Any) -> None:
        store, path = getattr(getter, "store", None), getattr(getter, "path", None)
        if store is None or path is None:
            return
        try:
            fsize = int(await store.getsize(path))
        except (FileNotFoundError, KeyError):
            return  # a missing shard: filled, as zarr does
        except Exception:  # noqa: BLE001 - no size (a server refusing HEAD, a store without getsize):
            return  # zarr's own checks only; zarr's own GET then meets any network failure itself
        req = SuffixByteRequest(size) if geo.index_at_end else RangeByteRequest(0, size)
        buf = await getter.get(prototype=default_buffer_prototype(), byte_range=req) if fsize >= size else None
        raw = b"" if buf is None else buf.to_bytes()
        index_entries(geo, _key(getter), raw, fsize)  # CorruptChunkError naming the shard

    # every check finishes before the first failure is raised (none left running on a closing loop)
    for res in await asyncio.gather(*(one(b[0]) for b in batch if b[1].shape), return_exceptions=True):
        if isinstance(res, BaseException):
            raise res


class GpuCodecPipeline(BatchedCodecPipeline):
    """zarr's batched codec pipeline, with the engine's batched decoders for the chains it knows.

    Select it with ``zarr.config.set({"codec_pipeline.path": gpu_zarr.zarr_gpu.PIPELINE})``
    (:func:`gpu_decoding` does, with GPU buffers). Writing is zarr's own.
    """

    async def read_batch(self, batch_info: Iterable[Any], out: Any, drop_axes: tuple[int, ...] = ()) -> Any:
        batch = list(batch_info)
        # a sharded batch: the keys are shards', its inner chunks are decoded by a pipeline of
        # their own (in tasks that inherit this context), named by shard
        partial = self.supports_partial_decode
        if partial and len(batch) > 1:
            # one shard per task, each with its own context: an inner chunk's error names its
            # shard, not "one of the shards ..." (zarr decodes the shards of a batch one by one
            # anyway; its concurrency limit still applies)
            limit = asyncio.Semaphore(max(1, int(zarr.config.get("async.concurrency") or 10)))

            async def one(item: Any) -> Any:
                async with limit:
                    return await self.read_batch([item], out, drop_axes)
            done = await asyncio.gather(*(one(b) for b in batch), return_exceptions=True)
            for res in done:
                if isinstance(res, BaseException):  # (every shard finished: none left writing into out)
                    raise res
            if all(res is None for res in done):  # zarr < 3.3: read_batch returns nothing
                return None
            return tuple(r for res in done for r in res)  # type: ignore[union-attr]  # zarr >= 3.3: one per chunk
        token = _keys.set(None if partial else [_key(b[0]) for b in batch])
        shard_token = _shards.set([_where(b[0]) for b in batch] if partial else _shards.get())
        try:
            if partial and type(self.array_bytes_codec).__name__ == "ShardingCodec":
                await _check_shard_indexes(self.array_bytes_codec, batch)
            return await super().read_batch(batch, out, drop_axes)
        finally:
            try:
                _shards.reset(shard_token)
                _keys.reset(token)
            except ValueError:  # a task zarr abandoned, closed in another context at exit: nothing to restore
                pass

    async def decode_batch(self, chunk_bytes_and_specs: Iterable[tuple[Any, Any]]) -> Iterable[Any]:
        items = list(chunk_bytes_and_specs)
        live = [s for b, s in items if b is not None]
        if not live:
            return [None] * len(items)
        names = _names(len(items))
        dtype = np.dtype(live[0].dtype.to_native_dtype())
        chain = _engine_chain(self, dtype) if len({tuple(s.shape) for s in live}) == 1 else None
        if chain is not None:
            return await asyncio.to_thread(_decode_with_stages, items, *chain, names)  # faults: GPUFault
        if dtype.kind == "O":
            raise UnsupportedArrayError(f"chunk {names[0]}: object dtypes are not read on the GPU (expected a numeric "
                                        "dtype); read this array with zarr-python on the CPU.")
        ab = self.array_bytes_codec
        if type(ab).__name__ == "V2Codec" and is_gpu_prototype(live[0].prototype):
            return await asyncio.to_thread(_host_round_trip, ab, items, names)
        try:
            with faults_as_errors(lambda: (names[:8], max(0, len(names) - 8))):
                out = list(await super().decode_batch(items))
        except (CorruptChunkError, MemoryError, GPUFault):
            raise
        except Exception as exc:  # noqa: BLE001 - zarr's and numcodecs' errors name no chunk
            if type(exc).__name__ == "PickleCodecDisabledError":
                raise
            raise CorruptChunkError(f"one of the chunks {', '.join(names[:4])}{' ...' if len(names) > 4 else ''} could not be "
                                    f"decoded: {type(exc).__name__}: {exc}") from exc
        _check_shapes(out, items, names)
        return out


register_pipeline(GpuCodecPipeline)


@contextmanager
def gpu_decoding() -> Iterator[None]:
    """zarr returns cupy arrays and decodes through :class:`GpuCodecPipeline` inside this block.

    zarr's configuration (``enable_gpu``, ``codec_pipeline.path``, ``codecs.zstd``) is set for
    the block and restored on exit, on exceptions and when nested; nothing is patched.
    """
    import zarr

    overrides: dict[str, object] = {"codec_pipeline.path": PIPELINE}
    if nvcomp_zstd.register_nvcomp_zstd():
        overrides.update(nvcomp_zstd.gpu_zstd_config())
    with zarr.config.enable_gpu(), zarr.config.set(overrides):
        yield


def read_on_host(arr: Any, selection: Any) -> np.ndarray:
    """``arr[selection]`` read by zarr-python into numpy through :class:`GpuCodecPipeline`
    (the engine stages' CPU twins for the chains they know, every chunk's size checked), in
    native byte order."""
    import zarr

    with zarr.config.set({"codec_pipeline.path": PIPELINE}):
        a = zarr.open_array(store=arr.store, path=arr.path, mode="r") if arr.store is not None else arr
        return to_native_order(np.asarray(a[selection]))


def read_on_gpu(arr: Any, selection: Any) -> Any:
    """``arr[selection]`` read by zarr-python into a cupy array, in native byte order."""
    import cupy
    import zarr

    if _big_endian(arr):
        # zarr-python's GPU buffers return big-endian values with their bytes unswapped:
        # decode on the host, then one copy to the device
        return cupy.asarray(to_native_order(np.asarray(arr[selection])))
    with gpu_decoding():
        # re-opened inside the block: an array keeps the codec pipeline it was opened with
        a = zarr.open_array(store=arr.store, path=arr.path, mode="r") if arr.store is not None else arr
        out = a[selection]
    if not isinstance(out, cupy.ndarray):
        out = cupy.asarray(to_native_order(np.asarray(out)))
    elif not out.dtype.isnative:
        out = out.astype(out.dtype.newbyteorder("="))
    return out


def _big_endian(arr: Any) -> bool:
    if arr.dtype.byteorder == ">":
        return True
    for codec in getattr(arr.metadata, "codecs", ()):
        inner = getattr(codec, "codecs", ())  # sharding
        for c in (codec, *inner):
            if type(c).__name__ == "BytesCodec" and getattr(c.endian, "value", c.endian) == "big":
                return True
    return False
