"""The native host library (gpu_zarr.engine.native) and the engine paths that use it.

Library tests skip when it is not built (or GPU_ZARR_NATIVE=0); the engine tests run in both
modes and, where the library is built, also with it turned off in-process (the fallback).
Ground truth: numcodecs' encoders and zarr-python's reads of stores it wrote.
"""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor

import numcodecs
import numpy as np
import pytest

from blosc_cases import BLOSC_LAYOUTS, payload, write_blosc
from gpu_zarr import settings
from gpu_zarr.engine import native
from gpu_zarr.engine.ops import CpuOps
from gpu_zarr.engine.pipeline import EngineOptions, read
from gpu_zarr.engine.place import place_cpu
from gpu_zarr.engine.plan import make_batches
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.engine.sources.files import NativeReader, make_reader
from gpu_zarr.errors import CorruptChunkError
from stores import LAYOUTS, write

needs_native = pytest.mark.skipif(not native.available(), reason=f"native library: {native.status().reason}")
MiB = 1 << 20


@pytest.fixture(params=["native", "fallback"])
def mode(request):
    """Run a test with the native library (when built) and with it turned off (the ``native``
    setting, GPU_ZARR_NATIVE=0)."""
    if request.param == "native" and not native.available():
        pytest.skip(f"native library: {native.status().reason}")
    with settings.set(native=request.param == "native"):
        assert native.available() == (request.param == "native")
        yield request.param


def _dec(codec, enc: bytes, nbytes: int, threads: int = 2):
    src = np.frombuffer(enc, np.uint8).copy()
    dst = np.full(nbytes + 64, 0xAB, np.uint8)  # a guard band after the slot
    st, det = native.decode(codec, src, [0], [len(src)], dst, [0], [nbytes], threads)
    assert (dst[nbytes:] == 0xAB).all(), "wrote past the destination"
    return int(st[0]), dst[:nbytes]


# ---------------------------------------------------------------- library
@needs_native
def test_status_reports_codecs():
    s = native.status()
    assert s.loaded and s.path and "blosc" in s.codecs and "raw" in s.codecs
    assert set(s.libraries) == {"libzstd", "liblz4", "zlib", "libdeflate"}
    assert "loaded" in s.summary()


def test_turned_off():
    from gpu_zarr.capabilities import probe

    try:
        with settings.set(native=False):
            assert not native.available() and native.library() is None
            assert "GPU_ZARR_NATIVE=0" in native.status().reason
            assert make_reader("cpu-auto", 2).name == "threads"
            assert "not loaded" in probe(refresh=True).report()
    finally:
        probe(refresh=True)


@needs_native
@pytest.mark.parametrize("codec", ["zstd", "zlib", "gzip", "deflate", "lz4"])
def test_stream_codecs_exact(codec):
    raw = payload(300_001, 2, "smooth").tobytes()
    enc = {"zstd": lambda: numcodecs.Zstd(3).encode(raw), "zlib": lambda: zlib.compress(raw, 6),
           "gzip": lambda: numcodecs.GZip(5).encode(raw),
           "deflate": lambda: (lambda c: c.compress(raw) + c.flush())(zlib.compressobj(6, zlib.DEFLATED, -15)),
           "lz4": lambda: bytes(numcodecs.LZ4().encode(raw))[4:]}[codec]()
    if not native.codec_available(codec):
        pytest.skip(f"no library for {codec} here")
    st, out = _dec(codec, bytes(enc), len(raw))
    assert st == native.OK and out.tobytes() == raw
    # a wrong expected size is an error, never a partial write past it
    st, _ = _dec(codec, bytes(enc), len(raw) - 1)
    assert st in (10, 11)  # "corrupt" where the decoder itself refuses to write past the end
    st, _ = _dec(codec, bytes(enc), len(raw) + 5)
    assert st in (10, 11)


