"""gzip and zlib chunks through nvCOMP Deflate: the wrappers are parsed on the host.

zarr's ``gzip`` codec (v2 compressor and v3 codec, numcodecs ``GZip``) stores each chunk as
one gzip member (RFC 1952); the v2 ``zlib`` compressor stores a zlib stream (RFC 1950).
Both wrap one raw deflate stream (RFC 1951), which is what nvCOMP's Deflate decoder reads.
The host parses the wrappers of every chunk of a batch at once (numpy over the batch, no
per-chunk Python on the common path), checks them against the chunk's byte count and the
decoded size the array metadata gives, and hands the raw deflate spans to the decode
stage: ONE nvCOMP Deflate call per batch on the GPU, zlib on the CPU twin.

What guards the data
--------------------
- Host, both paths: the wrapper (magic, method, flags, header fields inside the chunk,
  zlib's FCHECK, no preset dictionary) and gzip's ISIZE against the decoded chunk size.
- GPU: nvCOMP's per-chunk status and its actual decoded size (must equal the chunk size),
  and the checksum of the decoded bytes, computed on the GPU in the same batch: gzip's
  CRC-32 by nvCOMP (``nvcompBatchedCRC32Async``), zlib's Adler-32 by a small kernel of
  ours (self-tested against ``zlib.adler32`` once per device; skipped with a warning if
  that fails).
- CPU twin: zlib also checks that the deflate stream ends exactly where the wrapper says,
  and both the CRC-32 and the Adler-32 are verified.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_zarr.engine.binary import le_uint, le_uints
from gpu_zarr.errors import CorruptChunkError

__all__ = ["DeflateStage", "DeflateStreams", "parse_gzip", "parse_zlib"]

_FTEXT, _FHCRC, _FEXTRA, _FNAME, _FCOMMENT = 0x01, 0x02, 0x04, 0x08, 0x10
_WINDOW = 64  # bytes scanned per step when looking for the end of FNAME / FCOMMENT


@dataclass
class DeflateStreams:
    """The raw deflate stream of every chunk of a batch, found by the wrapper parse.

    Attributes
    ----------
    offsets, sizes : ndarray of int64
        Where each chunk's raw deflate stream lies in the staging buffer.
    checksums : ndarray of uint32
        gzip: the CRC-32 of the decoded bytes; zlib: their Adler-32 (from the trailers).
    wrapper : {"gzip", "zlib"}
    """

    offsets: np.ndarray
    sizes: np.ndarray
    checksums: np.ndarray
    wrapper: str


def _fail(names: Sequence[str], k: int, wrapper: str, what: str) -> CorruptChunkError:
    return CorruptChunkError(
        f"chunk {names[k]}: {what}. Expected one {wrapper} stream as zarr's {wrapper} codec writes it; the chunk "
        "is corrupt or truncated. Nothing was decoded from it; rewrite or delete that chunk.")


def _refuse(mask: np.ndarray, names: Sequence[str], wrapper: str, what: str | Callable[[int], str],
            rows: np.ndarray | None = None) -> None:
    """Raise :func:`_fail` for the first chunk where ``mask`` is true (``rows``: the chunks the
    mask's entries are; ``what``: the message, or a function of that chunk giving it)."""
    idx = np.flatnonzero(mask)
    if len(idx):
        k = int(idx[0]) if rows is None else int(rows[idx[0]])
        raise _fail(names, k, wrapper, what(k) if callable(what) else what)


def _skip_zero_terminated(buf: np.ndarray, pos: np.ndarray, end: np.ndarray, names: Sequence[str],
                          rows: np.ndarray, what: str) -> np.ndarray:
    """Positions just past the NUL that ends a string starting at ``pos`` (vectorised in windows)."""
    pos = pos.copy()
    active = np.arange(len(pos))
    while len(active):
        p = pos[active]
        window = p[:, None] + np.arange(_WINDOW)[None, :]
        inside = window < end[active][:, None]
        vals = np.where(inside, buf[np.minimum(window, len(buf) - 1)], 1)
        zero = (vals == 0) & inside
        found = zero.any(axis=1)
        first = np.argmax(zero, axis=1)
        pos[active[found]] = p[found] + first[found] + 1
        rest = ~found
        ran_out = rest & ~inside.all(axis=1)
        if ran_out.any():
            k = int(rows[active[np.flatnonzero(ran_out)[0]]])
            raise _fail(names, k, "gzip", f"the header's {what} runs past the end of the chunk")
        pos[active[rest]] = p[rest] + _WINDOW
        active = active[rest]
    return pos


def _batch(buf: np.ndarray, offsets: Any, sizes: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """A batch's staging as bytes, its offsets and sizes as int64, and its length."""
    offsets, sizes = np.asarray(offsets, np.int64), np.asarray(sizes, np.int64)
    return buf.view(np.uint8).reshape(-1), offsets, sizes, len(offsets)


def parse_gzip(buf: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, expected: int | np.ndarray,
               names: Sequence[str]) -> DeflateStreams:
    """Find the raw deflate stream of every gzip member ``buf[offsets[k] : + sizes[k]]`` (host
    staging) of ``expected`` decoded bytes (one int: the same for all), whose trailer's ISIZE
    (size mod 2**32) must match it.

    Raises CorruptChunkError naming (from ``names``) the first chunk whose wrapper is wrong:
    magic, method, reserved flags, header fields past the end, header CRC, or an ISIZE that is
    not the chunk's size.
    """
    buf, offsets, sizes, n = _batch(buf, offsets, sizes)
    if n == 0:
        return DeflateStreams(offsets, sizes, np.zeros(0, np.uint32), "gzip")
    expected = np.broadcast_to(np.asarray(expected, np.int64), (n,))
    end = offsets + sizes
    _refuse(sizes < 20, names, "gzip",  # 10 header + at least 2 deflate + 8 trailer
            lambda k: f"{int(sizes[k])} bytes is too short for a gzip member")
    magic = buf[offsets].astype(np.int64) | (buf[offsets + 1].astype(np.int64) << 8)
    _refuse(magic != 0x8B1F, names, "gzip",
            lambda k: f"starts with bytes {bytes(buf[offsets[k]:offsets[k] + 2]).hex()}, not the gzip magic 1f8b")
    _refuse(buf[offsets + 2] != 8, names, "gzip",
            lambda k: f"compression method {int(buf[offsets[k] + 2])}, not 8 (deflate)")
    flg = buf[offsets + 3].astype(np.int64)
    _refuse((flg & 0xE0) != 0, names, "gzip", "header flags have reserved bits set")
    pos = offsets + 10
    m = np.flatnonzero(flg & _FEXTRA)
    if len(m):
        _refuse(pos[m] + 2 > end[m] - 8, names, "gzip", "the header's extra field runs past the end of the chunk", m)
        pos[m] += 2 + le_uints(buf, pos[m], 2)
    for flag, what in ((_FNAME, "file name"), (_FCOMMENT, "comment")):
        m = np.flatnonzero(flg & flag)
        if len(m):
            _refuse(pos[m] >= end[m] - 8, names, "gzip", f"the header's {what} runs past the end of the chunk", m)
            pos[m] = _skip_zero_terminated(buf, pos[m], end[m] - 8, names, m, what)
    m = np.flatnonzero(flg & _FHCRC)
    if len(m):
        _refuse(pos[m] + 2 > end[m] - 8, names, "gzip", "the header CRC runs past the end of the chunk", m)
        for j in m:  # rare (zarr writers never set FHCRC): one small crc per such chunk
            o, p = int(offsets[j]), int(pos[j])
            if (zlib.crc32(buf[o:p]) & 0xFFFF) != le_uint(buf, p, 2):
                raise _fail(names, int(j), "gzip", "the header CRC does not match the header")
        pos[m] += 2
    raw_sizes = end - 8 - pos
    _refuse(raw_sizes < 2, names, "gzip", "no room for a deflate stream between header and trailer")
    crc = le_uints(buf, end - 8, 4).astype(np.uint32)
    isize = le_uints(buf, end - 4, 4)
    _refuse(isize != (expected & 0xFFFFFFFF), names, "gzip", lambda k: f"the trailer says {int(isize[k])} decoded "
            f"bytes (mod 2**32); the array metadata says a chunk holds {int(expected[k])}")
    return DeflateStreams(pos, raw_sizes, crc, "gzip")


def parse_zlib(buf: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, names: Sequence[str]) -> DeflateStreams:
    """Find the raw deflate stream of every zlib stream ``buf[offsets[k] : + sizes[k]]``.

    Checks CMF (method 8, window <= 32 KiB), FCHECK, and refuses a preset dictionary
    (FDICT), which zarr never writes. The Adler-32 trailer is returned, not checked here.

    Raises
    ------
    CorruptChunkError
        Naming the first chunk whose wrapper is wrong or too short.
    """
    buf, offsets, sizes, n = _batch(buf, offsets, sizes)
    if n == 0:
        return DeflateStreams(offsets, sizes, np.zeros(0, np.uint32), "zlib")
    _refuse(sizes < 8, names, "zlib",  # 2 header + at least 2 deflate + 4 trailer
            lambda k: f"{int(sizes[k])} bytes is too short for a zlib stream")
    cmf = buf[offsets].astype(np.int64)
    flg = buf[offsets + 1].astype(np.int64)
    _refuse(((cmf & 0x0F) != 8) | ((cmf >> 4) > 7), names, "zlib",
            lambda k: f"header byte CMF={int(cmf[k]):#04x} is not deflate with a window of at most 32 KiB")
    _refuse((cmf * 256 + flg) % 31 != 0, names, "zlib", "the header check bits (FCHECK) are wrong")
    _refuse((flg & 0x20) != 0, names, "zlib", "the stream needs a preset dictionary (FDICT), which zarr never writes")
    end = offsets + sizes
    adler = (buf[end - 4].astype(np.int64) << 24 | buf[end - 3].astype(np.int64) << 16
             | buf[end - 2].astype(np.int64) << 8 | buf[end - 1].astype(np.int64)).astype(np.uint32)
    return DeflateStreams(offsets + 2, sizes - 6, adler, "zlib")


class DeflateStage:
    """The codec stage of gzip and zlib chunks (see the engine contract's ``CodecStage``).

    Parameters
    ----------
    wrapper : {"gzip", "zlib"}

    Notes
    -----
    ``prepare`` parses the wrappers on the host (staging buffer, before upload);
    ``decode`` makes ONE ``ops.decode_batch("deflate", ...)`` call per batch: nvCOMP on
    the GPU (plus one batched CRC-32 / Adler-32 of the decoded chunks), zlib on the CPU
    twin; both verify the trailers' checksums (see the module docstring). nvCOMP wants 4-byte
    aligned deflate input and the streams start 2 (zlib) or 10+ (gzip) bytes into a chunk, so
    the GPU decoder first gathers them into an aligned buffer: up to one batch of compressed
    bytes of scratch, counted in :meth:`scratch_bytes`.
    """

    nvcomp = True
    decodes = True
    native_checks = False  # the wrappers' parse finds the deflate stream and its checksum: needed on every path
    device_checks = False

    def __init__(self, wrapper: str) -> None:
        if wrapper not in ("gzip", "zlib"):
            raise ValueError(f"wrapper must be 'gzip' or 'zlib', not {wrapper!r}")
        self.name = wrapper
        self.native = wrapper
        self.v2_names = (wrapper,)
        # zarr's v3 ``gzip`` codec; numcodecs' zarr3 wrappers (``numcodecs.zarr3``, in
        # zarr.codecs.numcodecs since zarr 3.2) for both
        self.v3_chains = (("[bytes, gzip]",) if wrapper == "gzip" else ()) + (f"[bytes, numcodecs.{wrapper}]",)

    def recognise_v2(self, compressor: Any, dtype: np.dtype) -> dict[str, Any] | None:
        return {} if getattr(compressor, "codec_id", None) == self.name else None

    def recognise_v3(self, chain: Sequence[Any]) -> dict[str, Any] | None:
        """zarr's v3 ``gzip`` codec (gzip), numcodecs' zarr3 ``GZip`` / ``Zlib``."""
        if len(chain) != 1:
            return None
        if self.name == "gzip":
            from zarr.codecs import GzipCodec

            if isinstance(chain[0], GzipCodec):
                return {}
        return {} if str(getattr(chain[0], "codec_name", "")) == f"numcodecs.{self.name}" else None

    def label(self, params: Mapping[str, Any]) -> str:
        return self.name

    def prepare(self, staging: np.ndarray, batch: Any, lay: Any, names: Sequence[str]) -> DeflateStreams:
        """Parse every chunk's wrapper; raise CorruptChunkError naming a bad chunk."""
        if self.name == "gzip":
            return parse_gzip(staging, batch.src_offsets, batch.src_sizes, lay.inner_nbytes, names)
        return parse_zlib(staging, batch.src_offsets, batch.src_sizes, names)

    def decode(self, ops: Any, src: Any, batch: Any, prep: DeflateStreams, dst: Any, dst_offsets: np.ndarray,
               lay: Any, names: Sequence[str], slot: int = 0, wait: Any = None) -> None:
        """Decode the batch's raw deflate streams into ``dst`` in one batched call."""
        n = len(prep.offsets)
        if n == 0:
            return
        size = int(lay.inner_nbytes)
        dst_offsets = np.asarray(dst_offsets[:n], np.int64)
        gz = prep.wrapper == "gzip"
        ops.decode_batch("deflate", src, prep.offsets, prep.sizes, dst, dst_offsets, np.full(n, size, np.int64),
                         names, slot=slot, wait=wait, crc32=prep.checksums if gz else None,
                         adler32=None if gz else prep.checksums)

    def scratch_bytes(self, chunks_per_batch: int, lay: Any) -> int:
        """Device memory beyond src/dst for one batch: the aligned copy of the deflate streams.

        Bounded by the largest a deflate stream of one chunk can be (stored blocks: 5 bytes
        per 64 KiB) plus alignment; nvCOMP Deflate itself needs no scratch (6.0).
        """
        size = int(lay.inner_nbytes)
        return int(chunks_per_batch) * (size + 5 * (size // 65535 + 1) + 16)
