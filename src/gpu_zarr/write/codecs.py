"""The codecs the writer encodes with: their names, levels, zarr metadata and CPU encoders.

One :class:`CodecSpec` per write. It gives the objects zarr-python itself puts in the
metadata (``zarr.codecs.*`` for v3, ``numcodecs`` compressors for v2), so what we write is
described exactly as zarr-python would describe it, and the numcodecs codec that encodes a
chunk on the CPU (the same one zarr-python calls), so the bytes are the ones zarr would write.

Codec names (``codec=``):

========== ===================================================== =============
name       what                                                  default level
========== ===================================================== =============
zstd       Zstandard frames (nvCOMP on the GPU, numcodecs on CPU)  3
blosc-lz4  Blosc frames, LZ4 inside, byte shuffle                 5
blosc-zstd Blosc frames, Zstandard inside, byte shuffle           5
gzip       gzip members (RFC 1952)                                5
none       raw little-endian bytes                                -
========== ===================================================== =============
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_zarr.errors import UsageError

__all__ = ["CODECS", "CodecSpec", "codec_spec"]

#: name -> (default level, lowest level, highest level)
CODECS: dict[str, tuple[int, int, int]] = {
    "zstd": (3, -131072, 22),
    "blosc-lz4": (5, 0, 9),
    "blosc-zstd": (5, 0, 9),
    "gzip": (5, 0, 9),
    "none": (0, 0, 0),
}


@dataclass(frozen=True)
class CodecSpec:
    """One codec with its level, for one dtype's item size.

    Attributes
    ----------
    name : str
        One of :data:`CODECS`.
    level : int
    itemsize : int
        Bytes per element (Blosc's ``typesize``: the byte shuffle works on it).
    """

    name: str
    level: int
    itemsize: int

    def v3_compressors(self) -> Any:
        """The ``compressors=`` argument of ``zarr.create_array`` for a v3 array."""
        from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

        if self.name == "zstd":
            return ZstdCodec(level=self.level, checksum=False)
        if self.name.startswith("blosc-"):
            cname: Any = self.name[6:]  # "lz4" or "zstd" (codec_spec checks it)
            return BloscCodec(cname=cname, clevel=self.level, shuffle="shuffle", typesize=self.itemsize)
        if self.name == "gzip":
            return GzipCodec(level=self.level)
        return None

    def v2_compressor(self) -> Any:
        """The ``compressors=`` argument of ``zarr.create_array`` for a v2 array (numcodecs)."""
        import numcodecs

        if self.name == "zstd":
            return numcodecs.Zstd(level=self.level)
        if self.name.startswith("blosc-"):
            return numcodecs.Blosc(cname=self.name[6:], clevel=self.level, shuffle=numcodecs.Blosc.SHUFFLE)
        if self.name == "gzip":
            return numcodecs.GZip(level=self.level)
        return None

    def cpu_codec(self) -> Any:
        """The numcodecs codec that encodes one chunk as zarr-python does (None: raw bytes).

        Thread-safe: numcodecs' codecs keep no state between calls (Blosc uses its
        context API, one context per call, when called from threads).
        """
        import numcodecs

        if self.name == "zstd":
            return numcodecs.Zstd(level=self.level)
        if self.name.startswith("blosc-"):
            return numcodecs.Blosc(cname=self.name[6:], clevel=self.level, shuffle=numcodecs.Blosc.SHUFFLE,
                                   blocksize=0, typesize=self.itemsize)
        if self.name == "gzip":
            return numcodecs.GZip(level=self.level)
        return None


def codec_spec(codec: str | None, level: int | None, itemsize: int) -> CodecSpec:
    """Check ``codec`` and ``level`` and return their :class:`CodecSpec`.

    Raises
    ------
    UsageError
        An unknown codec name or a level out of the codec's range.
    """
    name = "none" if codec is None else str(codec).lower().replace("_", "-")
    if name not in CODECS:
        raise UsageError(f"codec {codec!r} is not one the writer encodes; expected one of "
                         f"{', '.join(CODECS)} (or None for raw bytes)")
    default, lo, hi = CODECS[name]
    lvl = default if level is None else int(level)
    if name != "none" and not lo <= lvl <= hi:
        raise UsageError(f"level {level} is out of range for codec {name!r}: expected {lo}..{hi}")
    return CodecSpec(name, lvl, int(itemsize))
