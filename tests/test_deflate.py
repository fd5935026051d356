"""gzip / zlib chunks: the wrapper parser, the Deflate stage's CPU twin, and reads through the engine."""

from __future__ import annotations

import gzip
import struct
import zlib
from types import SimpleNamespace

import numcodecs
import numpy as np
import pytest

from gpu_zarr.engine.codecs.deflate import (
    DeflateStage,
    parse_gzip,
    parse_zlib,
)
from gpu_zarr.errors import CorruptChunkError

RAW = [(np.arange(3000, dtype="<u2") * (k + 1) % 701).tobytes() for k in range(4)]
SIZE = len(RAW[0])


def _pack(blobs: list[bytes], align: int = 16):
    offs, pos = [], 0
    for b in blobs:
        offs.append(pos)
        pos += -(-len(b) // align) * align
    buf = np.zeros(pos + align, np.uint8)
    for o, b in zip(offs, blobs):
        buf[o:o + len(b)] = np.frombuffer(b, np.uint8)
    return buf, np.array(offs, np.int64), np.array([len(b) for b in blobs], np.int64)


def _gzip_member(raw: bytes, *, name: bytes | None = None, comment: bytes | None = None, extra: bytes | None = None,
                 hcrc: bool = False, level: int = 6) -> bytes:
    """A gzip member with the optional header fields of RFC 1952 set as asked."""
    flg = (0x02 if hcrc else 0) | (0x04 if extra is not None else 0) | (0x08 if name is not None else 0) \
        | (0x10 if comment is not None else 0)
    head = bytes([0x1F, 0x8B, 8, flg]) + struct.pack("<I", 0) + bytes([0, 255])
    if extra is not None:
        head += struct.pack("<H", len(extra)) + extra
    if name is not None:
        head += name + b"\0"
    if comment is not None:
        head += comment + b"\0"
    if hcrc:
        head += struct.pack("<H", zlib.crc32(head) & 0xFFFF)
    c = zlib.compressobj(level, zlib.DEFLATED, -15)
    body = c.compress(raw) + c.flush()
    return head + body + struct.pack("<II", zlib.crc32(raw), len(raw) & 0xFFFFFFFF)


def _decode_cpu(streams, buf, n, size=SIZE):
    from gpu_zarr.engine.decode import decode_batch_cpu

    out = np.zeros(n * size, np.uint8)
    dst = np.arange(n, dtype=np.int64) * size
    gz = streams.wrapper == "gzip"
    decode_batch_cpu("deflate", buf, streams.offsets, streams.sizes, out, dst, size, [f"c/{k}" for k in range(n)],
                     crc32=streams.checksums if gz else None, adler32=None if gz else streams.checksums)
    return [out[k * size:(k + 1) * size].tobytes() for k in range(n)]


# ---------------------------------------------------------------- wrapper parser
def test_gzip_members_as_numcodecs_and_gzip_write_them():
    blobs = [bytes(numcodecs.GZip(1).encode(RAW[0])), gzip.compress(RAW[1], mtime=0),
             bytes(numcodecs.GZip(9).encode(RAW[2])), _gzip_member(RAW[3], level=0)]
    buf, offs, sizes = _pack(blobs)
    streams = parse_gzip(buf, offs, sizes, SIZE, ["a", "b", "c", "d"])
    assert _decode_cpu(streams, buf, 4) == RAW


@pytest.mark.parametrize("fields", [
    {"name": b"chunk.bin"}, {"comment": b"x" * 200}, {"extra": b"\1\2\3\4\5"}, {"hcrc": True},
    {"name": b"n" * 150, "comment": b"", "extra": b"", "hcrc": True},
])
def test_gzip_optional_header_fields(fields):
    blobs = [_gzip_member(RAW[0], **fields), bytes(numcodecs.GZip(1).encode(RAW[1])), _gzip_member(RAW[2], **fields)]
    buf, offs, sizes = _pack(blobs)
    streams = parse_gzip(buf, offs, sizes, SIZE, ["a", "b", "c"])
    assert _decode_cpu(streams, buf, 3) == RAW[:3]


def _bad_gzip(kind: str) -> bytes:
    good = bytearray(numcodecs.GZip(5).encode(RAW[1]))
    if kind == "magic":
        good[1] = 0x8C
    elif kind == "method":
        good[2] = 7
    elif kind == "reserved":
        good[3] |= 0x80
    elif kind == "isize":
        good[-4:] = struct.pack("<I", SIZE - 2)
    elif kind == "truncated":
        good = good[: len(good) // 2]
    elif kind == "short":
        good = good[:12]
    elif kind == "name_runs_off":
        good = bytearray(_gzip_member(RAW[1], name=b"abc"))
        good[3] |= 0x10  # claims a comment too: the NUL search runs into the deflate data / trailer
        good = good[:14]
    elif kind == "hcrc":
        good = bytearray(_gzip_member(RAW[1], hcrc=True))
        good[10] ^= 1
    return bytes(good)


@pytest.mark.parametrize("kind", ["magic", "method", "reserved", "isize", "short", "name_runs_off", "hcrc"])
def test_gzip_bad_wrapper_names_the_chunk(kind):
    blobs = [bytes(numcodecs.GZip(1).encode(RAW[0])), _bad_gzip(kind), bytes(numcodecs.GZip(1).encode(RAW[2]))]
    buf, offs, sizes = _pack(blobs)
    with pytest.raises(CorruptChunkError, match=r"chunk 1/0/0: .*gzip"):
        parse_gzip(buf, offs, sizes, SIZE, ["0/0/0", "1/0/0", "2/0/0"])


def test_gzip_truncated_or_flipped_body_is_caught_by_the_decode():
    for kind in ("truncated", "flip"):
        blob = bytearray(numcodecs.GZip(5).encode(RAW[1]))
        if kind == "truncated":  # keep a valid-looking trailer: cut the middle out
            blob = blob[:20] + blob[-8:]
        else:
            blob[len(blob) // 2] ^= 0x40
        buf, offs, sizes = _pack([bytes(numcodecs.GZip(1).encode(RAW[0])), bytes(blob)])
        streams = parse_gzip(buf, offs, sizes, SIZE, ["a", "b"])
        with pytest.raises(CorruptChunkError, match="chunk c/1"):
            _decode_cpu(streams, buf, 2)


def test_gzip_crc_mismatch_is_caught_on_the_cpu():
    blob = bytearray(numcodecs.GZip(5).encode(RAW[1]))
    blob[-8] ^= 1
    buf, offs, sizes = _pack([bytes(blob)])
    streams = parse_gzip(buf, offs, sizes, SIZE, ["b"])
    with pytest.raises(CorruptChunkError, match="chunk c/0: .*CRC-32"):
        _decode_cpu(streams, buf, 1)


def test_zlib_streams():
    blobs = [bytes(numcodecs.Zlib(k).encode(r)) for k, r in zip((0, 1, 6, 9), RAW)]
    buf, offs, sizes = _pack(blobs)
    streams = parse_zlib(buf, offs, sizes, ["a", "b", "c", "d"])
    assert (streams.offsets == offs + 2).all() and (streams.sizes == sizes - 6).all()
    assert _decode_cpu(streams, buf, 4) == RAW


@pytest.mark.parametrize("kind", ["method", "window", "fcheck", "fdict", "short", "adler"])
def test_zlib_bad_wrapper_names_the_chunk(kind):
    good = bytearray(numcodecs.Zlib(6).encode(RAW[1]))
    if kind == "method":
        good[0] = (good[0] & 0xF0) | 7
    elif kind == "window":
        good[0] = (good[0] & 0x0F) | 0x80
    elif kind == "fcheck":
        good[1] ^= 1
    elif kind == "fdict":
        cmf = good[0]
        flg = 0x20 | (good[1] & 0xC0)
        flg += (31 - (cmf * 256 + flg) % 31) % 31
        good[1] = flg
    elif kind == "short":
        good = good[:5]
    blobs = [bytes(numcodecs.Zlib(1).encode(RAW[0])), bytes(good)]
    buf, offs, sizes = _pack(blobs)
    if kind == "adler":
        buf[offs[1] + sizes[1] - 1] ^= 1
    with pytest.raises(CorruptChunkError, match="chunk (1/0|c/1)"):
        streams = parse_zlib(buf, offs, sizes, ["0/0", "1/0"])
        _decode_cpu(streams, buf, 2)


def test_stage_through_the_cpu_ops():
    from gpu_zarr.engine.ops import CpuOps

    for wrapper, enc in (("gzip", numcodecs.GZip(3)), ("zlib", numcodecs.Zlib(3))):
        buf, offs, sizes = _pack([bytes(enc.encode(r)) for r in RAW])
        stage = DeflateStage(wrapper)
        lay = SimpleNamespace(inner_nbytes=SIZE)
        batch = SimpleNamespace(src_offsets=offs, src_sizes=sizes)
        names = ["a", "b", "c", "d"]
        prep = stage.prepare(buf, batch, lay, names)
        out = np.zeros(4 * SIZE + 8, np.uint8)
        stage.decode(CpuOps(), buf, batch, prep, out, np.arange(4) * SIZE + 8, lay, names, 0, None)
        assert out[8:].tobytes() == b"".join(RAW)
        assert stage.scratch_bytes(10, lay) >= 10 * SIZE


def test_stage_refuses_unknown_wrappers():
    with pytest.raises(ValueError, match="gzip"):
        DeflateStage("bz2")


def test_gzip_streams_of_a_real_zarr_store_parse(tmp_path):
    """Every chunk file numcodecs wrote for a v2 gzip array parses and decodes as zarr reads it."""
    from stores import write

    arr, _ = write(tmp_path / "a.zarr", fmt=2, codec="gzip", level=4, partial=False)
    files = sorted(p for p in (tmp_path / "a.zarr").iterdir() if not p.name.startswith("."))
    blobs = [p.read_bytes() for p in files]
    buf, offs, sizes = _pack(blobs)
    size = int(np.prod(arr.chunks)) * arr.dtype.itemsize
    streams = parse_gzip(buf, offs, sizes, size, [p.name for p in files])
    got = _decode_cpu(streams, buf, len(blobs), size)
    for p, g in zip(files, got):
        assert g == bytes(numcodecs.GZip().decode(p.read_bytes()))


def test_parse_is_vectorised_over_many_chunks():
    blobs = [bytes(numcodecs.GZip(1).encode(RAW[k % 4])) for k in range(2000)]
    buf, offs, sizes = _pack(blobs)
    import time

    t = time.perf_counter()
    streams = parse_gzip(buf, offs, sizes, SIZE, [str(k) for k in range(2000)])
    assert time.perf_counter() - t < 0.5
    assert len(streams.offsets) == 2000


# ---------------------------------------------------------------- reads through the engine (CPU twin)
from stores import DEFLATE_LAYOUTS, SELECTIONS, write  # noqa: E402


@pytest.mark.parametrize("name,kw", DEFLATE_LAYOUTS, ids=[n for n, _ in DEFLATE_LAYOUTS])
@pytest.mark.parametrize("sel", [SELECTIONS[0], SELECTIONS[2], SELECTIONS[4]], ids=["all", "strided", "edges"])
def test_engine_reads_gzip_zlib_like_zarr(tmp_path, name, kw, sel):
    from gpu_zarr.engine import read
    from gpu_zarr.engine.metadata import layout_of

    arr, _ = write(tmp_path / "a.zarr", **kw)
    assert layout_of(arr).codec == kw["codec"]
    got = read(arr, sel, device="cpu").data
    want = arr[...][sel]
    assert got.dtype == want.dtype.newbyteorder("=")
    np.testing.assert_array_equal(got, want)


def test_engine_reads_gzip_in_small_batches(tmp_path):
    from gpu_zarr.engine import EngineOptions, read

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="gzip", level=9, chunks=(4, 8, 7), shards=(8, 16, 14))
    res = read(arr, Ellipsis, device="cpu", options=EngineOptions(batch_bytes=1, slots=2, threads=3))
    np.testing.assert_array_equal(res.data, arr[...])
    assert res.stats["codec"] == "gzip" and res.stats["batches"] > 10


def test_numcodecs_zarr3_zlib_is_read(tmp_path):
    import warnings

    import zarr

    from gpu_zarr.engine import read

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from numcodecs.zarr3 import Zlib

        a = zarr.create_array(str(tmp_path / "z.zarr"), shape=(20, 30), chunks=(7, 8), dtype="<i4",
                              compressors=[Zlib(level=3)])
        a[...] = np.arange(600, dtype="<i4").reshape(20, 30)
        arr = zarr.open_array(str(tmp_path / "z.zarr"), mode="r")
        want = arr[...]
    np.testing.assert_array_equal(read(arr, Ellipsis, device="cpu").data, want)


@pytest.mark.parametrize("codec,key", [("gzip", "1.1.1"), ("zlib", "1.1.1")])
@pytest.mark.parametrize("damage,match", [
    (lambda b: b[:len(b) // 2], "(truncated|too short|trailer|deflate)"),
    (lambda b: b"\x00\x00" + b[2:], "(magic|CMF|check bits)"),
    (lambda b: b[:5], "too short"),
    (lambda b: b[:len(b) // 2] + bytes([b[len(b) // 2] ^ 0xFF]) + b[len(b) // 2 + 1:], "(deflate|CRC|Adler)"),
])
def test_corrupt_v2_chunk_names_it(tmp_path, codec, key, damage, match):
    from gpu_zarr.engine import read

    arr, _ = write(tmp_path / "a.zarr", fmt=2, codec=codec, level=6, partial=False)
    f = tmp_path / "a.zarr" / key
    f.write_bytes(damage(f.read_bytes()))
    with pytest.raises(CorruptChunkError, match=match) as info:
        read(arr, Ellipsis, device="cpu")
    assert key in str(info.value)


def test_corrupt_sharded_gzip_inner_chunk_names_it(tmp_path):
    from gpu_zarr.engine import read

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="gzip", chunks=(4, 8, 7), shards=(8, 16, 14), partial=False)
    f = tmp_path / "a.zarr" / "c" / "0" / "0" / "0"
    b = bytearray(f.read_bytes())
    assert b[:2] == b"\x1f\x8b"  # index at the end: the first inner chunk starts the shard
    b[0] = 0
    f.write_bytes(bytes(b))
    with pytest.raises(CorruptChunkError, match="c/0/0/0.*gzip magic"):
        read(arr, Ellipsis, device="cpu")


# ---------------------------------------------------------------- GPU: nvCOMP Deflate in the engine
@pytest.mark.gpu
@pytest.mark.parametrize("name,kw", DEFLATE_LAYOUTS, ids=[n for n, _ in DEFLATE_LAYOUTS])
def test_gpu_engine_reads_gzip_zlib_like_zarr(tmp_path, name, kw):
    import cupy

    from gpu_zarr.zarr_io import read_region, read_zarr_to_gpu

    arr, _ = write(tmp_path / "a.zarr", **kw)
    got = read_zarr_to_gpu(tmp_path / "a.zarr", prefer="kvikio")
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(got.get(), arr[...])
    sel = SELECTIONS[2]
    np.testing.assert_array_equal(cupy.asnumpy(read_region(arr, sel, backend="kvikio")), arr[...][sel])


@pytest.mark.gpu
@pytest.mark.parametrize("codec", ["gzip", "zlib"])
@pytest.mark.parametrize("damage", ["truncated", "flipped", "magic"])
def test_gpu_corrupt_chunk_names_it(tmp_path, codec, damage):
    from gpu_zarr.zarr_io import read_zarr_to_gpu

    write(tmp_path / "a.zarr", fmt=2, codec=codec, level=6, partial=False)
    f = tmp_path / "a.zarr" / "1.1.1"
    b = bytearray(f.read_bytes())
    if damage == "truncated":
        b = b[:len(b) // 2] + b[-8:]
    elif damage == "flipped":
        b[len(b) // 3:len(b) // 3 + 16] = bytes(16)
    else:
        b[0] ^= 0xFF
    f.write_bytes(bytes(b))
    with pytest.raises(CorruptChunkError, match="1.1.1"):
        read_zarr_to_gpu(tmp_path / "a.zarr", prefer="kvikio")
    arr, _ = write(tmp_path / "b.zarr", fmt=2, codec=codec)  # the device is still healthy
    np.testing.assert_array_equal(read_zarr_to_gpu(tmp_path / "b.zarr", prefer="kvikio").get(), arr[...])


@pytest.mark.gpu
def test_gpu_gzip_crc_mismatch_is_caught_on_the_gpu(tmp_path):
    from gpu_zarr.zarr_io import read_zarr_to_gpu

    write(tmp_path / "a.zarr", fmt=2, codec="gzip", level=6, partial=False)
    f = tmp_path / "a.zarr" / "0.1.2"
    b = bytearray(f.read_bytes())
    b[-8] ^= 0x01  # CRC-32 in the trailer; the deflate stream and ISIZE stay valid
    f.write_bytes(bytes(b))
    with pytest.raises(CorruptChunkError, match=r"0\.1\.2.*CRC-32"):
        read_zarr_to_gpu(tmp_path / "a.zarr", prefer="kvikio")


@pytest.mark.parametrize("codec", ["gzip", "zlib", "zstd"])
def test_cpu_backend_names_the_corrupt_chunk(tmp_path, codec):
    """zarr's own read fails with the codec's message; the error then names the chunk."""
    from gpu_zarr.zarr_io import read_zarr

    write(tmp_path / "a.zarr", fmt=2, codec=codec, partial=False)
    f = tmp_path / "a.zarr" / "2.0.1"
    b = f.read_bytes()
    f.write_bytes(b[:len(b) // 2])
    with pytest.raises(CorruptChunkError, match=r"chunk 2\.0\.1"):
        read_zarr(tmp_path / "a.zarr", prefer="cpu")


_ADLER_SHIM = """
extern "C" void run(const long long* ptrs, const long long* sizes, long long n, unsigned int* out) {
    blockDim.x = 256; gridDim.x = 1; blockIdx.x = 0;
    for (long long k = 0; k < n; ++k)
        for (int t = 255; t >= 0; --t) { threadIdx.x = t; adler32_batch(ptrs + k, sizes + k, 1, out + k); }
}
"""


def test_gpu_adler32_kernel_matches_zlib(tmp_path):
    """The GPU Adler-32 kernel (compiled here as plain C++) equals zlib.adler32."""
    import ctypes

    from kernel_shim import build

    lib = build(tmp_path, _ADLER_SHIM)
    rng = np.random.default_rng(0)
    bufs = [rng.integers(0, 256, n, dtype=np.uint8) for n in (0, 1, 5, 255, 256, 257, 4097, 70000, 1 << 20)]
    bufs += [np.full(3 << 20, 255, np.uint8), np.frombuffer(RAW[0], np.uint8)]
    ptrs = np.array([b.ctypes.data for b in bufs], np.int64)
    sizes = np.array([len(b) for b in bufs], np.int64)
    out = np.zeros(len(bufs), np.uint32)
    lib.run(ptrs.ctypes.data_as(ctypes.c_void_p), sizes.ctypes.data_as(ctypes.c_void_p), ctypes.c_longlong(len(bufs)),
            out.ctypes.data_as(ctypes.c_void_p))
    np.testing.assert_array_equal(out, [zlib.adler32(b) for b in bufs])


@pytest.mark.gpu
def test_gpu_zlib_adler_mismatch_is_caught_on_the_gpu(tmp_path):
    from gpu_zarr.engine.nvcomp_batch import _adler_works
    from gpu_zarr.zarr_io import read_zarr_to_gpu

    assert _adler_works()
    write(tmp_path / "a.zarr", fmt=2, codec="zlib", level=6, partial=False)
    f = tmp_path / "a.zarr" / "0.1.2"
    b = bytearray(f.read_bytes())
    b[-1] ^= 0x01  # Adler-32 in the trailer; the deflate stream stays valid
    f.write_bytes(bytes(b))
    with pytest.raises(CorruptChunkError, match=r"0\.1\.2.*Adler-32"):
        read_zarr_to_gpu(tmp_path / "a.zarr", prefer="kvikio")
