"""Blosc chunks written by numcodecs (the ground truth) for the parser, unshuffle and engine tests.

Shared by the CPU-twin tests (CI) and the GPU tests (H200 machine).
"""

from __future__ import annotations

import numcodecs
import numpy as np

from gpu_zarr.engine.codecs.blosc import decode_plan, parse_batch

CNAMES = ["lz4", "lz4hc", "zstd", "zlib", "blosclz"]
SHUFFLES = {"noshuffle": numcodecs.Blosc.NOSHUFFLE, "shuffle": numcodecs.Blosc.SHUFFLE,
            "bitshuffle": numcodecs.Blosc.BITSHUFFLE}
TYPESIZES = [1, 2, 4, 8, 16]
CLEVELS = [0, 1, 5, 9]
# auto, 4 KiB, odd: numcodecs' c-blosc raises small forced sizes to 64 KiB for typesize < 8 (so
# 70001 gives odd blocks there) and rounds them down to a multiple of typesize
BLOCKSIZES = [0, 4096, 1000, 70001]


def payload(nbytes: int, ts: int, kind: str, seed: int = 0) -> np.ndarray:
    """``nbytes`` of data: ``smooth`` compresses (noisy low bytes), ``random`` does not."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        return rng.integers(0, 256, nbytes, dtype=np.uint8)
    n = -(-nbytes // ts)
    ramp = (np.arange(n, dtype=np.int64) // 3 + rng.integers(0, 4, n)).astype("<u8")
    elems = np.zeros((n, ts), np.uint8)
    raw = ramp.view(np.uint8).reshape(n, 8)
    elems[:, :min(ts, 8)] = raw[:, :min(ts, 8)]
    return elems.reshape(-1)[:nbytes].copy()


def encode(buf: np.ndarray, cname: str, clevel: int, shuffle: int, ts: int, blocksize: int = 0) -> bytes:
    return bytes(numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=shuffle, blocksize=blocksize,
                                 typesize=ts).encode(buf))


def stage(chunks: list[bytes], *, skew: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chunks back to back in one staging buffer, deliberately misaligned by ``skew``."""
    sizes = np.array([len(c) for c in chunks], np.int64)
    offs = np.cumsum(np.concatenate([[skew], sizes[:-1] + skew])).astype(np.int64)
    staging = np.zeros(int(offs[-1] + sizes[-1]) + 8 if len(chunks) else 8, np.uint8)
    for o, c in zip(offs, chunks):
        staging[o:o + len(c)] = np.frombuffer(c, np.uint8)
    return staging, offs, sizes


