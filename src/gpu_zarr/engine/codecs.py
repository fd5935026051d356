"""Codec stages and their registry: how the encoded bytes of a batch of (inner) chunks become decoded chunks.

A codec is one stage object (:class:`CodecStage`) in one module: it declares what it
recognises in the array metadata (:meth:`~CodecStage.recognise_v2` for a zarr v2
``compressor``, :meth:`~CodecStage.recognise_v3` for the bytes-to-bytes codecs that follow
``bytes`` in a zarr v3 chain), how messages name it, which codec of the native host library
decodes it, and how it decodes batches. Each stage has a host half (:meth:`CodecStage.prepare`:
validate and parse the batch's encoded bytes in pinned staging before anything reaches the
GPU, since nvCOMP is undefined on corrupt input) and a device half (:meth:`CodecStage.decode`,
written once against :class:`~gpu_zarr.engine.ops.Ops` so that the GPU path and its CPU twin
run the same code). ``raw`` has no device half: the place stage reads straight from the
fetched bytes.

The stages live in ONE registry (:func:`stages`, :func:`register`, :func:`unregister`): the
layout's recognisers (:mod:`gpu_zarr.engine.layout`), its descriptions and "expected ..."
messages, the native host path's codec set and the capability report all iterate it, so
adding a codec is one module defining its stage plus its line in :data:`_BUILTIN` (or a
:func:`register` call at run time).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from gpu_zarr.engine.blosc import BloscStage
from gpu_zarr.engine.deflate import DeflateStage
from gpu_zarr.engine.zstd_frames import check_frames
from gpu_zarr.errors import UnsupportedArrayError

if TYPE_CHECKING:  # annotations only: the layout imports this registry (and the plan the layout)
    from gpu_zarr.engine.layout import Layout
    from gpu_zarr.engine.ops import Ops
    from gpu_zarr.engine.plan import Batch

__all__ = ["CodecStage", "RawStage", "ZstdStage", "register", "stage_for", "stage_named", "stages", "unregister"]


class CodecStage(Protocol):
    """One chunk codec: what it recognises in the metadata, and its host and device halves.

    Attributes
    ----------
    name : str
        The codec's name in :attr:`Layout.codec <gpu_zarr.engine.layout.Layout.codec>`.
    v2_names : tuple of str
        How messages name the zarr v2 compressors it reads ("raw" for no compressor);
        empty when it reads none.
    v3_chains : tuple of str
        How messages name the zarr v3 codec chains it reads (e.g. ``"[bytes, zstd]"``).
    native : str or None
        The native host library's codec for these chunks (a key of
        :data:`gpu_zarr.engine.native.CODECS`); None when the library has none.
    nvcomp : bool
        The GPU decode calls nvCOMP (the direct engine then needs it).
    decodes : bool
        False: the place stage reads the fetched bytes as they are.
    native_checks : bool
        The codec's own CPU decoder validates its input (no host pre-check needed there).
    device_checks : bool
        The GPU decoder validates its input itself (no host pre-check needed there).
    """

    # read-only declarations (a class attribute or a plain attribute satisfies each)
    @property
    def name(self) -> str: ...
    @property
    def v2_names(self) -> tuple[str, ...]: ...
    @property
    def v3_chains(self) -> tuple[str, ...]: ...
    @property
    def native(self) -> str | None: ...
    @property
    def nvcomp(self) -> bool: ...
    @property
    def decodes(self) -> bool: ...
    @property
    def native_checks(self) -> bool: ...
    @property
    def device_checks(self) -> bool: ...

    def recognise_v2(self, compressor: Any, dtype: np.dtype) -> dict[str, Any] | None:
        """The stage's parameters when it decodes chunks of this zarr v2 ``compressor`` (a
        numcodecs codec, or None for uncompressed chunks) and ``dtype``; None when it does not."""
        ...

    def recognise_v3(self, chain: Sequence[Any]) -> dict[str, Any] | None:
        """The stage's parameters when it decodes a zarr v3 chain ``[bytes, *chain]`` (``chain``:
        the bytes-to-bytes codecs after ``bytes``, possibly none); None when it does not."""
        ...

    def label(self, params: Mapping[str, Any]) -> str:
        """How a description names chunks of this codec with these parameters (e.g. "zstd")."""
        ...

    def prepare(self, staging: np.ndarray, batch: Batch, lay: Layout, names: Sequence[str]) -> Any:
        """Validate / parse the batch's encoded bytes on the host; return what decode needs."""
        ...

    def decode(self, ops: Ops, src: Any, batch: Batch, prep: Any, dst: Any, dst_offsets: np.ndarray,
               lay: Layout, names: Sequence[str], slot: int, wait: Any) -> None:
        """Decode chunk k of the batch from ``src`` into ``dst[dst_offsets[k]:][:lay.inner_nbytes]``."""
        ...

    def scratch_bytes(self, chunks_per_batch: int, lay: Layout) -> int:
        """Device memory beyond the fetched and decoded buffers that one batch needs."""
        ...


