"""Blosc parser, stream layout and unshuffles (CPU twin), pixel-exact against numcodecs."""

from __future__ import annotations

import itertools
import struct

import numcodecs
import numpy as np
import pytest

from blosc_cases import (
    BLOCKSIZES,
    CLEVELS,
    CNAMES,
    SHUFFLES,
    TYPESIZES,
    decode_chunks,
    encode,
    payload,
    reorder_blocks,
    stage,
)
from gpu_zarr.engine.codecs.blosc import (
    KIND_COPY,
    KIND_LZ4,
    MODE_BIT,
    MODE_BYTE,
    MODE_NONE,
    parse_batch,
)
from gpu_zarr.engine.codecs.shuffle import unshuffle_cpu
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.errors import CorruptChunkError


def cpu_ops():
    from gpu_zarr.engine.ops import ops_for

    return ops_for("cpu", 3, 1, get_runtime())


def _check_matrix(ops, cname: str, shuffle: int, typesizes=TYPESIZES, clevels=CLEVELS, blocksizes=BLOCKSIZES):
    """Every combination, batched by decoded size: one parse and one decode per batch."""
    for ts, bs in itertools.product(typesizes, blocksizes):
        # a partial last block, an element count not a multiple of 8, trailing bytes past n*ts
        for nbytes in (150000 // ts * ts + 8 * ts, 150000 // ts * ts + 3 * ts + (ts - 1 if ts > 1 else 0)):
            bufs, chunks = [], []
            for clevel, kind in itertools.product(clevels, ("smooth", "random")):
                buf = payload(nbytes, ts, kind, seed=clevel)
                bufs.append(buf)
                chunks.append(encode(buf, cname, clevel, shuffle, ts, bs))
            out, _ = decode_chunks(ops, chunks, nbytes)
            labels = list(itertools.product(clevels, ("smooth", "random")))
            for buf, chunk, got, (clevel, kind) in zip(bufs, chunks, out, labels):
                assert np.array_equal(np.frombuffer(numcodecs.Blosc().decode(chunk), np.uint8), buf)
                if not np.array_equal(got, buf):
                    raise AssertionError(f"{cname} shuffle={shuffle} ts={ts} blocksize={bs} nbytes={nbytes} "
                                         f"clevel={clevel} {kind}: first difference at byte "
                                         f"{int(np.flatnonzero(got != buf)[0])}")


@pytest.mark.parametrize("shuffle", list(SHUFFLES), ids=list(SHUFFLES))
@pytest.mark.parametrize("cname", CNAMES)
def test_matrix_cpu(cname, shuffle):
    _check_matrix(cpu_ops(), cname, SHUFFLES[shuffle])


def test_stream_layout_lz4_shuffle():
    ts, nbytes = 2, 2 * 300001
    buf = payload(nbytes, ts, "random")
    buf[1::2] = 7  # noisy low bytes (stored raw), constant high bytes (compressed)
    rnd = payload(nbytes, ts, "random")
    chunks = [encode(buf, "lz4", 5, 1, ts, 65536), encode(rnd, "lz4", 5, 1, ts, 65536)]
    staging, offs, sizes = stage(chunks)
    plan = parse_batch(staging, offs, sizes, nbytes)
    blocksize = int(np.frombuffer(chunks[0][8:12], "<i4")[0])  # numcodecs chooses (65536 * typesize here)
    nblocks = -(-nbytes // blocksize)
    assert nblocks > 1 and nbytes % blocksize
    # full blocks split into typesize streams, the last partial block not
    assert len(plan.b_off) == nblocks  # the incompressible chunk is memcpyed
    assert len(plan.s_src) == (nblocks - 1) * ts + 1
    assert plan.stats()["blosc_memcpyed_chunks"] == 1
    assert set(plan.b_mode.tolist()) == {MODE_BYTE}
    assert (plan.s_kind == KIND_COPY).any()  # the noisy low-byte streams are stored raw
    assert (plan.s_kind == KIND_LZ4).any()
    assert plan.s_dsize.sum() == nbytes
    # raw streams are read in place; compressed ones decode to 16-aligned slots
    assert (plan.s_dst[plan.s_kind == KIND_COPY] == -1).all()
    assert (plan.s_dst[plan.s_kind != KIND_COPY] % 16 == 0).all()
    assert plan.shuffled_bytes < nbytes
    assert (plan.b_nsplit[:-1] == ts).all() and plan.b_nsplit[-1] == 1
    # every stream lies inside its chunk
    assert ((plan.s_src >= offs[plan.s_chunk]) & (plan.s_src + plan.s_size <= offs[plan.s_chunk] + sizes[plan.s_chunk])).all()
    st = plan.stats()
    assert st["blosc_streams_copy"] > 0 and st["blosc_streams_lz4"] > 0 and st["blosc_host_chunks"] == 0


def test_bitshuffle_rule_of_blosc1():
    """A bitshuffled block whose element count is not a multiple of 8 stays unshuffled."""
    ts, nbytes = 8, 8 * (128 * 5 + 5)
    buf = payload(nbytes, ts, "smooth")
    chunk = encode(buf, "zstd", 5, 2, ts, 1024)
    staging, offs, sizes = stage([chunk])
    plan = parse_batch(staging, offs, sizes, nbytes)
    blocksize = int(np.frombuffer(chunk[8:12], "<i4")[0])  # numcodecs chooses (1024 here)
    bsizes = [min(blocksize, nbytes - o) for o in range(0, nbytes, blocksize)]
    assert plan.b_size.tolist() == bsizes
    assert plan.b_mode.tolist() == [MODE_BIT if (b // ts) % 8 == 0 else MODE_NONE for b in bsizes]
    assert plan.b_mode[-1] == MODE_NONE
    out, _ = decode_chunks(cpu_ops(), [chunk], nbytes)
    assert np.array_equal(out[0], buf)


@pytest.mark.parametrize("cname,ts,nbytes,bs", [("lz4", 8, 400000, 1000), ("zstd", 8, 400000, 1000),
                                                 ("lz4", 2, 1000000, 0)])
def test_blocks_out_of_order(cname, ts, nbytes, bs):
    buf = payload(nbytes, ts, "smooth")
    chunk = encode(buf, cname, 5, 1, ts, bs)
    nblocks = -(-nbytes // int(np.frombuffer(chunk[8:12], "<i4")[0]))
    assert nblocks >= 2
    order = list(range(nblocks))[::-1]
    moved = reorder_blocks(chunk, order)
    assert moved != chunk
    assert np.array_equal(np.frombuffer(numcodecs.Blosc().decode(moved), np.uint8), buf)  # c-blosc agrees
    out, _ = decode_chunks(cpu_ops(), [moved, chunk], nbytes)
    assert np.array_equal(out[0], buf) and np.array_equal(out[1], buf)


def test_mixed_batch_memcpy_host_and_streams():
    ts, nbytes = 2, 2 * 9000
    bufs = [payload(nbytes, ts, "smooth", seed=s) for s in range(4)]
    chunks = [encode(bufs[0], "lz4", 5, 1, ts), encode(bufs[1], "zstd", 0, 1, ts),  # memcpyed
              encode(bufs[2], "blosclz", 5, 2, ts), encode(bufs[3], "zlib", 3, 2, ts)]
    out, plan = decode_chunks(cpu_ops(), chunks, nbytes)
    for b, o in zip(bufs, out):
        assert np.array_equal(b, o)
    st = plan.stats()
    assert st["blosc_memcpyed_chunks"] == 1 and st["blosc_host_chunks"] == 1 and st["blosc_host_blosclz"] == 1
    assert st["blosc_streams_deflate"] > 0


def _ref_shuffle(x: np.ndarray, ts: int, mode: int) -> np.ndarray:
    """The forward transforms by their definition (slow loops; small blocks only)."""
    size = len(x)
    n = size // ts
    out = x.copy()
    if mode == MODE_BYTE:
        for i in range(n):
            for j in range(ts):
                out[j * n + i] = x[i * ts + j]
    elif mode == MODE_BIT and n % 8 == 0:
        out[:n * ts] = 0
        for i in range(n):
            for j in range(ts):
                for b in range(8):
                    if x[i * ts + j] >> b & 1:
                        r = j * 8 + b
                        out[r * (n // 8) + i // 8] |= 1 << (i % 8)
    return out


@pytest.mark.parametrize("split", [False, True])
def test_unshuffle_cpu_against_definition(split):
    """Blocks (and, split, their streams) scattered in any order; each unshuffled by definition."""
    rng = np.random.default_rng(1)
    blocks = [(ts, size, mode) for ts in (1, 2, 3, 4, 8, 16, 17) for size in (ts * 16, ts * 24 + 5, 7)
              for mode in (MODE_NONE, MODE_BYTE, MODE_BIT)]
    if split:  # c-blosc splits only typesize <= 16 blocks that are whole multiples of typesize
        blocks = [(ts, size, m) for ts, size, m in blocks if 1 < ts <= 16 and size % ts == 0]
    xs = [rng.integers(0, 256, size, dtype=np.uint8) for _, size, _ in blocks]
    shuffled = [_ref_shuffle(x, ts, m) for x, (ts, _, m) in zip(xs, blocks)]
    nsplit = np.array([ts if split else 1 for ts, _, _ in blocks], np.int32)
    streams = [np.split(sh, n) for sh, n in zip(shuffled, nsplit)]
    flat = [st for per in streams for st in per]
    order = rng.permutation(len(flat))  # streams stored in any order, with gaps
    space = np.zeros(sum(len(f) + 3 for f in flat), np.uint8)
    addr = np.zeros(len(flat), np.int64)
    pos = 0
    for i in order:
        addr[i] = pos
        space[pos:pos + len(flat[i])] = flat[i]
        pos += len(flat[i]) + 3
    b_first = (np.cumsum(nsplit) - nsplit).astype(np.int64)
    sizes = np.array([len(x) for x in xs], np.int64)
    perm = rng.permutation(len(blocks))  # destination order differs from source order
    b_dst = np.zeros(len(xs), np.int64)
    b_dst[perm] = np.cumsum(np.concatenate([[0], sizes[perm][:-1]]))
    dst = np.zeros(int(sizes.sum()), np.uint8)
    unshuffle_cpu(space, addr, b_first, nsplit, sizes.astype(np.int32),
                  np.array([b[0] for b in blocks], np.int32), np.array([b[2] for b in blocks], np.int32), dst, b_dst)
    for x, d in zip(xs, b_dst):
        assert np.array_equal(dst[d:d + len(x)], x)


# --- corrupt chunks -----------------------------------------------------------------------

def _good(nbytes=2 * 6000, cname="lz4", shuffle=1, bs=4096):
    return encode(payload(nbytes, 2, "smooth"), cname, 5, shuffle, 2, bs), nbytes


def _patch(chunk: bytes, pos: int, fmt: str, value) -> bytes:
    b = bytearray(chunk)
    struct.pack_into(fmt, b, pos, value)
    return bytes(b)


def _stream0(chunk: bytes) -> int:
    return struct.unpack_from("<i", chunk, 16)[0]


CORRUPT = {
    "truncated-header": lambda c: c[:10],
    "truncated-body": lambda c: c[:-5],
    "version-0": lambda c: _patch(c, 0, "B", 0),
    "wrong-nbytes": lambda c: _patch(c, 4, "<i", 12),
    "cbytes-past-end": lambda c: _patch(c, 12, "<i", len(c) + 100),
    "zero-blocksize": lambda c: _patch(c, 8, "<i", 0),
    "unknown-compressor": lambda c: _patch(c, 2, "B", (c[2] & 0x1F) | (6 << 5)),
    "block-offset-past-end": lambda c: _patch(c, 16, "<i", len(c) + 4),
    "block-offset-in-table": lambda c: _patch(c, 16, "<i", 8),
    "stream-size-too-big": lambda c: _patch(c, _stream0(c), "<i", 1 << 20),
    "stream-size-negative": lambda c: _patch(c, _stream0(c), "<i", -5),
    "memcpy-flag-wrong-size": lambda c: _patch(c, 2, "B", c[2] | 0x02),
    "blosc2-version": lambda c: _patch(c, 0, "B", 5),
}


@pytest.mark.parametrize("what", list(CORRUPT))
def test_corrupt_chunk_names_the_chunk(what):
    chunk, nbytes = _good()
    good2, _ = _good()
    bad = CORRUPT[what](chunk)
    with pytest.raises(CorruptChunkError, match=r"chunk 0\.1\.2"):
        decode_chunks(cpu_ops(), [good2, bad], nbytes, names=["0.0.0", "0.1.2"])


def test_malformed_zstd_frame_is_caught_before_decode():
    """zstd streams are walked on the host like plain zstd chunks (nvCOMP never sees them)."""
    chunk, nbytes = _good(cname="zstd", shuffle=0)
    s0 = _stream0(chunk) + 4
    b = bytearray(chunk)
    b[s0 + 4] |= 0x08  # frame header's reserved bit
    staging, offs, sizes = stage([bytes(b)])
    with pytest.raises(CorruptChunkError, match=r"chunk 7\.7: frame header has its reserved bit set"):
        parse_batch(staging, offs, sizes, nbytes, ["7.7"])


@pytest.mark.parametrize("cname,what", [("zstd", "magic"), ("zlib", "header"), ("lz4", "payload"),
                                        ("zstd", "payload"), ("zlib", "payload")])
def test_corrupt_stream_content(cname, what):
    chunk, nbytes = _good(cname=cname, shuffle=0)
    s0 = _stream0(chunk) + 4
    b = bytearray(chunk)
    if what in ("magic", "header"):
        b[s0] ^= 0xFF
    else:
        for k in range(s0 + 8, min(len(b), s0 + 40)):
            b[k] ^= 0x5A
    try:
        out, _ = decode_chunks(cpu_ops(), [bytes(b)], nbytes, names=["3.4"])
    except CorruptChunkError as exc:
        assert "3.4" in str(exc)
    else:  # lz4 has no checksum: a corrupt payload may decode to other bytes, never a crash
        assert what == "payload" and len(out[0]) == nbytes


def test_blosc2_chunk_is_named_as_such():
    chunk, nbytes = _good()
    staging, offs, sizes = stage([_patch(chunk, 0, "B", 5)])
    with pytest.raises(CorruptChunkError, match=r"chunk 1\.2: a Blosc2-format chunk \(header version 5\)"):
        parse_batch(staging, offs, sizes, nbytes, ["1.2"])