def decode_chunks(ops, chunks: list[bytes], nbytes: int, names=None):
    """Parse and decode a batch through ``ops``; returns (decoded rows as numpy, plan)."""
    staging, offs, sizes = stage(chunks)
    names = names or [f"c/{k}" for k in range(len(chunks))]
    plan = parse_batch(staging, offs, sizes, nbytes, names)
    stride = -(-nbytes // 16) * 16 + 16
    dst_offsets = np.arange(len(chunks), dtype=np.int64) * stride + 8
    if ops.name == "gpu":
        src = ops.xp.asarray(staging)
        dst = ops.xp.zeros(len(chunks) * stride + 16, np.uint8)
    else:
        src, dst = staging, np.zeros(len(chunks) * stride + 16, np.uint8)
    decode_plan(ops, src, plan, dst, dst_offsets, names)
    if ops.name == "gpu":
        ops.sync()
        dst = dst.get()
    return [dst[o:o + nbytes] for o in dst_offsets], plan


def reorder_blocks(chunk: bytes, order: list[int]) -> bytes:
    """The same chunk with its blocks' bytes stored in another order (the offset table follows)."""
    b = np.frombuffer(chunk, np.uint8)
    nbytes, blocksize, cbytes = np.frombuffer(chunk[4:16], "<i4")
    nblocks = -(-int(nbytes) // int(blocksize))
    starts = np.frombuffer(chunk[16:16 + 4 * nblocks], "<i4").astype(np.int64)
    ends = np.append(starts[1:], cbytes)
    assert (np.diff(starts) > 0).all()
    body = [b[starts[i]:ends[i]] for i in range(nblocks)]
    pos = 16 + 4 * nblocks
    new_starts = np.zeros(nblocks, np.int64)
    parts = []
    for i in order:
        new_starts[i] = pos
        parts.append(body[i])
        pos += len(body[i])
    return chunk[:16] + new_starts.astype("<i4").tobytes() + b"".join(p.tobytes() for p in parts)


def write_blosc(path, *, fmt: int = 2, cname: str = "lz4", clevel: int = 5, shuffle: str = "shuffle",
                dtype="<u2", shape=(37, 50, 23), chunks=(8, 16, 7), shards=None, endian=None, partial=True,
                typesize=None, seed: int = 0):
    """A Blosc array written by zarr-python (v2 compressor, v3 codec, or v3 sharded inner codec).

    Returns the array opened read-only and the values written (``partial`` leaves chunks out).
    """
    import zarr
    from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec

    from stores import data, fill  # tests/stores.py

    kw: dict = {}
    if fmt == 2:
        kw["compressors"] = numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=SHUFFLES[shuffle])
    else:
        blosc = BloscCodec(cname=cname, clevel=clevel, shuffle=shuffle, typesize=typesize)
        ser = BytesCodec(endian=endian) if endian else BytesCodec()
        if shards is not None:
            kw["serializer"] = ShardingCodec(chunk_shape=chunks, codecs=[ser, blosc],
                                             index_codecs=[BytesCodec(), Crc32cCodec()])
            kw["compressors"] = None
            chunks = shards
        else:
            kw["serializer"] = ser
            kw["compressors"] = blosc
    arr = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype=dtype, zarr_format=fmt, fill_value=0,
                            overwrite=True, **kw)
    values = data(shape, dtype, seed)
    if np.dtype(dtype).kind in "iu":  # smooth plus noise: some streams compress, some are stored raw
        ramp = np.indices(shape).sum(axis=0) % 200
        values = (ramp + (values % 7)).astype(dtype)
    return fill(path, arr, values, partial)


# (id, kwargs) of Blosc layouts the engine reads
BLOSC_LAYOUTS = [
    ("v2-lz4-shuffle", {"fmt": 2, "cname": "lz4", "shuffle": "shuffle"}),
    ("v2-zstd-bitshuffle", {"fmt": 2, "cname": "zstd", "shuffle": "bitshuffle"}),
    ("v2-zlib-noshuffle-f8", {"fmt": 2, "cname": "zlib", "shuffle": "noshuffle", "dtype": "<f8"}),
    ("v2-blosclz-host", {"fmt": 2, "cname": "blosclz", "shuffle": "shuffle"}),
    ("v2-lz4hc-bigendian", {"fmt": 2, "cname": "lz4hc", "shuffle": "shuffle", "dtype": ">i4"}),
    ("v2-lz4-u1-bitshuffle", {"fmt": 2, "cname": "lz4", "shuffle": "bitshuffle", "dtype": "|u1"}),
    ("v2-zstd-c16", {"fmt": 2, "cname": "zstd", "shuffle": "shuffle", "dtype": "<c16"}),
    ("v2-lz4-clevel0", {"fmt": 2, "cname": "lz4", "clevel": 0, "shuffle": "shuffle"}),
    ("v2-lz4-big-chunks", {"fmt": 2, "cname": "lz4", "shuffle": "shuffle", "shape": (3, 300, 257), "chunks": (1, 256, 256)}),
    ("v3-zstd-shuffle", {"fmt": 3, "cname": "zstd", "shuffle": "shuffle"}),
    ("v3-lz4-bitshuffle-f4", {"fmt": 3, "cname": "lz4", "shuffle": "bitshuffle", "dtype": "<f4"}),
    ("v3-zstd-bigendian", {"fmt": 3, "cname": "zstd", "shuffle": "shuffle", "dtype": ">u2", "endian": "big"}),
    ("v3-lz4-typesize-default", {"fmt": 3, "cname": "lz4", "shuffle": None, "dtype": "<u2"}),
    ("v3-shard-zstd", {"fmt": 3, "cname": "zstd", "shuffle": "shuffle", "chunks": (4, 8, 7), "shards": (8, 16, 14)}),
    ("v3-shard-lz4-bit-u1", {"fmt": 3, "cname": "lz4", "shuffle": "bitshuffle", "dtype": "|u1", "chunks": (4, 8, 7),
                                 "shards": (8, 16, 14)}),
]
