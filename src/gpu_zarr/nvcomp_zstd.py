"""GPU-accelerated zstd codec for zarr-python, backed by nvCOMP.

A stand-in for upstream zarr-python PR #2863 (``zarr.codecs.gpu.NvcompZstdCodec``): the
codec is registered under the name ``"zstd"`` (the on-disk name), so every existing zstd
array decodes on the GPU once :func:`gpu_zstd_config` is set, e.g. inside
:func:`gpu_zarr.zarr_io.gpu_zarr_context`. CPU-only workflows are unaffected.

All chunks of one ``decode`` call go to nvCOMP in one batched call (RAW bitstream, so
standard zstd frames); frames are checked on the host first because nvCOMP is undefined on
corrupt input. The batched call itself lives in :mod:`gpu_zarr.engine.decode`, shared with
the direct engine.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.abc.codec import BytesBytesCodec
from zarr.codecs.zstd import parse_checksum, parse_zstd_level
from zarr.core.common import parse_named_configuration

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Self

    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer
    from zarr.core.common import JSON

__all__ = ["NvcompZstdCodec", "gpu_zstd_config", "is_gpu_prototype", "register_nvcomp_zstd"]

QUALNAME = "gpu_zarr.nvcomp_zstd.NvcompZstdCodec"
_registered = False


def _decoded_nbytes(spec: ArraySpec) -> int:
    dtype: Any = spec.dtype.to_native_dtype() if hasattr(spec.dtype, "to_native_dtype") else spec.dtype
    return math.prod(int(s) for s in spec.shape) * np.dtype(dtype).itemsize


@dataclass(frozen=True)
class NvcompZstdCodec(BytesBytesCodec):
    """zstd codec that decodes/encodes on an NVIDIA GPU via nvCOMP.

    Parameters
    ----------
    level : int
        zstd level, kept in the metadata (nvCOMP's encoder has its own level).
    checksum : bool
        Whether written frames carry a content checksum.

    Notes
    -----
    Decoding reads any standard zstd frame: with or without checksum, with or without
    the content size in the frame header. Encoding with ``checksum=True`` is done by
    numcodecs on the CPU, since nvCOMP's RAW zstd frames carry no checksum.
    """

    is_fixed_size = False

    level: int = 0
    checksum: bool = False

    def __init__(self, *, level: int = 0, checksum: bool = False) -> None:
        object.__setattr__(self, "level", parse_zstd_level(level))
        object.__setattr__(self, "checksum", parse_checksum(checksum))

    @classmethod
    def from_dict(cls, data: dict[str, JSON]) -> Self:
        """Construct the codec from its metadata (``{"name": "zstd", ...}``)."""
        _, configuration = parse_named_configuration(data, "zstd")
        return cls(**configuration)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, JSON]:
        """The codec's metadata, named ``zstd`` for on-disk compatibility."""
        return {"name": "zstd", "configuration": {"level": self.level, "checksum": self.checksum}}

    async def decode(self, chunks_and_specs: Iterable[tuple[Buffer | None, ArraySpec]]) -> Iterable[Buffer | None]:
        """Decode a batch of zstd-compressed chunks on the GPU in one nvCOMP call."""
        items = list(chunks_and_specs)
        return await asyncio.to_thread(self._decode_batch, items)

    def _decode_batch(self, items: Any) -> Any:
        import cupy

        from gpu_zarr.engine.binary import packed_offsets
        from gpu_zarr.engine.codecs.zstd_frames import check_frames
        from gpu_zarr.engine.decode import decode_batch_gpu
        from gpu_zarr.engine.runtime import get_runtime

        live = [k for k, (buf, _) in enumerate(items) if buf is not None]
        result: list = [None] * len(items)
        if not live:
            return result
        arrays = [items[k][0].as_array_like() for k in live]
        sizes = np.array([a.nbytes for a in arrays], np.int64)
        src_off, total = packed_offsets(sizes)
        on_device = hasattr(arrays[0], "__cuda_array_interface__")
        stream = cupy.cuda.get_current_stream()
        if on_device:
            dev = cupy.empty(total, np.uint8)
            for a, o, n in zip(arrays, src_off, sizes):
                dev[o:o + n] = cupy.asarray(a).view(np.uint8).ravel()
            host = dev.get()
        else:
            host = np.zeros(total, np.uint8)
            for a, o, n in zip(arrays, src_off, sizes):
                host[o:o + n] = np.asarray(a).view(np.uint8).ravel()
            dev = cupy.asarray(host)
        names = [f"#{k} of this batch" for k in live]
        # a codec does not know its place in the chain: after another bytes->bytes codec (e.g.
        # [blosc, zstd]) its output is not the chunk's size. The frame's content size stands
        # where its header gives one (zarr's writers always do), the chunk's size otherwise.
        info = check_frames(host, src_off, sizes, -1, names)
        spec_sizes = np.array([_decoded_nbytes(items[k][1]) for k in live], np.int64)
        decoded = np.where(info.content_size >= 0, info.content_size, spec_sizes).astype(np.int64)
        dst_off, out_bytes = packed_offsets(decoded)
        out = cupy.empty(max(out_bytes, 1), np.uint8)
        # every chunk of the batch in ONE nvCOMP call (the engine's decode stage)
        decode_batch_gpu("zstd", dev, src_off, sizes, out, dst_off, decoded, stream, names, runtime=get_runtime())
        for j, k in enumerate(live):
            view = out[int(dst_off[j]):int(dst_off[j] + decoded[j])]
            proto = items[k][1].prototype
            result[k] = proto.buffer.from_array_like(view if is_gpu_prototype(proto) else view.get())
        stream.synchronize()
        return result

    async def encode(self, chunks_and_specs: Iterable[tuple[Buffer | None, ArraySpec]]) -> Iterable[Buffer | None]:
        """Encode a batch of chunks with zstd on the GPU in one nvCOMP call."""
        items = list(chunks_and_specs)
        return await asyncio.to_thread(self._encode_batch, items)

    def _encode_batch(self, items: Any) -> Any:
        live = [k for k, (buf, _) in enumerate(items) if buf is not None]
        result: list = [None] * len(items)
        if not live:
            return result
        if self.checksum:
            from numcodecs import Zstd

            cpu = Zstd(level=self.level, checksum=True)
            for k in live:
                buf, spec = items[k]
                data = np.asarray(_to_host(buf.as_array_like())).view(np.uint8).ravel()
                result[k] = spec.prototype.buffer.from_bytes(cpu.encode(data))
            return result
        import cupy
        from nvidia import nvcomp

        from gpu_zarr.engine.decode import nvcomp_codec
        from gpu_zarr.engine.runtime import get_runtime

        stream = cupy.cuda.get_current_stream()
        codec = nvcomp_codec(stream, runtime=get_runtime())
        srcs = [cupy.ascontiguousarray(cupy.asarray(items[k][0].as_array_like()).view(np.uint8).ravel())
                for k in live]
        batch = nvcomp.as_arrays(srcs, cuda_stream=int(stream.ptr))
        encoded = codec.encode(batch)
        for j, k in enumerate(live):
            frame = cupy.array(cupy.asarray(encoded[j]).view(np.uint8), copy=True)
            proto = items[k][1].prototype
            result[k] = proto.buffer.from_array_like(frame if is_gpu_prototype(proto) else frame.get())
        stream.synchronize()
        return result

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        """Raise NotImplementedError: the encoded size of zstd depends on the data."""
        raise NotImplementedError


def is_gpu_prototype(prototype: Any) -> bool:
    """True for zarr's GPU buffer prototype (``zarr.core.buffer.gpu``)."""
    return bool(prototype.buffer.__module__.endswith(".gpu"))


def _to_host(a: Any) -> Any:
    return a.get() if hasattr(a, "__cuda_array_interface__") else a


def register_nvcomp_zstd() -> bool:
    """Register :class:`NvcompZstdCodec` under the name ``zstd``.

    Idempotent. Returns True if registration succeeded (or was already done), False if
    cupy or nvidia.nvcomp are not importable.

    Notes
    -----
    Registration alone does not make zarr use the GPU codec: zarr picks the class via
    ``zarr.config["codecs.zstd"]``. Use :func:`gpu_zstd_config` (or
    :func:`gpu_zarr.zarr_io.gpu_zarr_context`) to switch it for a scoped block.
    """
    global _registered
    if _registered:
        return True
    for mod in ("cupy", "nvidia.nvcomp"):
        try:
            if importlib.util.find_spec(mod) is None:
                return False
        except (ImportError, ValueError):
            return False
    try:
        import cupy  # noqa: F401
        from nvidia import nvcomp  # noqa: F401
    except Exception:
        return False
    from zarr.registry import register_codec

    register_codec("zstd", NvcompZstdCodec, qualname=QUALNAME)
    _registered = True
    return True


def gpu_zstd_config() -> dict[str, object]:
    """The zarr config overrides that route the ``zstd`` codec through nvCOMP.

    Pass the result to ``zarr.config.set(...)``; call :func:`register_nvcomp_zstd` first
    (otherwise zarr cannot resolve the class name). Besides the codec class it raises
    zarr's codec-pipeline batch size, so that one ``decode`` call (one nvCOMP call) covers
    many chunks.
    """
    return {"codecs.zstd": QUALNAME, "codec_pipeline.batch_size": 64}