@needs_native
@pytest.mark.parametrize("cname", ["lz4", "lz4hc", "zstd", "zlib"])
@pytest.mark.parametrize("shuffle", [0, 1, 2])
@pytest.mark.parametrize("ts", [1, 2, 4, 8, 16])
def test_blosc_every_inner_codec_and_shuffle(cname, shuffle, ts):
    for nbytes, blocksize, kind in ((200_000 // ts * ts, 0, "smooth"), (70_001 // ts * ts, 4096, "smooth"),
                                    (65_536, 0, "random"), (1000 // ts * ts, 0, "smooth")):
        buf = payload(nbytes, ts, kind)
        for clevel in (0, 5):
            enc = bytes(numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=shuffle, blocksize=blocksize,
                                        typesize=ts).encode(buf))
            st, out = _dec("blosc", bytes(enc), nbytes)
            assert st == native.OK, (nbytes, blocksize, kind, clevel, native.describe(st))
            assert out.tobytes() == buf.tobytes()
            assert out.tobytes() == bytes(numcodecs.Blosc().decode(enc))


@needs_native
@pytest.mark.parametrize("cname", ["blosclz", "snappy"])
def test_blosc_unsupported_inner_codecs(cname):
    buf = payload(100_000, 2, "smooth")
    try:
        enc = bytes(numcodecs.Blosc(cname=cname, clevel=5, shuffle=1).encode(buf))
    except Exception as exc:  # numcodecs built without snappy
        pytest.skip(f"numcodecs cannot write {cname}: {exc}")
    if enc[2] & 0x02:
        pytest.skip("stored memcpyed")
    st, _ = _dec("blosc", enc, buf.nbytes)
    assert st in native.UNSUPPORTED, native.describe(st)


def _corruptions(enc: bytes, rng):
    yield enc[:len(enc) // 2]  # truncated
    yield enc[:17]
    yield b""
    yield rng.integers(0, 256, len(enc), dtype=np.uint8).tobytes()  # garbage
    for _ in range(60):  # flipped bytes, anywhere
        b = bytearray(enc)
        for p in rng.integers(0, len(b), 1 + int(rng.integers(0, 4))):
            b[int(p)] ^= int(rng.integers(1, 256))
        yield bytes(b)
    for p in range(0, 48):  # every header and block-table byte
        b = bytearray(enc)
        if p < len(b):
            b[p] ^= 0xFF
            yield bytes(b)


@needs_native
@pytest.mark.parametrize("case", ["blosc-lz4", "blosc-zstd-bit", "blosc-zlib", "zstd", "gzip", "zlib", "lz4"])
def test_corrupt_inputs_give_statuses_never_crash(case):
    rng = np.random.default_rng(7)
    buf = payload(150_000, 4, "smooth")
    raw = buf.tobytes()
    enc = {"blosc-lz4": lambda: numcodecs.Blosc("lz4", 5, 1, 16384).encode(buf),
           "blosc-zstd-bit": lambda: numcodecs.Blosc("zstd", 5, 2, 16384).encode(buf),
           "blosc-zlib": lambda: numcodecs.Blosc("zlib", 5, 1, 16384).encode(buf),
           "zstd": lambda: numcodecs.Zstd(1).encode(raw), "gzip": lambda: numcodecs.GZip(5).encode(raw),
           "zlib": lambda: zlib.compress(raw), "lz4": lambda: bytes(numcodecs.LZ4().encode(raw))[4:]}[case]()
    codec = case.split("-")[0]
    if not native.codec_available(codec):
        pytest.skip(f"no library for {codec}")
    bad = list(_corruptions(bytes(enc), rng))
    # all in one batch, each in a slot with a guard band after it
    slot = len(raw) + 64
    offs = np.cumsum([0] + [len(b) for b in bad[:-1]]).astype(np.int64)
    src = np.frombuffer(b"".join(bad) or b"\0", np.uint8).copy()
    dst = np.full(slot * len(bad), 0xAB, np.uint8)
    st, det = native.decode(codec, src, offs, [len(b) for b in bad], dst, np.arange(len(bad)) * slot, len(raw), 2)
    guards = dst.reshape(len(bad), slot)[:, len(raw):]
    assert (guards == 0xAB).all(), "a corrupt chunk was decoded past its destination"
    for k, b in enumerate(bad):
        ok = dst[k * slot:k * slot + len(raw)].tobytes() == raw
        # a chunk reported ok decoded to the right bytes, or the change was invisible to the
        # format (e.g. a flipped byte in a stream stored raw, or in a Blosc header's unused bits)
        if st[k] == native.OK and not ok and codec in ("gzip", "zlib"):  # the others carry no checksum here
            raise AssertionError(f"corruption {k} reported ok but decoded to other bytes")
    assert (st[:4] != native.OK).all()  # truncations and garbage are always caught


@needs_native
def test_wrong_sizes_and_bounds():
    raw = payload(10_000, 2, "smooth").tobytes()
    enc = np.frombuffer(numcodecs.Zstd(1).encode(raw), np.uint8).copy()
    dst = np.zeros(20_000, np.uint8)
    st, _ = native.decode("zstd", enc, [0], [len(enc) + 5], dst, [0], [len(raw)], 1)  # source past the buffer
    assert st[0] == native.BOUNDS
    st, _ = native.decode("zstd", enc, [0], [len(enc)], dst, [15_000], [len(raw)], 1)  # destination past the end
    assert st[0] == native.BOUNDS
    benc = np.frombuffer(numcodecs.Blosc("lz4", 5, 1).encode(np.frombuffer(raw, np.uint8)), np.uint8).copy()
    st, det = native.decode("blosc", benc, [0], [len(benc)], dst, [0], [len(raw) - 2], 1)
    assert st[0] == 11 and det[0] == len(raw)


@needs_native
def test_read_batch(tmp_path):
    rng = np.random.default_rng(0)
    files, blobs = [], []
    for k in range(40):
        b = rng.integers(0, 256, int(rng.integers(1, 300_000)), dtype=np.uint8).tobytes()
        p = tmp_path / f"f{k}"
        p.write_bytes(b)
        files.append(str(p))
        blobs.append(b)
    sizes = np.array([len(b) for b in blobs], np.int64)
    doff = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    dst = np.zeros(int(sizes.sum()), np.uint8)
    st, _ = native.read(files, np.arange(40), np.zeros(40, np.int64), sizes, doff, dst, 4)
    assert (st == native.OK).all() and dst.tobytes() == b"".join(blobs)
    # short file, missing file, a destination past the buffer: per item, the others still read
    fid, foff, size = np.array([0, 1, 2, 3]), np.array([0, 10, 0, 0]), sizes[:4].copy()
    os.remove(files[2])
    size[3] = len(dst)
    st, det = native.read(files, fid, foff, size, np.array([0, 0, 0, 5]), dst, 2)
    assert st.tolist() == [native.OK, native.SHORT, native.OPEN, native.BOUNDS]
    assert det[1] == sizes[1] - 10


@needs_native
@pytest.mark.parametrize("dtype", ["<u2", ">i4", "<f8", ">c8", "u1"])
@pytest.mark.parametrize("perm", [None, (2, 0, 1)])
def test_place_equals_numpy(dtype, perm):
    rng = np.random.default_rng(1)
    dt = np.dtype(dtype)
    inner = (5, 6, 7)
    stored = inner if perm is None else tuple(inner[a] for a in perm)
    chunks = [rng.integers(0, 255, int(np.prod(stored)) * dt.itemsize, dtype=np.uint8) for _ in range(6)]
    src = np.concatenate(chunks)
    offs = np.arange(6, dtype=np.int64) * chunks[0].nbytes
    table = np.zeros((6, 3, 4), np.int64)
    table[:, :, 0] = inner
    for k in range(6):
        for d in range(3):
            a = int(rng.integers(0, inner[d]))
            n = int(rng.integers(1, inner[d] - a + 1))
            # chunk k lands in its own slab of axis 0 (as a real read's chunks never overlap:
            # threads place in any order, so overlapping boxes would make the result racy)
            base = 10 * k if d == 0 else 0
            table[k, d, 1:] = (a, n, base + int(rng.integers(0, 10 - n)))
    want = np.zeros((60, 10, 10), dt.newbyteorder("="))
    got = want.copy()
    place_cpu(src, offs, table, want, dt, perm)
    st = native.place(src, offs, chunks[0].nbytes, table, got, dt, perm, 3)
    assert (st == native.OK).all()
    assert want.tobytes() == got.tobytes()
    bad = table.copy()
    bad[0, 0, 3] = 60  # runs past the output
    st = native.place(src, offs, chunks[0].nbytes, bad, got, dt, perm, 1)
    assert st[0] == native.BOUNDS


# ---------------------------------------------------------------- decode + place as answers arrive
def _tiles(codec, dt, rng, n=6, shape=(40, 48)):
    """n chunks of ``shape`` (one tile each along axis 0 of the output), encoded with ``codec``."""
    dt = np.dtype(dt)
    raw = [rng.integers(0, 200, shape).astype(dt) for _ in range(n)]
    enc = {"zstd": lambda b: numcodecs.Zstd(3).encode(b.tobytes()),
           "blosc": lambda b: numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, 1024).encode(b),
           "blosc-bit": lambda b: numcodecs.Blosc("zstd", 3, numcodecs.Blosc.BITSHUFFLE, 2048).encode(b),
           "raw": lambda b: b.tobytes()}[codec]
    table = np.zeros((n, 2, 4), np.int64)
    for k in range(n):
        table[k, 0] = (shape[0], 0, shape[0], k * shape[0])
        table[k, 1] = (shape[1], 0, shape[1], 0)
    return raw, [np.frombuffer(bytes(enc(b)), np.uint8) for b in raw], table


@needs_native
@pytest.mark.parametrize("codec,dtype", [("zstd", "<u2"), ("blosc", "<u2"), ("blosc", "<f8"), ("blosc", "<i4"),
                                         ("blosc-bit", "<u2"), ("raw", ">i4")])
def test_arrivals_decode_and_place_what_is_added(codec, dtype):
    """Chunks added one by one, in any order, from buffers of their own (some never added, some
    kept): each lands in its place; the rest of the output is untouched."""
    rng = np.random.default_rng(3)
    raw, enc, table = _tiles(codec, dtype, rng)
    dt = np.dtype(dtype)
    nb = raw[0].nbytes
    out = np.full((len(raw) * 40, 48), 99, dt.newbyteorder("="))
    keep = [np.empty(nb, np.uint8) if k % 2 else None for k in range(len(raw))]
    scratch = np.empty(4 * nb, np.uint8)
    order = [4, 0, 5, 2]  # 1 and 3 never arrive
    with native.Arrivals(codec.split("-")[0], len(raw), nb, table, out, dt, None, 4, scratch, keep) as arr:
        for k in order:
            padded = np.concatenate([np.zeros(7, np.uint8), enc[k], np.zeros(5, np.uint8)])
            arr.add(k, padded, 7, len(enc[k]))
    st, _ = arr.close()
    for k in range(len(raw)):
        tile = out[k * 40:(k + 1) * 40]
        if k in order:
            assert st[k] == native.OK
            assert np.array_equal(tile, raw[k].astype(dt.newbyteorder("=")))
        else:
            assert st[k] == native.Arrivals.NOT_ADDED and (tile == 99).all()
    assert keep[5].tobytes() == raw[5].tobytes() and keep[1] is not None  # kept as decoded (disk order)


@needs_native
def test_arrivals_refuse_bad_adds_and_report_bad_chunks():
    rng = np.random.default_rng(4)
    raw, enc, table = _tiles("zstd", "<u2", rng, n=4)
    nb = raw[0].nbytes
    out = np.zeros((160, 48), np.uint16)
    scratch = np.empty(2 * nb, np.uint8)
    blosclz = np.frombuffer(bytes(numcodecs.Blosc("blosclz", 5, 1).encode(raw[3])), np.uint8)
    with native.Arrivals("zstd", 4, nb, table, out, np.dtype("<u2"), None, 2, scratch) as arr:
        arr.add(0, enc[0], 0, len(enc[0]))
        with pytest.raises(ValueError, match="twice"):
            arr.add(0, enc[0], 0, len(enc[0]))
        with pytest.raises(ValueError, match="not one of"):
            arr.add(4, enc[1], 0, len(enc[1]))
        with pytest.raises(ValueError, match="outside its answer"):
            arr.add(1, enc[1], 10, len(enc[1]))
        arr.add(1, enc[1][: len(enc[1]) // 2], 0, len(enc[1]) // 2)  # truncated
        garbage = rng.integers(0, 256, 500, dtype=np.uint8)
        arr.add(2, garbage, 0, 500)
    st, _ = arr.close()
    assert st[0] == native.OK and st[1] != native.OK and st[2] != native.OK and st[3] == native.Arrivals.NOT_ADDED
    assert (out[40:120] == 0).all()  # a chunk that failed to decode was never placed
    with native.Arrivals("blosc", 1, nb, table[:1], out, np.dtype("<u2"), None, 1, scratch) as arr:
        arr.add(0, blosclz, 0, len(blosclz))
    assert arr.close()[0][0] in native.UNSUPPORTED


@needs_native
def test_arrivals_sets_in_many_threads_at_once():
    rng = np.random.default_rng(5)
    raw, enc, table = _tiles("blosc", "<u2", rng, n=8)
    nb = raw[0].nbytes
    want = np.concatenate(raw)

    def one(_):
        out = np.zeros_like(want)
        with native.Arrivals("blosc", 8, nb, table, out, np.dtype("<u2"), None, 3, np.empty(3 * nb, np.uint8),
                             split=3) as arr:
            for k in range(8):
                arr.add(k, enc[k], 0, len(enc[k]))
        st, _ = arr.close()
        return bool((st == native.OK).all() and np.array_equal(out, want))
    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(one, range(64)))


def _big_tiles(enc, dtype, n, seed):
    """n tiles of 512 x 256 (several Blosc blocks each), Blosc-encoded by ``enc``, and their table."""
    rng = np.random.default_rng(seed)
    raw = [(np.arange(512 * 256).reshape(512, 256) % (300 + k) + rng.integers(0, 4, (512, 256))).astype(dtype)
           for k in range(n)]
    table = np.zeros((n, 2, 4), np.int64)
    for k in range(n):
        table[k, 0] = (512, 0, 512, 512 * k)
        table[k, 1] = (256, 0, 256, 0)
    return raw, [bytearray(enc.encode(r)) for r in raw], table


@needs_native
@pytest.mark.parametrize("split", [1, 3, 8])
@pytest.mark.parametrize("enc,dtype", [(numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, 8192), "<u2"),
                                       (numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, 8192), "<f8"),
                                       (numcodecs.Blosc("zstd", 3, numcodecs.Blosc.BITSHUFFLE, 8192), "<u2"),
                                       (numcodecs.Blosc("zlib", 1, numcodecs.Blosc.NOSHUFFLE, 65536), "<i4")],
                         ids=["lz4-shuffle-u2", "lz4-shuffle-f8", "zstd-bitshuffle", "zlib-noshuffle"])
def test_arrivals_split_a_blosc_chunk_over_workers(enc, dtype, split):
    """``split``: the blocks of one Blosc chunk (4 to 32 here) are decoded by several workers at
    once, a run of blocks each, and the chunk is placed once, whole: equal to numcodecs."""
    raw, encoded, table = _big_tiles(enc, dtype, 5, 7)
    assert all(int.from_bytes(e[8:12], "little") < raw[0].nbytes for e in encoded)  # (several blocks)
    nb = raw[0].nbytes
    out = np.zeros((512 * 5, 256), np.dtype(dtype).newbyteorder("="))
    keep = [np.empty(nb, np.uint8) if k == 2 else None for k in range(5)]
    with native.Arrivals("blosc", 5, nb, table, out, np.dtype(dtype), None, 8, np.empty(5 * nb, np.uint8), keep,
                         split=split) as arr:
        for k in (3, 0, 4, 2, 1):
            e = np.frombuffer(bytes(encoded[k]), np.uint8)
            arr.add(k, e, 0, len(e))
    st, _ = arr.close()
    assert (st == native.OK).all()
    np.testing.assert_array_equal(out, np.concatenate(raw))
    assert keep[2].tobytes() == raw[2].tobytes()


@needs_native
def test_arrivals_split_chunk_with_a_corrupt_block_fails_whole_and_is_not_placed():
    """A Blosc chunk decoded by several workers (a run of blocks each): one corrupt block in the
    middle fails the chunk (its status says so) and nothing of it is placed; a block table
    pointing outside the chunk fails it too; the other chunk lands."""
    raw, enc, table = _big_tiles(numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, 8192), "<u2", 3, 6)
    nblocks = -(-raw[0].nbytes // int.from_bytes(enc[0][8:12], "little"))
    assert nblocks == 4 and all(not e[2] & 0x02 for e in enc)  # (compressed: a block table, not one copy)
    # chunk 1: its 3rd block's first stream says it is longer than the block
    b = int.from_bytes(enc[1][16 + 4 * 2:20 + 4 * 2], "little")
    enc[1][b:b + 4] = (10**6).to_bytes(4, "little")
    # chunk 2: its last block starts past the end
    enc[2][16 + 4 * 3:20 + 4 * 3] = (len(enc[2]) + 100).to_bytes(4, "little")
    out = np.full((512 * 3, 256), 7, np.uint16)
    nb = raw[0].nbytes
    with native.Arrivals("blosc", 3, nb, table, out, np.dtype("<u2"), None, 4, np.empty(3 * nb, np.uint8),
                         split=4) as arr:
        for k in range(3):
            e = np.frombuffer(bytes(enc[k]), np.uint8)
            arr.add(k, e, 0, len(e))
    st, _ = arr.close()
    assert st[0] == native.OK and np.array_equal(out[:512], raw[0])
    assert st[1] != native.OK and st[2] != native.OK and (out[512:] == 7).all()


# ---------------------------------------------------------------- engine
def _small(arr, sel, threads=4, cache=False):
    pool = ThreadPoolExecutor(threads)
    try:
        ops = CpuOps(pool, threads, fast=True)
        return read(arr, sel, device="cpu", ops=ops, options=EngineOptions(threads=threads, cache=cache))
    finally:
        pool.shutdown()


def selections(shape):
    """The whole array, a plane with a cropped axis, a stepped box with an integer index."""
    mid = tuple(slice(1, max(2, n - 1)) for n in shape[1:])
    step = tuple(slice(0, None, 2 + d) for d in range(len(shape) - 1))
    return [Ellipsis, (shape[0] // 2, *mid), (*step, shape[-1] // 2)]


@pytest.mark.parametrize("case", [c for c in LAYOUTS if c[0] in ("v3-raw", "v3-zstd", "v2-zstd", "v3-shard-zstd",
                                                                 "v3-zstd-bigendian", "v2-F-order", "v3-fill-7")]
                         + [("v2-gzip", dict(fmt=2, codec="gzip")), ("v3-gzip", dict(fmt=3, codec="gzip")),
                            ("v2-zlib", dict(fmt=2, codec="zlib"))], ids=lambda c: c[0])
def test_engine_cpu_reads_equal_zarr(tmp_path, case, mode):
    arr, _ = write(tmp_path / "a.zarr", **case[1])
    for sel in selections(arr.shape):
        want = np.asarray(arr[sel])
        for res in (_small(arr, sel), read(arr, sel, device="cpu", options=EngineOptions(threads=3))):
            np.testing.assert_array_equal(res.data, want)
        if mode == "native":
            assert _small(arr, sel).stats.get("chunkwise_native", 0) > 0 or case[0] == "v3-fill-7"


@pytest.mark.parametrize("case", BLOSC_LAYOUTS, ids=lambda c: c[0])
def test_engine_blosc_equal_zarr(tmp_path, case, mode):
    arr, _ = write_blosc(tmp_path / "b.zarr", **case[1])
    for sel in selections(arr.shape):
        want = np.asarray(arr[sel])
        np.testing.assert_array_equal(_small(arr, sel).data, want)
        np.testing.assert_array_equal(read(arr, sel, device="cpu", options=EngineOptions(threads=3)).data, want)


def test_engine_cache_keeps_native_chunks(tmp_path, mode):
    from gpu_zarr.engine.runtime import get_runtime

    arr, values = write(tmp_path / "c.zarr", fmt=3, codec="zstd", partial=False)
    get_runtime().clear_caches()
    first = _small(arr, (3, slice(None), slice(None)), cache=True)
    second = _small(arr, (4, slice(None), slice(None)), cache=True)  # same chunk layer: served by the cache
    np.testing.assert_array_equal(first.data, values[3])
    np.testing.assert_array_equal(second.data, values[4])
    assert second.stats["cache_hits"] > 0
    get_runtime().clear_caches()


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
@pytest.mark.parametrize("codec", ["zstd", "gzip", "blosc"])
def test_engine_corrupt_chunk_is_named(tmp_path, codec, damage, mode):
    if codec == "blosc":
        arr, _ = write_blosc(tmp_path / "d.zarr", fmt=2, cname="lz4", shuffle="shuffle", partial=False)
    else:
        arr, _ = write(tmp_path / "d.zarr", fmt=2, codec=codec, partial=False)
    chunk = tmp_path / "d.zarr" / "1.1.1"
    b = bytearray(chunk.read_bytes())
    if damage == "truncate":
        b = b[:len(b) // 2]
    elif damage == "flip":
        for p in range(len(b) // 3, len(b) // 3 + 8):
            b[p] ^= 0x5A
        b[:20] = bytes(x ^ 0xFF for x in b[:20])
    else:
        b = bytearray(np.random.default_rng(3).integers(0, 256, len(b), dtype=np.uint8).tobytes())
    chunk.write_bytes(bytes(b))
    with pytest.raises(CorruptChunkError, match=r"1\.1\.1"):
        _small(arr, Ellipsis)
    with pytest.raises(CorruptChunkError, match=r"1\.1\.1"):
        read(arr, Ellipsis, device="cpu", options=EngineOptions(threads=2))


def test_native_reader_short_file_named(tmp_path):
    if not native.available():
        pytest.skip(native.status().reason)
    arr, _ = write(tmp_path / "e.zarr", fmt=3, codec="raw", partial=False)
    files = [str(tmp_path / "e.zarr" / "c" / "0" / "0" / "0")]
    size = os.path.getsize(files[0])
    batch = make_batches(np.array([0]), np.array([0]), np.array([size + 10]), size, 8 * MiB)[0]
    dest = np.zeros(size + 16, np.uint8)
    with pytest.raises(CorruptChunkError, match="the file ends after"):
        NativeReader(2).read(files, batch, dest)
    big = make_batches(np.array([0]), np.array([0]), np.array([size]), size, 8 * MiB)[0]
    NativeReader(2).read(files, big, dest)
    assert dest[:size].tobytes() == open(files[0], "rb").read()


@pytest.mark.parametrize("codec", ["zstd", "gzip", "raw"])
def test_cpu_twin_reads_with_native_threads(tmp_path, mode, codec):
    """The GPU pipeline's CPU twin (ops given): staging filled by the native reader."""
    from gpu_zarr.engine.ops import ops_for

    arr, values = write(tmp_path / "f.zarr", fmt=3, codec=codec, partial=False)
    res = read(arr, Ellipsis, device="cpu", ops=ops_for("cpu", 3, 1, get_runtime()),
               options=EngineOptions(threads=3, batch_bytes=64 << 10))
    np.testing.assert_array_equal(res.data, values)
    assert res.stats["batches"] > 1
    assert res.stats["reader"].startswith("native" if mode == "native" else "threads")


def test_cpu_whole_read_progress_and_cancel(tmp_path, mode):
    """The CPU path (native: per chunk on C threads, in groups) reports progress and honours cancel."""
    import threading

    from gpu_zarr.errors import ReadCancelled

    arr, values = write(tmp_path / "p.zarr", fmt=3, codec="zstd", partial=False)
    seen = []
    res = read(arr, Ellipsis, device="cpu", options=EngineOptions(threads=2, batch_bytes=16 << 10,
                                                                 progress=lambda d, t: seen.append((d, t))))
    np.testing.assert_array_equal(res.data, values)
    assert len(seen) > 1 and seen[-1][0] == seen[-1][1]
    if mode == "native":
        assert res.stats["chunkwise_native"] == res.stats["pieces"]
    stop = threading.Event()
    stop.set()
    with pytest.raises(ReadCancelled):
        read(arr, Ellipsis, device="cpu", options=EngineOptions(threads=2, cancel=stop))


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["zstd", "gzip", "blosc", "raw"])
def test_gpu_path_with_native_reader(tmp_path, case):
    """The GPU pipeline with reader="native" (staging filled by C threads) equals zarr."""
    if not native.available():
        pytest.skip(native.status().reason)
    if case == "blosc":
        arr, values = write_blosc(tmp_path / "g.zarr", fmt=2, cname="lz4", shuffle="shuffle")
    else:
        arr, values = write(tmp_path / "g.zarr", fmt=3, codec=case)
    values = np.asarray(arr[...])
    res = read(arr, Ellipsis, device="gpu", options=EngineOptions(reader="native", threads=8, batch_bytes=64 << 10))
    np.testing.assert_array_equal(res.data.get(), values)
    assert res.stats["reader"].startswith("native")


def _hatch_build():
    import importlib.util
    from pathlib import Path

    pytest.importorskip("hatchling")
    path = Path(__file__).resolve().parents[1] / "hatch_build.py"
    spec = importlib.util.spec_from_file_location("hatch_build", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, path.parent


def test_build_hook_compiles_or_says_why(tmp_path, monkeypatch):
    """The build hook's compile: a library that loads, or a reason (never an exception)."""
    import shutil

    hb, root = _hatch_build()
    monkeypatch.setenv("CC", "/nonexistent/cc")
    if shutil.which("cc") is None:
        assert "compiler" in hb.compile_native(root, tmp_path / "x.so")
        return
    monkeypatch.setenv("CC", "false")  # a compiler that fails
    why = hb.compile_native(root, tmp_path / "bad.so")
    assert why and "failed" in why and not (tmp_path / "bad.so").exists()
    monkeypatch.delenv("CC")
    out = tmp_path / "libgz_native.so"
    assert hb.compile_native(root, out) is None
    import ctypes

    from gpu_zarr.engine.native import VERSION

    assert ctypes.CDLL(str(out)).gz_version() == VERSION


# ---------------------------------------------------------------- the persistent team of threads
def _zstd_items(k: int, n: int = 24, size: int = 65536):
    rng = np.random.default_rng(k)
    raws = [(rng.integers(0, 50, size, dtype=np.uint8)) for _ in range(n)]
    encs = [numcodecs.Zstd(1).encode(r) for r in raws]
    offs = np.cumsum([0] + [len(e) for e in encs[:-1]])
    src = np.frombuffer(b"".join(encs), np.uint8).copy()
    return raws, src, offs, [len(e) for e in encs]


@needs_native
def test_team_serves_many_calls_of_any_width_and_concurrent_callers():
    """The team is reused call after call with 1..32 threads; calls from several Python
    threads at once (one gets the team, the others start threads of their own) all decode
    exactly. A wrong hand-off would deadlock (bounded by the pool's timeout) or skip items."""
    raws, src, offs, sizes = _zstd_items(1)
    want = np.concatenate(raws)

    def one(threads: int) -> bool:
        dst = np.zeros(want.nbytes, np.uint8)
        st, _ = native.decode("zstd", src, offs, sizes, dst, np.arange(len(raws)) * 65536, [65536] * len(raws),
                              threads)
        return bool((st == 0).all()) and np.array_equal(dst, want)

    for threads in (1, 2, 3, 8, 32, 5, 16, 2):
        assert all(one(threads) for _ in range(20)), threads
    pool = ThreadPoolExecutor(6)
    try:
        assert all(f.result(timeout=60) for f in [pool.submit(one, 1 + k % 9) for k in range(300)])
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a deadlock fails above, never hangs here


@needs_native
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() only")
def test_team_after_fork():
    """A child forked after the parent's team ran (only the forking thread exists there)
    starts a team of its own: its native calls finish and decode exactly."""
    import multiprocessing as mp

    raws, src, offs, sizes = _zstd_items(2)
    dst = np.zeros(len(raws) * 65536, np.uint8)
    native.decode("zstd", src, offs, sizes, dst, np.arange(len(raws)) * 65536, [65536] * len(raws), 8)
    with mp.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(_decode_in_child, (8,)).get(timeout=60)


def _decode_in_child(threads: int) -> bool:
    raws, src, offs, sizes = _zstd_items(2)
    dst = np.zeros(len(raws) * 65536, np.uint8)
    st, _ = native.decode("zstd", src, offs, sizes, dst, np.arange(len(raws)) * 65536, [65536] * len(raws),
                          threads)
    return bool((st == 0).all()) and np.array_equal(dst, np.concatenate(raws))


def test_address_is_numpys_for_every_kind_of_array():
    """native.address takes a writable contiguous array's address through the buffer protocol
    (cheaper than .ctypes.data); read-only, empty and strided arrays fall back to numpy's."""
    base = np.zeros((6, 8), np.float32)
    arrays = [base, base[2:], base[1:3], base[:, 2], base.T, np.zeros(0, np.uint8),
              np.frombuffer(b"abcdef", np.uint8), np.zeros(3, np.int64)[::-1], np.zeros(1, [("a", "<i8"), ("b", "S4")])]
    for a in arrays:
        assert native.address(a) == a.ctypes.data


def test_crc32c_matches_google_crc32c():
    """CRC-32C (the zarr v3 crc32c codec) of spans of every length and alignment, against google-crc32c."""
    import google_crc32c

    from gpu_zarr.engine import native

    if not native.available():
        pytest.skip(native.status().reason)
    rng = np.random.default_rng(3)
    buf = rng.integers(0, 256, 300_000, dtype=np.uint8)
    offs = np.array([0, 1, 3, 7, 8, 100, 4095, 12345, 0], np.int64)
    sizes = np.array([0, 1, 2, 9, 15, 64, 4097, 200_000, 300_000], np.int64)
    got = native.checksums("crc32c", buf, offs, sizes, 3)
    want = [google_crc32c.value(buf[o:o + s].tobytes()) for o, s in zip(offs, sizes)]
    np.testing.assert_array_equal(got, np.array(want, np.uint32))
    with pytest.raises(ValueError, match="outside the buffer"):
        native.checksums("crc32c", buf, [299_999], [2], 1)


# ---------------------------------------------------------------- locating chunk files
@needs_native
def test_stat_files_matches_os_stat(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 123)
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "p")
    files = [str(tmp_path / n) for n in ("f", "missing", "d", "p", "f/below")]
    size, mtime, kind = native.stat_files(files, 3)
    st = os.stat(tmp_path / "f")
    assert kind.tolist() == [0, 1, 2, 2, 1]
    assert size.tolist()[:2] == [123, -1] and mtime.tolist()[:2] == [st.st_mtime_ns, -1]


def test_many_chunk_files_located_alike_with_and_without_the_library(tmp_path, mode):
    """An array of more chunk files than the native stat's threshold: missing chunks read as the
    fill value, and a FIFO or a folder where a chunk belongs is named, never opened."""
    import zarr

    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=(40, 40), chunks=(4, 4), dtype="<u2", zarr_format=2,
                            compressors=None, fill_value=7)
    vals = np.arange(1600, dtype="<u2").reshape(40, 40)
    arr[:36] = vals[:36]  # the last row of chunks stays missing
    arr = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    np.testing.assert_array_equal(read(arr, Ellipsis, device="cpu").data, arr[...])
    os.remove(tmp_path / "a.zarr" / "3.5")
    os.mkfifo(tmp_path / "a.zarr" / "3.5")
    with pytest.raises(CorruptChunkError, match=r"3\.5 is a FIFO where a chunk or shard file belongs"):
        read(arr, Ellipsis, device="cpu")
    os.remove(tmp_path / "a.zarr" / "3.5")
    os.mkdir(tmp_path / "a.zarr" / "3.5")
    with pytest.raises(CorruptChunkError, match=r"3\.5 is a directory"):
        read(arr, Ellipsis, device="cpu")
