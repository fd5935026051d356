"""zstd frames: decoded in batches by nvCOMP on the GPU, by libzstd on native threads on the host."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_zarr.engine.codecs.zstd_frames import check_frames

if TYPE_CHECKING:  # annotations only
    from gpu_zarr.engine.layout import Layout
    from gpu_zarr.engine.ops import Ops
    from gpu_zarr.engine.plan import Batch

__all__ = ["ZstdStage"]


class ZstdStage:
    """zstd frames: one batched nvCOMP call per batch.

    Notes
    -----
    nvCOMP's statuses do not guard a truncated or garbage frame, which can fault the GPU (the
    process's context lost), so every frame is walked before nvCOMP reads it: on the GPU by the
    batched decoder (``zstd_sanitize`` in :mod:`gpu_zarr.engine.nvcomp_batch`, a CI test holds
    it equal to the host walk), on the host by :meth:`prepare` for the CPU twin. The GPU path
    skips the host walk (``device_checks``): it would hold the thread that drives the GPU. The
    CPU's small-read path skips it too (``native_checks``): libzstd checks its input.
    """

    name = "zstd"
    v2_names = ("zstd",)
    v3_chains = ("[bytes, zstd]", "[bytes, numcodecs.zstd]")
    native = "zstd"
    nvcomp = True
    decodes = True
    native_checks = True  # libzstd validates frames itself: the CPU's small-read path skips the pre-check
    device_checks = True  # the batched decoder walks every frame on the GPU (zstd_sanitize) before nvCOMP

    def recognise_v2(self, compressor: Any, dtype: np.dtype) -> dict[str, Any] | None:
        return {} if getattr(compressor, "codec_id", None) == "zstd" else None

    def recognise_v3(self, chain: Sequence[Any]) -> dict[str, Any] | None:
        """zarr's ``zstd`` codec, numcodecs' (``numcodecs.zstd``), or ours (:class:`gpu_zarr.nvcomp_zstd.NvcompZstdCodec`)."""
        from zarr.codecs import ZstdCodec

        if len(chain) != 1:
            return None
        c = chain[0]
        # zstd frames under any of its names: zarr's codec, numcodecs' (v3 "numcodecs.zstd"), ours
        if isinstance(c, ZstdCodec) or type(c).__name__ == "NvcompZstdCodec" or \
                str(getattr(c, "codec_name", "")) == "numcodecs.zstd":
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
        # nvCOMP's zstd decode scratch: about 3.1x the decoded bytes of a call
        return chunks_per_batch * lay.inner_nbytes * 31 // 10
