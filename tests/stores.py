"""Real zarr stores written by zarr-python, in the layouts the engine must read.

Used by the CPU-twin tests (CI) and the GPU tests (H200 machine) alike.
"""

from __future__ import annotations

from pathlib import Path

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, ZstdCodec

SHAPE = (37, 50, 23)
CHUNKS = (8, 16, 7)  # edge chunks on every axis


def data(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(shape) > 0.5
    if dt.kind == "c":
        return (rng.normal(size=shape) * 50 + 1j * rng.normal(size=shape)).astype(dt)
    if dt.kind == "f":
        return (rng.normal(size=shape) * 100).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt.newbyteorder("="))


def write(path: Path, *, fmt: int = 3, codec: str = "raw", dtype="<u2", shape=SHAPE, chunks=CHUNKS,
          shards=None, fill_value=0, partial: bool = True, seed: int = 0, index_location="end",
          separator=None, chunk_key_encoding=None, checksum=False, endian=None, order=None,
          transpose=None, level: int = 1) -> tuple[zarr.Array, np.ndarray]:
    """Write an array; with ``partial`` some chunks (and shards) are never written.

    ``codec``: "raw", "zstd", "gzip" (v2 and v3) or "zlib" (v2 only), at ``level``.
    """
    kw: dict = {}
    if fmt == 2:
        kw["compressors"] = {"zstd": numcodecs.Zstd(level=level, checksum=checksum), "gzip": numcodecs.GZip(level),
                             "zlib": numcodecs.Zlib(level)}.get(codec)
        if separator:
            kw["chunk_key_encoding"] = {"name": "v2", "separator": separator}
        if order:
            kw["order"] = order
    else:
        if shards is not None:
            inner = [BytesCodec()] + _v3_compressors(codec, level, checksum)
            kw["serializer"] = ShardingCodec(chunk_shape=chunks, codecs=inner,
                                             index_codecs=[BytesCodec(), Crc32cCodec()],
                                             index_location=index_location)
            kw["compressors"] = None
            chunks = shards
        else:
            kw["compressors"] = _v3_compressors(codec, level, checksum) or None
            if endian:
                kw["serializer"] = BytesCodec(endian=endian)
        if chunk_key_encoding:
            kw["chunk_key_encoding"] = chunk_key_encoding
        if transpose:
            from zarr.codecs import TransposeCodec

            kw["filters"] = [TransposeCodec(order=transpose)]
    arr = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype=dtype, zarr_format=fmt,
                            fill_value=fill_value, overwrite=True, **kw)
    return fill(path, arr, data(shape, dtype, seed), partial)


def fill(path, arr, values, partial: bool = False):
    """Write ``values`` into a new array (with ``partial``, only some chunks: the others stay
    missing); return the array opened read-only and the values."""
    if partial:
        half = values.shape[0] // 2
        arr[:half] = values[:half]
        arr[-3:, : values.shape[1] // 3] = values[-3:, : values.shape[1] // 3]
    else:
        arr[...] = values
    return zarr.open_array(str(path), mode="r"), values


def _v3_compressors(codec: str, level: int, checksum: bool) -> list:
    if codec == "zstd":
        return [ZstdCodec(level=level, checksum=checksum)]
    if codec == "gzip":
        return [GzipCodec(level=level)]
    if codec != "raw":
        raise ValueError(f"no v3 codec {codec!r} in these test stores")
    return []


# (id, kwargs) of every layout the engine serves
LAYOUTS = [
    ("v3-raw", dict(fmt=3, codec="raw")),
    ("v3-zstd", dict(fmt=3, codec="zstd")),
    ("v3-zstd-checksum", dict(fmt=3, codec="zstd", checksum=True)),
    ("v2-raw", dict(fmt=2, codec="raw")),
    ("v2-zstd", dict(fmt=2, codec="zstd")),
    ("v2-raw-slash", dict(fmt=2, codec="raw", separator="/")),
    ("v2-fill-null", dict(fmt=2, codec="zstd", fill_value=None)),
    ("v3-v2keys", dict(fmt=3, codec="raw", chunk_key_encoding={"name": "v2", "separator": "."})),
    ("v3-v2keys-slash", dict(fmt=3, codec="zstd", chunk_key_encoding={"name": "v2", "separator": "/"})),
    ("v3-dot-keys", dict(fmt=3, codec="zstd", chunk_key_encoding={"name": "default", "separator": "."})),
    ("v3-raw-bigendian", dict(fmt=3, codec="raw", dtype=">i2", endian="big")),
    ("v3-zstd-bigendian", dict(fmt=3, codec="zstd", dtype=">f8", endian="big")),
    ("v3-fill-7", dict(fmt=3, codec="zstd", fill_value=7)),
    ("v3-shard-raw", dict(fmt=3, codec="raw", chunks=(4, 8, 7), shards=(8, 16, 14))),
    ("v3-shard-zstd", dict(fmt=3, codec="zstd", chunks=(4, 8, 7), shards=(8, 16, 14))),
    ("v3-shard-zstd-start", dict(fmt=3, codec="zstd", chunks=(4, 8, 7), shards=(8, 16, 14),
                                 index_location="start")),
    ("v2-F-order", dict(fmt=2, codec="zstd", order="F")),
    ("v2-F-order-raw-c8", dict(fmt=2, codec="raw", order="F", dtype="<c8")),
    ("v3-transpose", dict(fmt=3, codec="zstd", transpose=(2, 0, 1))),
    ("v3-transpose-bigendian", dict(fmt=3, codec="raw", transpose=(1, 2, 0), dtype=">i4", endian="big")),
]

DTYPES = ["|u1", "<u2", "<i2", "<f4", ">u2", ">f4", "<i8", "<c8", "|b1"]

SELECTIONS = [
    Ellipsis,
    (5,),
    (slice(3, 30, 4), slice(None, None, -3), 7),
    (slice(None), slice(10, 40), slice(0, 23, 2)),
    (slice(7, 9), slice(15, 17), slice(6, 8)),  # crosses chunk edges in every axis
    (-1, Ellipsis, 3),
    (slice(5, 5),),
]

# gzip / zlib layouts (nvCOMP Deflate on the GPU, zlib on the CPU twin)
DEFLATE_LAYOUTS = [
    ("v2-gzip-1", dict(fmt=2, codec="gzip", level=1)),
    ("v2-gzip-9", dict(fmt=2, codec="gzip", level=9, dtype="<f4")),
    ("v2-zlib-0", dict(fmt=2, codec="zlib", level=0)),
    ("v2-zlib-6", dict(fmt=2, codec="zlib", level=6, dtype=">i4")),
    ("v3-gzip-5", dict(fmt=3, codec="gzip", level=5)),
    ("v3-gzip-bigendian", dict(fmt=3, codec="gzip", level=1, dtype=">u2", endian="big")),
    ("v3-shard-gzip", dict(fmt=3, codec="gzip", level=6, chunks=(4, 8, 7), shards=(8, 16, 14))),
    ("v3-shard-gzip-start", dict(fmt=3, codec="gzip", level=1, chunks=(4, 8, 7), shards=(8, 16, 14),
                                 index_location="start", dtype="|u1")),
]
