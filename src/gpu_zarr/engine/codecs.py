"""Codec stages: how the encoded bytes of a batch of (inner) chunks become decoded chunks.

One stage per chunk codec the direct engine reads (``Layout.codec``). A stage has a host
half (:meth:`CodecStage.prepare`: validate and parse the batch's encoded bytes in pinned
staging before anything reaches the GPU, since nvCOMP is undefined on corrupt input) and a
device half (:meth:`CodecStage.decode`, written once against :class:`~gpu_zarr.engine.ops.Ops`
so that the GPU path and its CPU twin run the same code). ``raw`` has no device half: the
place stage reads straight from the fetched bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from gpu_zarr.engine.blosc import BloscStage
from gpu_zarr.engine.deflate import DeflateStage
from gpu_zarr.engine.layout import Layout
from gpu_zarr.engine.ops import Ops
from gpu_zarr.engine.plan import Batch
from gpu_zarr.engine.zstd_frames import check_frames
from gpu_zarr.errors import UnsupportedArrayError

__all__ = ["CodecStage", "RawStage", "ZstdStage", "stage_for"]


class CodecStage(Protocol):
    """The host and device halves of one chunk codec."""

    name: str
    decodes: bool  # False: the place stage reads the fetched bytes as they are
    native_checks: bool  # True: the codec's own CPU decoder validates its input (no host pre-check needed there)
    device_checks: bool  # True: the GPU decoder validates its input itself (no host pre-check needed there)

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
    decodes = False
    native_checks = False
    device_checks = False

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
    decodes = True
    native_checks = True  # libzstd validates frames itself: the CPU's small-read path skips the pre-check
    device_checks = True  # the batched decoder walks every frame on the GPU (zstd_sanitize) before nvCOMP

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


# one stage object per codec name (stages are stateless; long-lived state lives in the runtime)
_STAGES: dict[str, CodecStage] = {"raw": RawStage(), "zstd": ZstdStage(), "blosc": BloscStage(),
                                  "gzip": DeflateStage("gzip"), "zlib": DeflateStage("zlib")}


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
