"""Check zstd frames on the host before nvCOMP sees them.

nvCOMP's behaviour on corrupt input is undefined, so every frame is walked first: magic
number, frame header, every block header up to the last block, the optional checksum, and
the frame must end exactly where the chunk ends. The walk is vectorised over all frames of
a batch (one numpy step per block position, not one Python call per chunk).

The same walk runs on the GPU inside the batched decoder (``zstd_sanitize`` in
:mod:`gpu_zarr.engine.nvcomp_batch`; a CI test holds the two equal). Neither can see
corruption inside a compressed block: a flipped byte in a block's literal or sequence
headers passes both and can fault the GPU (zstd has no block-level check; the frame checksum
is verified only after decoding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_zarr.engine.binary import le_uint, le_uints
from gpu_zarr.errors import CorruptChunkError

__all__ = ["FrameInfo", "check_frames", "content_size"]

_MAGIC = 0xFD2FB528
_MAX_BLOCK = 128 * 1024


@dataclass
class FrameInfo:
    """Per-frame facts found in the headers.

    Attributes
    ----------
    content_size : ndarray of int64
        Frame content size from the header, -1 when the header omits it.
    """

    content_size: np.ndarray


def _header_layout(fhd: Any) -> tuple[Any, Any]:
    """From a frame header descriptor byte (an int or an array of them): the size of the
    Frame_Content_Size field and where it starts, counted from the frame's first byte
    (magic 4, descriptor 1, window descriptor 0 or 1, dictionary id 0/1/2/4 bytes)."""
    fcs_flag, single, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    fcs_size = single * (fcs_flag == 0) + (1 << fcs_flag) * (fcs_flag != 0)  # flag 0: 1 byte if single segment
    return fcs_size, 5 + (1 - single) + ((1 << dict_flag) >> 1)


def _fcs_value(raw: Any, nbytes: int) -> Any:
    """Frame_Content_Size from its little-endian field (the 2-byte form is offset by 256)."""
    return raw + (256 if nbytes == 2 else 0)


def _fail(names: Sequence[str], k: int, what: str) -> CorruptChunkError:
    return CorruptChunkError(
        f"chunk {names[k]}: {what}. Expected one standard zstd frame; the chunk is corrupt or "
        "truncated. Nothing was decoded from it; rewrite or delete that chunk."
    )


def _refuse_first(names: Sequence[str], bad: np.ndarray, what: str) -> None:
    """Raise :func:`_fail` for the first chunk index in ``bad``; nothing when it is empty."""
    if len(bad):
        raise _fail(names, int(bad[0]), what)


def _check_magic(buf: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, names: Sequence[str]) -> None:
    """Each frame is long enough for a frame header and starts with the zstd magic number."""
    short = np.flatnonzero(sizes < 6)
    if len(short):
        raise _fail(names, int(short[0]), f"{int(sizes[short[0]])} bytes is too short for a zstd frame")
    bad = np.flatnonzero(le_uints(buf, offsets, 4) != _MAGIC)
    if len(bad):
        k = int(bad[0])
        raise _fail(names, k, f"starts with bytes {bytes(buf[offsets[k]:offsets[k] + 4]).hex()}, not the "
                              "zstd magic number 28b52ffd")


def _frame_headers(buf: np.ndarray, offsets: np.ndarray, end: np.ndarray, expected: np.ndarray,
                   names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Walk the frame headers: returns where each frame's first block starts, its content
    size (-1 when the header omits it, else it must match ``expected`` where that is
    known) and whether a checksum follows the last block (0 or 1)."""
    fhd = buf[offsets + 4].astype(np.int64)
    reserved, has_ck, dict_flag = (fhd >> 3) & 1, (fhd >> 2) & 1, fhd & 3
    _refuse_first(names, np.flatnonzero(reserved != 0), "frame header has its reserved bit set")
    _refuse_first(names, np.flatnonzero(dict_flag != 0), "frame needs a zstd dictionary, which zarr never uses")
    fcs_size, at = _header_layout(fhd)
    pos = offsets + at
    _refuse_first(names, np.flatnonzero(pos + fcs_size + 3 > end), "frame header is truncated")
    fcs = np.full(len(offsets), -1, np.int64)
    for nb in (1, 2, 4, 8):
        m = fcs_size == nb
        if m.any():
            fcs[m] = _fcs_value(le_uints(buf, pos[m], nb), nb)
    bad = np.flatnonzero((fcs >= 0) & (expected >= 0) & (fcs != expected))
    if len(bad):
        k = int(bad[0])
        raise _fail(names, k, f"frame header says {int(fcs[k])} decoded bytes; the array metadata "
                              f"says a chunk holds {int(expected[k])}")
    return pos + fcs_size, fcs, has_ck


