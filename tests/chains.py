"""Real zarr stores whose codec chains go beyond one core codec: checksums, ``numcodecs.*``
codecs in v3, v2 filters, LZ4 / BZ2 compressors, array-to-array codecs, nested shards.

Each entry of :data:`CHAINS` is ``(id, make)``; ``make(path)`` writes the store with
zarr-python and returns it opened read-only. Used by the CPU-twin tests (CI) and the GPU tests.
"""

from __future__ import annotations

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, TransposeCodec, ZstdCodec

from stores import data, fill

SHAPE = (37, 50, 23)
CHUNKS = (8, 16, 7)


def _nc():
    """zarr v3's wrappers of numcodecs codecs (``numcodecs.*`` names): in zarr itself from 3.2,
    in numcodecs before."""
    try:
        from zarr.codecs import numcodecs as nc
    except ImportError:
        import numcodecs.zarr3 as nc
    return nc


def _v3(path, dtype="<u2", *, filters=None, serializer="auto", compressors=None, chunks=CHUNKS, shards=None,
        fill_value=0, values=None):
    kw = dict(filters=filters, compressors=compressors)
    if serializer != "auto":
        kw["serializer"] = serializer
    arr = zarr.create_array(str(path), shape=SHAPE, chunks=chunks, shards=shards, dtype=dtype, zarr_format=3,
                            fill_value=fill_value, overwrite=True, **kw)
    return fill(path, arr, data(SHAPE, dtype) if values is None else values, partial=True)


def _v2(path, dtype="<u2", *, filters=None, compressor=None, order="C", fill_value=0, values=None):
    arr = zarr.create_array(str(path), shape=SHAPE, chunks=CHUNKS, dtype=dtype, zarr_format=2, fill_value=fill_value,
                            overwrite=True, filters=filters, compressors=compressor, order=order)
    return fill(path, arr, data(SHAPE, dtype) if values is None else values, partial=True)


def _smooth(dtype):
    """Values a lossy filter keeps exactly enough to compare with zarr's own read."""
    x = np.linspace(0, 20, int(np.prod(SHAPE))).reshape(SHAPE)
    return (np.sin(x) * 100).astype(dtype)


def _sharded(path, inner, index=None, dtype="<u2", chunks=(4, 8, 7), shard=(8, 16, 14)):
    sc = ShardingCodec(chunk_shape=chunks, codecs=inner, index_codecs=index or [BytesCodec(), Crc32cCodec()])
    arr = zarr.create_array(str(path), shape=SHAPE, chunks=shard, dtype=dtype, zarr_format=3, fill_value=0,
                            overwrite=True, serializer=sc, compressors=None)
    return fill(path, arr, data(SHAPE, dtype), partial=True)


def _nested(path):
    inner = ShardingCodec(chunk_shape=(2, 4, 7), codecs=[BytesCodec(), ZstdCodec(level=1)])
    return _sharded(path, [inner], chunks=(4, 8, 7))


