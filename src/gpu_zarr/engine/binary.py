"""Binary layout helpers, the one definition used by staging, decode, locate and the codecs.

- Alignment: chunks packed one after another into a staging or decoded buffer start at
  16-byte boundaries (nvCOMP and the copy kernels read aligned words).
- Little-endian integers, as the formats we parse store them (zstd frame and block headers,
  Blosc headers and block tables, gzip fields and trailers, shard index checksums): many at
  once from a byte buffer (:func:`le_uints`, :func:`le_ints`), or one (:func:`le_uint`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ALIGN", "align_up", "le_ints", "le_uint", "le_uints", "packed_offsets"]

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


def _gather(buf: np.ndarray, pos: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    if not 1 <= n <= 8:
        raise ValueError(f"little-endian integers of 1 to 8 bytes, not {n}")
    pos = np.asarray(pos, np.int64)
    return pos, np.ascontiguousarray(buf[pos[..., None] + np.arange(n)])


def le_uints(buf: np.ndarray, pos: Any, n: int) -> np.ndarray:
    """Unsigned little-endian integers of ``n`` bytes (1 to 8) at byte positions ``pos`` (any
    shape) of the uint8 host buffer ``buf``, as int64 shaped like ``pos``. Every ``pos + n`` must
    be in bounds (callers check sizes first); an 8-byte value of 2**63 or more wraps negative
    (numpy's uint64 -> int64 cast)."""
    pos, b = _gather(buf, pos, n)
    if n in (1, 2, 4, 8):
        return b.view(f"<u{n}")[..., 0].astype(np.int64)
    out = np.zeros(pos.shape, np.int64)
    for k in range(n):
        out |= b[..., k].astype(np.int64) << (8 * k)
    return out


def le_ints(buf: np.ndarray, pos: Any, n: int) -> np.ndarray:
    """Signed (two's complement) little-endian integers of ``n`` bytes (1, 2, 4 or 8) at byte
    positions ``pos`` of the uint8 buffer ``buf``, as int64 shaped like ``pos``."""
    if n not in (1, 2, 4, 8):
        raise ValueError(f"signed little-endian integers of 1, 2, 4 or 8 bytes, not {n}")
    _, b = _gather(buf, pos, n)
    return b.view(f"<i{n}")[..., 0].astype(np.int64)


def le_uint(data: Any, start: int = 0, n: int | None = None) -> int:
    """One unsigned little-endian integer: ``n`` bytes of ``data`` (bytes or a uint8 array) from
    ``start`` (to its end when ``n`` is None), as a Python int."""
    stop = None if n is None else start + n
    return int.from_bytes(bytes(data[start:stop]), "little")
