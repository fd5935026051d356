"""Uncompressed chunks: the ``bytes`` codec alone (zarr v3 ``[bytes]``, zarr v2 without a compressor)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # annotations only
    from gpu_zarr.engine.layout import Layout
    from gpu_zarr.engine.ops import Ops
    from gpu_zarr.engine.plan import Batch

__all__ = ["RawStage"]


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