def _walk_blocks(buf: np.ndarray, pos: np.ndarray, end: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Walk every frame's blocks from ``pos`` (one numpy step per block position for all
    frames still in their blocks); returns where each frame's last block ends."""
    pos = pos.copy()
    active = np.ones(len(pos), bool)
    while True:
        idx = np.flatnonzero(active)
        if len(idx) == 0:
            return pos
        p = pos[idx]
        _refuse_first(names, idx[p + 3 > end[idx]], "frame ends inside a block header (truncated)")
        h = le_uints(buf, p, 3)
        last, btype, bsize = h & 1, (h >> 1) & 3, h >> 3
        _refuse_first(names, idx[(btype == 3) | (bsize > _MAX_BLOCK)], "invalid zstd block header")
        p = p + 3 + np.where(btype == 1, 1, bsize)
        _refuse_first(names, idx[p > end[idx]], "frame is truncated inside a block")
        pos[idx] = p
        active[idx[last == 1]] = False


def check_frames(buf: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, expected: int | np.ndarray,
                 names: Sequence[str]) -> FrameInfo:
    """Validate the zstd frames ``buf[offsets[i] : offsets[i] + sizes[i]]`` (host staging).

    ``expected``: the decoded size of each chunk (one int: the same for all); a header that
    states another content size is refused (-1: not known, the frame's own content size
    stands). Raises CorruptChunkError naming (from ``names``, in the order of ``offsets``) the
    first bad chunk and what is wrong with it.
    """
    offsets = np.asarray(offsets, np.int64)
    sizes = np.asarray(sizes, np.int64)
    end = offsets + sizes
    n = len(offsets)
    if n == 0:
        return FrameInfo(np.zeros(0, np.int64))
    expected = np.broadcast_to(np.asarray(expected, np.int64), (n,))
    _check_magic(buf, offsets, sizes, names)
    pos, fcs, has_ck = _frame_headers(buf, offsets, end, expected, names)
    pos = _walk_blocks(buf, pos, end, names) + 4 * has_ck
    bad = np.flatnonzero(pos != end)
    if len(bad):
        k = int(bad[0])
        if pos[k] < end[k] and end[k] - pos[k] >= 4 and le_uint(buf, int(pos[k]), 4) == _MAGIC:
            raise CorruptChunkError(
                f"chunk {names[k]}: another zstd frame follows the first ({int(end[k] - pos[k])} more bytes). "
                "zarr-python, numcodecs, TensorStore and zarrs write one frame per chunk, and this decoder reads "
                "one; read this array with prefer='cpu' (the native library's libzstd decodes frame sequences).")
        what = "truncated before its checksum" if pos[k] > end[k] else f"{int(end[k] - pos[k])} bytes follow the frame"
        raise _fail(names, k, what)
    return FrameInfo(fcs)


def content_size(frame: np.ndarray) -> int:
    """The decoded size a zstd frame's header states; -1 when it states none or is no frame.

    One frame, read in plain Python (a few microseconds): the CPU decoders use it to decode
    straight into their destination only when the header promises exactly its size.
    """
    if frame.nbytes < 6 or le_uint(frame, 0, 4) != _MAGIC:
        return -1
    nb, pos = _header_layout(int(frame[4]))
    if nb == 0 or pos + nb > frame.nbytes:
        return -1
    return _fcs_value(le_uint(frame, pos, nb), nb)