class RawStage:
    """Uncompressed chunks: nothing to decode (sizes were checked when located)."""

    name = "raw"
    v2_names = ("raw",)
    v3_chains = ("[bytes]",)
    native = "raw"
    nvcomp = False
    decodes = False
    native_checks = False
    device_checks = False

    def recognise_v2(self, compressor: Any, dtype: np.dtype) -> dict[str, Any] | None:
        return {} if compressor is None else None

    def recognise_v3(self, chain: Sequence[Any]) -> dict[str, Any] | None:
        return {} if len(chain) == 0 else None

    def label(self, params: Mapping[str, Any]) -> str:
        return "uncompressed"

    def prepare(self, staging: np.ndarray, batch: Batch, lay: Layout, names: Sequence[str]) -> Any:
        return None

    def decode(self, ops: Ops, src: Any, batch: Batch, prep: Any, dst: Any, dst_offsets: np.ndarray,
               lay: Layout, names: Sequence[str], slot: int, wait: Any) -> None:
        raise AssertionError("raw chunks are placed without a decode")

    def scratch_bytes(self, chunks_per_batch: int, lay: Layout) -> int:
        return 0


class ZstdStage:
    """zstd frames: one batched nvCOMP call per batch.

    Notes
    -----
    nvCOMP's statuses do not guard a truncated or garbage frame, which faulted the GPU
    (CUDA_ERROR_ILLEGAL_ADDRESS, the process's context lost), so every frame is walked
    before nvCOMP reads it: on the GPU by the batched decoder (``zstd_sanitize`` in
    :mod:`gpu_zarr.engine.nvcomp_batch`, a CI test holds it equal to the host walk), on
    the host by :meth:`prepare` for the CPU twin. The GPU path skips the host walk
    (``device_checks``): on the H200 it held the read's only thread for 20 ms per 2 GiB of
    4 MiB chunks (one numpy step per block position), a sixth of the read. The CPU's
    small-read path skips it too (``native_checks``): libzstd checks its input.
    """

    name = "zstd"
    v2_names = ("zstd",)
    v3_chains = ("[bytes, zstd]",)
    native = "zstd"
    nvcomp = True
    decodes = True
    native_checks = True  # libzstd validates frames itself: the CPU's small-read path skips the pre-check
    device_checks = True  # the batched decoder walks every frame on the GPU (zstd_sanitize) before nvCOMP

    def recognise_v2(self, compressor: Any, dtype: np.dtype) -> dict[str, Any] | None:
        return {} if getattr(compressor, "codec_id", None) == "zstd" else None

    def recognise_v3(self, chain: Sequence[Any]) -> dict[str, Any] | None:
        """zarr's ``zstd`` codec, or ours (:class:`gpu_zarr.nvcomp_zstd.NvcompZstdCodec`, by name)."""
        from zarr.codecs import ZstdCodec

        if len(chain) == 1 and (isinstance(chain[0], ZstdCodec) or type(chain[0]).__name__ == "NvcompZstdCodec"):
            return {}
        return None

    def label(self, params: Mapping[str, Any]) -> str:
        return "zstd"

    def prepare(self, staging: np.ndarray, batch: Batch, lay: Layout, names: Sequence[str]) -> Any:
        check_frames(staging, batch.src_offsets, batch.src_sizes, lay.inner_nbytes, names)
        return None

    def decode(self, ops: Ops, src: Any, batch: Batch, prep: Any, dst: Any, dst_offsets: np.ndarray,
               lay: Layout, names: Sequence[str], slot: int, wait: Any) -> None:
        sizes = np.full(len(batch.pieces), lay.inner_nbytes, np.int64)
        ops.decode_batch("zstd", src, batch.src_offsets, batch.src_sizes, dst, dst_offsets, sizes, names,
                         slot, wait=wait)

    def scratch_bytes(self, chunks_per_batch: int, lay: Layout) -> int:
        # nvCOMP's zstd decode scratch, measured: about 3.1x the decoded bytes of a call
        return chunks_per_batch * lay.inner_nbytes * 31 // 10


_lock = threading.Lock()
# the codecs the engine reads, in the order the layout tries them (stages are stateless;
# long-lived state lives in the runtime). A new codec: its module, and one line here.
_BUILTIN: tuple[CodecStage, ...] = (RawStage(), ZstdStage(), BloscStage(), DeflateStage("gzip"), DeflateStage("zlib"))
_STAGES: dict[str, CodecStage] = {s.name: s for s in _BUILTIN}


def stages() -> tuple[CodecStage, ...]:
    """Every registered codec stage, in registration order (built-in ones first)."""
    return tuple(_STAGES.values())


def stage_named(name: str) -> CodecStage | None:
    """The registered stage of codec ``name`` (:attr:`Layout.codec`), or None."""
    return _STAGES.get(name)


def register(stage: CodecStage) -> CodecStage:
    """Add a codec stage to the registry (its ``name`` must be new); returns it.

    From then on the layout recognises what the stage declares, descriptions and messages name
    it, and reads of such arrays decode with it.
    """
    global _STAGES
    with _lock:  # copy on write: readers iterate the mapping without the lock
        if stage.name in _STAGES:
            raise ValueError(f"a codec stage named {stage.name!r} is already registered")
        _STAGES = {**_STAGES, stage.name: stage}
    return stage


def unregister(name: str) -> None:
    """Remove the codec stage ``name`` added by :func:`register` (built-in stages stay)."""
    global _STAGES
    with _lock:
        if any(s.name == name for s in _BUILTIN):
            raise ValueError(f"{name!r} is a built-in codec stage; it cannot be unregistered")
        _STAGES = {k: v for k, v in _STAGES.items() if k != name}


def stage_for(lay: Layout) -> CodecStage:
    """The codec stage of a layout.

    Raises
    ------
    UnsupportedArrayError
        No stage for the layout's codec.
    """
    stage = _STAGES.get(lay.codec)
    if stage is None:
        raise UnsupportedArrayError(f"the direct engine has no decoder for {lay.codec!r} chunks")
    return stage
