"""Shard assembly: encoded inner chunks, then the index, as zarr's ``sharding_indexed`` codec
lays them out with ``index_location="end"`` and index codecs ``[bytes(little), crc32c]``.

The index is an array of shape ``chunks_per_shard + (2,)`` of little-endian uint64
``(offset, nbytes)`` pairs in C order, ``(2**64-1, 2**64-1)`` for a missing chunk, followed by
the CRC-32C of those bytes (4 bytes, little-endian). Chunks are laid out in C order.
"""

from __future__ import annotations

import numpy as np

from gpu_zarr.engine.codecs.frames import crc32c  # the one CRC-32C of the package (the reader's too)

__all__ = ["MISSING", "crc32c", "shard_layout"]

MISSING = np.uint64(2**64 - 1)


def shard_layout(sizes: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, bytes, int]:
    """Where each present inner chunk goes in its shard, and the shard's index bytes.

    Parameters
    ----------
    sizes : numpy.ndarray of int64
        Encoded size of each inner chunk, C order (ignored where not ``present``).
    present : numpy.ndarray of bool
        Which inner chunks are written.

    Returns
    -------
    offsets : numpy.ndarray of int64
        Offset of each inner chunk in the shard (-1 where missing).
    index : bytes
        The index with its CRC-32C, to append after the chunks.
    nbytes : int
        The shard's total size (chunks, then index).
    """
    sizes = np.where(present, np.asarray(sizes, np.int64), 0)
    ends = np.cumsum(sizes)
    offsets = np.where(present, ends - sizes, -1)
    table = np.empty((len(sizes), 2), "<u8")
    table[:, 0] = np.where(present, offsets, 0).astype(np.uint64)
    table[:, 1] = sizes.astype(np.uint64)
    table[~present] = MISSING
    raw = table.tobytes()
    index = raw + crc32c(raw).to_bytes(4, "little")
    total = int(ends[-1]) if len(ends) else 0
    return offsets, index, total + len(index)
