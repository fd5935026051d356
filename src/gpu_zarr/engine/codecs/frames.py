"""Checksum frames: bytes-to-bytes steps that append a checksum to a chunk (zarr v3 ``crc32c``).

A frame is verified and stripped on the host, before any other step reads the chunk's bytes:
the chunk's encoded span in staging shrinks by the checksum's size, nothing is copied. A
mismatch is a :class:`~gpu_zarr.errors.CorruptChunkError` naming the chunk -- never skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_zarr.engine.binary import le_uint, le_uints
from gpu_zarr.errors import CorruptChunkError

__all__ = ["CRC32C", "FRAMES", "Frame", "crc32c", "frame_of", "strip_frames"]


@dataclass(frozen=True)
class Frame:
    """A checksum appended to the chunk's bytes.

    Attributes
    ----------
    name : str
        How messages and descriptions name it (and the native library's checksum kind).
    trailer : int
        Bytes of the checksum at the end of the chunk (little-endian).
    checksum : callable
        ``checksum(bytes-like) -> int`` of the bytes before the trailer: the pure-Python
        fallback of the native library's batched checksum.
    """

    name: str
    trailer: int
    checksum: Callable[[Any], int]


def crc32c(data: Any) -> int:
    """CRC-32C (Castagnoli) of ``data`` (bytes-like or a numpy array), as zarr's crc32c codec
    writes it: google-crc32c, a hardware instruction where there is one. Batches of spans go
    through the native library instead (:func:`gpu_zarr.engine.native.checksums`)."""
    import google_crc32c

    if isinstance(data, np.ndarray):  # (google-crc32c takes arrays and bytes, not memoryviews)
        data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    return int(google_crc32c.value(data))


CRC32C = Frame("crc32c", 4, crc32c)
FRAMES: tuple[Frame, ...] = (CRC32C,)


def frame_of(codec: Any) -> Frame | None:
    """The frame of a zarr v3 bytes-to-bytes codec (zarr's ``Crc32cCodec``, or a codec of that
    name), or None when the codec is not a checksum frame."""
    name = type(codec).__name__
    if name == "Crc32cCodec" or str(getattr(codec, "codec_name", "")) == "crc32c":
        return CRC32C
    return None


def strip_frames(staging: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, frames: Sequence[Frame],
                 names: Sequence[str], pool: Any = None) -> np.ndarray:
    """Verify each chunk's frames (outermost first) in ``staging[offsets[k]:][:sizes[k]]`` and
    return the sizes without them (the offsets stay: the checksums are at the ends); ``pool``:
    worker threads that check chunks of a large batch side by side. Raises CorruptChunkError
    naming the first chunk (in the batch's order) shorter than its checksums or whose checksum
    does not match.
    """
    sizes = np.asarray(sizes, np.int64).copy()
    offs = np.asarray(offsets, np.int64)
    for frame in frames:
        short = np.flatnonzero(sizes < frame.trailer)
        if len(short):
            k = int(short[0])
            raise CorruptChunkError(
                f"chunk {names[k]} has {int(sizes[k])} bytes: too short for its {frame.name} checksum "
                f"({frame.trailer} bytes). The chunk is truncated or was not written by this codec chain.")
        sizes -= frame.trailer
        _verify(staging, offs, sizes, frame, names, pool)
    return sizes


def _verify(staging: np.ndarray, offs: np.ndarray, sizes: np.ndarray, frame: Frame, names: Sequence[str],
            pool: Any) -> None:
    n = len(sizes)
    tr = frame.trailer
    if n == 0:
        return
    got = _native_sums(frame, staging, offs, sizes)
    if got is not None:  # one native call over the batch, on native threads
        bad_all = np.flatnonzero(got.astype(np.int64) != le_uints(staging, offs + sizes, tr))
        if len(bad_all):
            _mismatch(frame, names, int(bad_all[0]))
        return

    def check(lo: int, hi: int) -> int:
        """The first bad chunk in [lo, hi), or -1."""
        for k in range(lo, hi):
            o, s = int(offs[k]), int(sizes[k])
            want = le_uint(staging, o + s, tr)
            if frame.checksum(staging[o:o + s]) != want:
                return k
        return -1

    total = int(sizes.sum()) if n else 0
    if pool is None or n < 2 or total < (8 << 20):  # a small batch: one thread is sooner than handing out
        bad = check(0, n)
    else:
        step = max(1, n // 16)
        found = [b for b in pool.map(lambda lo: check(lo, min(n, lo + step)), range(0, n, step)) if b >= 0]
        bad = min(found) if found else -1
    if bad >= 0:
        _mismatch(frame, names, bad)


def _native_sums(frame: Frame, staging: np.ndarray, offs: np.ndarray, sizes: np.ndarray) -> np.ndarray | None:
    """The frame's checksum of each span from the native library (None where it is not loaded)."""
    import os

    import gpu_zarr.engine.native as native

    if not native.available():
        return None
    return native.checksums(frame.name, staging, offs, sizes, os.cpu_count() or 1)


def _mismatch(frame: Frame, names: Sequence[str], bad: int) -> None:
    raise CorruptChunkError(
        f"chunk {names[bad]} fails its {frame.name} checksum: its bytes are not the ones that were written "
        "(a damaged or partly written file, or a server that changed the object). Re-copy or re-write it.")
