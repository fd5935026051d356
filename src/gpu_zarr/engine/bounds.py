"""The most encoded bytes a chunk may have: checked before anything is read or allocated.

One job: :func:`max_encoded_nbytes`, the worst case of what a codec's encoder writes for a
chunk of ``decoded_nbytes``. A stored chunk (a local file's size from ``stat``, a shard
index's entry, a remote answer's length) larger than this is corrupt or hostile: it is refused
with a :class:`~gpu_zarr.errors.CorruptChunkError` naming it instead of being read into
memory (a sparse 1 GiB file where a 2 KiB chunk belongs; an index entry claiming 64 GiB).
The bounds are the encoders' own output bounds plus a little slack, never tight: a valid
chunk must never be refused.
"""

from __future__ import annotations

from typing import Any

__all__ = ["max_encoded_nbytes", "max_stored_nbytes"]

_SLACK = 64  # bytes beyond each encoder's bound: headers we do not model exactly (never tight)


def max_encoded_nbytes(codec: str, decoded_nbytes: int) -> int:
    """The most bytes a chunk of ``decoded_nbytes`` decoded bytes encoded with ``codec`` (a
    :attr:`~gpu_zarr.engine.layout.Layout.codec` name: "raw", "zstd", "blosc", "gzip", "zlib",
    "lz4", "host"; any other gets a generous bound) may have; checksums around the codec are
    counted by :func:`max_stored_nbytes`."""
    n = max(0, int(decoded_nbytes))
    if codec == "raw":
        bound = n  # stored as is
    elif codec == "zstd":
        # ZSTD_COMPRESSBOUND (zstd.h): what numcodecs allocates for its output; it covers the frame
        # header and the blocks stored raw when they do not compress (a checksum adds 4 bytes)
        bound = n + (n >> 8) + (((128 << 10) - n) >> 11 if n < (128 << 10) else 0) + 4 + _SLACK
    elif codec == "blosc":
        # Blosc falls back to copying the input when compression does not pay: its output never
        # exceeds the input plus its header (BLOSC_MAX_OVERHEAD 16; Blosc2's 32)
        bound = n + 32 + _SLACK
    elif codec == "lz4":
        # LZ4_COMPRESSBOUND (lz4.h), behind numcodecs' 4-byte size
        bound = n + n // 255 + 16 + 4 + _SLACK
    elif codec in ("gzip", "zlib"):
        # zlib's deflateBound: stored blocks cost 5 bytes per 16 KiB at worst; the wrapper is
        # 6 bytes (zlib) or 18 plus optional name / comment / extra fields (gzip: 1 KiB allowed)
        bound = n + (n + 7) // 8 + (n + 63) // 64 + 5 + (6 if codec == "zlib" else 18 + 1024) + _SLACK
    elif codec == "host":
        # a chain decoded by its codecs' own decode (filters, numcodecs.* codecs): an AsType or
        # FixedScaleOffset filter may widen elements up to 16-fold (uint8 stored as complex128)
        # before a compressor that may add up to as much again
        bound = 32 * n + (64 << 10)
    else:
        # a codec we do not model (a registered stage, filters): no encoder in use expands data
        # by more than a factor of two (base64 is 4/3, a shuffle or delta keeps the size), and
        # 64 KiB covers fixed headers on tiny chunks. Generous, yet it still stops a gigabyte
        # claimed for a kilobyte chunk.
        bound = 2 * n + (64 << 10)
    return bound


def max_stored_nbytes(layout: Any) -> int:
    """The most bytes one stored (inner) chunk of ``layout`` may have: its core codec's bound
    (:func:`max_encoded_nbytes`) plus the checksums its chain appends (``layout.frames``)."""
    inner = int(layout.stored_nbytes)
    return max_encoded_nbytes(layout.codec, inner) + int(layout.frame_bytes)
