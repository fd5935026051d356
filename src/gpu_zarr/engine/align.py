"""Byte alignment of packed buffers: the one definition used by staging, decode and the codecs.

Chunks packed one after another into a staging or decoded buffer start at 16-byte
boundaries (nvCOMP and the copy kernels read aligned words).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ALIGN", "align_up", "packed_offsets"]

#: alignment, in bytes, of every chunk packed into a shared buffer
ALIGN = 16


def align_up(n: Any, align: int = ALIGN) -> Any:
    """``n`` rounded up to a multiple of ``align`` (an int or an integer ndarray)."""
    return -(-n // align) * align


def packed_offsets(sizes: np.ndarray, align: int = ALIGN) -> tuple[np.ndarray, int]:
    """Start offsets of buffers of ``sizes`` packed one after another at ``align``-byte
    boundaries, and the bytes the packed buffer needs (the last one unpadded)."""
    sizes = np.asarray(sizes, np.int64)
    offsets = np.zeros(len(sizes), np.int64)
    if len(sizes) > 1:
        offsets[1:] = np.cumsum(align_up(sizes[:-1], align))
    total = int(offsets[-1] + sizes[-1]) if len(sizes) else 0
    return offsets, total