CHAINS = [
    # checksums around a core codec: frames stripped natively, the core decoded as usual
    ("v3-zstd-crc32c", lambda p: _v3(p, compressors=[ZstdCodec(level=1), Crc32cCodec()])),
    ("v3-raw-crc32c", lambda p: _v3(p, compressors=[Crc32cCodec()])),
    ("v3-gzip-crc32c-transpose", lambda p: _v3(p, "<i4", filters=[TransposeCodec(order=(2, 0, 1))],
                                               compressors=[GzipCodec(level=1), Crc32cCodec()])),
    ("v3-shard-zstd-crc32c", lambda p: _sharded(p, [BytesCodec(), ZstdCodec(level=1), Crc32cCodec()])),
    ("v3-shard-raw-crc32c-noindexcrc", lambda p: _sharded(p, [BytesCodec(), Crc32cCodec()], index=[BytesCodec()])),
    ("v3-shard-zstd-bigendian-index", lambda p: _sharded(p, [BytesCodec(), ZstdCodec(level=1)],
                                                         index=[BytesCodec(endian="big"), Crc32cCodec()])),
    ("v3-shard-raw-bigendian-index-nocrc", lambda p: _sharded(p, [BytesCodec()], index=[BytesCodec(endian="big")])),
    ("v3-shard-bigendian-zstd-crc32c", lambda p: _sharded(p, [BytesCodec(endian="big"), ZstdCodec(level=1),
                                                             Crc32cCodec()], dtype=">f4")),
    # numcodecs.* names in v3 and steps with no engine implementation: the codecs' own decode
    ("v3-numcodecs-zstd", lambda p: _v3(p, compressors=[_nc().Zstd(level=1)])),
    ("v3-numcodecs-lz4", lambda p: _v3(p, compressors=[_nc().LZ4()])),
    ("v3-numcodecs-blosc-crc32c", lambda p: _v3(p, compressors=[_nc().Blosc(cname="lz4", clevel=5, shuffle=1),
                                                             Crc32cCodec()])),
    ("v3-numcodecs-bz2-crc32c", lambda p: _v3(p, "<f8", compressors=[_nc().BZ2(level=1), Crc32cCodec()])),
    ("v3-shuffle-zstd", lambda p: _v3(p, "<i4", compressors=[_nc().Shuffle(elementsize=4), ZstdCodec(level=1)])),
    ("v3-delta-zstd", lambda p: _v3(p, "<i2", filters=[_nc().Delta(dtype="<i2")], compressors=[ZstdCodec(level=1)])),
    ("v3-fixedscaleoffset", lambda p: _v3(p, "<f8", filters=[_nc().FixedScaleOffset(offset=0, scale=10, dtype="<f8",
                                                                                      astype="<i4")],
                                         compressors=[ZstdCodec(level=1)], values=_smooth("<f8"))),
    ("v3-shard-lz4", lambda p: _sharded(p, [BytesCodec(), _nc().LZ4()])),
    ("v3-shard-delta-crc32c", lambda p: _sharded(p, [_nc().Delta(dtype="<u2"), BytesCodec(), ZstdCodec(level=1),
                                                     Crc32cCodec()])),
    ("v3-nested-shards", _nested),
    # zarr v2 filters and compressors beyond the core list
    ("v2-delta-zstd", lambda p: _v2(p, "<i2", filters=[numcodecs.Delta(dtype="<i2")], compressor=numcodecs.Zstd(1))),
    ("v2-fixedscaleoffset-blosc", lambda p: _v2(p, "<f8", filters=[numcodecs.FixedScaleOffset(
        offset=0, scale=10, dtype="<f8", astype="<i4")], compressor=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE),
        values=_smooth("<f8"))),
    ("v2-quantize", lambda p: _v2(p, "<f4", filters=[numcodecs.Quantize(digits=3, dtype="<f4")],
                                  compressor=numcodecs.Zlib(1), values=_smooth("<f4"))),
    ("v2-shuffle-astype", lambda p: _v2(p, "<i4", filters=[numcodecs.AsType(encode_dtype="<i8", decode_dtype="<i4"),
                                                          numcodecs.Shuffle(elementsize=8)], compressor=numcodecs.Zstd(1))),
    ("v2-lz4", lambda p: _v2(p, compressor=numcodecs.LZ4())),
    ("v2-bz2-bigendian", lambda p: _v2(p, ">u2", compressor=numcodecs.BZ2(1))),
    ("v2-delta-F-order", lambda p: _v2(p, "<i4", filters=[numcodecs.Delta(dtype="<i4")], compressor=None, order="F")),
    # element steps after the core (engine/codecs/elements.py), and filters they leave to the codecs
    ("v2-delta-u1-gzip", lambda p: _v2(p, "|u1", filters=[numcodecs.Delta(dtype="|u1")], compressor=numcodecs.GZip(1))),
    ("v2-delta-i8-raw", lambda p: _v2(p, "<i8", filters=[numcodecs.Delta(dtype="<i8")], compressor=None)),
    ("v2-astype-f4-f8-zstd", lambda p: _v2(p, "<f8", filters=[numcodecs.AsType(encode_dtype="<f4", decode_dtype="<f8")],
                                          compressor=numcodecs.Zstd(1), values=_smooth("<f4").astype("<f8"))),
    ("v2-astype-u2-i4-raw", lambda p: _v2(p, "<i4", filters=[numcodecs.AsType(encode_dtype="<u2", decode_dtype="<i4")],
                                         compressor=None, values=_smooth("<i4") + 200)),
    ("v2-fixedscaleoffset-f4-u1", lambda p: _v2(p, "<f4", filters=[numcodecs.FixedScaleOffset(
        offset=-100, scale=1.3, dtype="<f4", astype="|u1")], compressor=numcodecs.Zstd(1), values=_smooth("<f4"))),
    ("v2-bitround-zstd", lambda p: _v2(p, "<f4", filters=[numcodecs.BitRound(keepbits=7)], compressor=numcodecs.Zstd(1))),
    ("v2-astype-delta-two-steps", lambda p: _v2(p, "<i4", filters=[numcodecs.Delta(dtype="<i4"), numcodecs.AsType(
        encode_dtype="<i8", decode_dtype="<i4")], compressor=numcodecs.Zstd(1))),
    ("v2-delta-astype-differs", lambda p: _v2(p, "<i4", filters=[numcodecs.Delta(dtype="<i4", astype="<i2")],
                                             compressor=numcodecs.Zstd(1), values=_smooth("<i4"))),
    ("v2-fixedscaleoffset-to-int", lambda p: _v2(p, "<i4", filters=[numcodecs.FixedScaleOffset(
        offset=3, scale=2, dtype="<i4", astype="<i2")], compressor=numcodecs.Zstd(1), values=_smooth("<i4"))),
    ("v2-delta-bigendian", lambda p: _v2(p, ">i2", filters=[numcodecs.Delta(dtype=">i2")], compressor=numcodecs.Zstd(1))),
    ("v3-quantize-blosc", lambda p: _v3(p, "<f8", filters=[_nc().Quantize(digits=4, dtype="<f8")],
                                       compressors=[_nc().Blosc(cname="zstd", clevel=1, shuffle=2)],
                                       values=_smooth("<f8"))),
    ("v3-delta-bigendian-bytes", lambda p: _v3(p, "<i4", filters=[_nc().Delta(dtype="<i4")],
                                              serializer=BytesCodec(endian="big"), compressors=[ZstdCodec(level=1)])),
    ("v3-astype-crc32c", lambda p: _v3(p, "<f8", filters=[_nc().AsType(encode_dtype="<f4", decode_dtype="<f8")],
                                      compressors=[Crc32cCodec()], values=_smooth("<f4").astype("<f8"))),
    ("v2-shuffle-delta-zstd", lambda p: _v2(p, "<u2", filters=[numcodecs.Delta(dtype="<u2"),
                                                               numcodecs.Shuffle(elementsize=2)],
                                           compressor=numcodecs.Zstd(1))),
    ("v3-shuffle-delta-transpose-free", lambda p: _v3(p, "<i8", filters=[_nc().Delta(dtype="<i8")],
                                                      compressors=[_nc().Shuffle(elementsize=8), ZstdCodec(level=1)])),
    ("v2-shuffle-other-size", lambda p: _v2(p, "<u2", filters=[numcodecs.Shuffle(elementsize=4)], compressor=None)),
    ("v3-shuffle-bigendian", lambda p: _v3(p, "<u4", serializer=BytesCodec(endian="big"),
                                           compressors=[_nc().Shuffle(elementsize=4), ZstdCodec(level=1)])),
]

#: chains whose filters run as element steps after the core codec (the rest of their kind stay
#: with the codecs' own decode: tests/test_chains.py holds both lists to the layout)
ELEMENT_CHAINS = ("v3-delta-zstd", "v3-fixedscaleoffset", "v3-shard-delta-crc32c", "v2-delta-zstd",
                  "v2-fixedscaleoffset-blosc", "v2-quantize", "v2-delta-u1-gzip", "v2-delta-i8-raw",
                  "v2-astype-f4-f8-zstd", "v2-astype-u2-i4-raw", "v2-fixedscaleoffset-f4-u1",
                  "v2-astype-delta-two-steps", "v3-quantize-blosc", "v3-astype-crc32c", "v2-shuffle-astype",
                  "v3-shuffle-zstd", "v2-shuffle-delta-zstd", "v3-shuffle-delta-transpose-free")
HOST_FILTER_CHAINS = ("v2-delta-F-order", "v2-delta-astype-differs", "v2-fixedscaleoffset-to-int",
                      "v2-delta-bigendian", "v3-delta-bigendian-bytes", "v2-shuffle-other-size",
                      "v3-shuffle-bigendian")
