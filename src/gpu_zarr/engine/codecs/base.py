"""The codec stage protocol: what one core codec recognises in the array metadata, and its host and device halves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:  # annotations only
    from gpu_zarr.engine.layout import Layout
    from gpu_zarr.engine.ops import Ops
    from gpu_zarr.engine.plan import Batch

__all__ = ["CodecStage"]


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
