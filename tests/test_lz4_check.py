"""The LZ4 block walk that runs before nvCOMP's LZ4: ``lz4_sanitize`` on the GPU, its native twin
``native.lz4_check`` before the CPU's batched LZ4 decode.

nvCOMP's LZ4 is undefined on a block that does not decode to its size, so every block is
walked first. The walk must accept exactly what LZ4's own safe decoder (liblz4's
``LZ4_decompress_safe``, the native library's ``lz4`` decode) decodes to that size: held to it on
valid blocks of many kinds and on each one cut, flipped and overwritten. The CUDA kernel, built
as C++ here, must flag exactly what the native walk flags. Then through the CPU twin's stream
decode, with the library and without.
"""

from __future__ import annotations

from types import SimpleNamespace

import numcodecs
import numpy as np
import pytest

from blosc_cases import payload
from gpu_zarr import settings
from gpu_zarr.engine import native
from gpu_zarr.engine.codecs.blosc import decode_plan, parse_batch
from gpu_zarr.engine.decode import decode_batch_cpu
from gpu_zarr.engine.ops import CpuOps
from gpu_zarr.errors import CorruptChunkError

needs_native = pytest.mark.skipif(not native.available(), reason=f"native library: {native.status().reason}")


def _blocks() -> list[tuple[str, bytes, int]]:
    """(name, raw LZ4 block, decoded size): numcodecs' LZ4 at two accelerations over data with
    long matches, short matches, none at all, and sizes around LZ4's end-of-block limits."""
    rng = np.random.default_rng(7)
    out = []
    for name, raw in [
        ("zeros", bytes(70000)),
        ("noise", rng.integers(0, 256, 5000, np.uint8).tobytes()),
        ("ramp-u2", np.arange(30000, dtype="<u2").tobytes()),
        ("text", b"the quick brown fox jumps over the lazy dog; " * 300),
        ("short-runs", rng.integers(0, 3, 20000, np.uint8).tobytes()),
        ("smooth-u2", payload(8192, 2, "smooth").tobytes()),
        *[(f"len{n}", (b"abcab" * 8)[:n]) for n in (0, 1, 5, 12, 13, 17, 20, 40)],
        ("long-literals-then-match", rng.integers(0, 256, 300, np.uint8).tobytes() + bytes(400)),
    ]:
        for accel in (1, 30):
            out.append((f"{name}-a{accel}", bytes(numcodecs.LZ4(accel).encode(raw))[4:], len(raw)))
    return out


BLOCKS = _blocks()


def _reference(block: bytes, dsize: int) -> int:
    """liblz4's safe decoder: the status of decoding ``block`` to exactly ``dsize`` bytes."""
    src = np.frombuffer(block, np.uint8).copy() if block else np.zeros(1, np.uint8)
    dst = np.empty(max(dsize, 1), np.uint8)
    st, _ = native.decode("lz4", src, [0], [len(block)], dst, [0], [dsize], 1)
    return int(st[0])


def _walk(blocks: list[bytes], dsizes: list[int]) -> np.ndarray:
    buf = np.frombuffer(b"".join(blocks) + b"\0", np.uint8).copy()
    sizes = np.array([len(b) for b in blocks], np.int64)
    st = native.lz4_check(buf, np.cumsum(sizes) - sizes, sizes, dsizes, 4)
    assert st is not None
    return st


def _variants() -> list[tuple[bytes, int]]:
    """Every valid block cut at many lengths, with bytes flipped and overwritten, with the wrong
    decoded size, and random bytes of its length (empty spans left out)."""
    rng = np.random.default_rng(11)
    variants: list[tuple[bytes, int]] = []
    for _, block, dsize in BLOCKS:
        cuts = range(len(block)) if len(block) < 200 else rng.integers(0, len(block), 60)
        variants += [(block[:int(c)], dsize) for c in cuts]
        for _ in range(60):
            b = bytearray(block)
            if not b:
                continue
            for _ in range(int(rng.integers(1, 4))):
                b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
            variants.append((bytes(b), dsize))
        variants += [(block, dsize + 1), (block, max(dsize - 1, 0)), (block + b"\0", dsize)]
        variants.append((rng.integers(0, 256, max(len(block), 1), np.uint8).tobytes(), dsize))
    return [(b, d) for b, d in variants if b]  # an empty span is refused before the walk


@needs_native
def test_every_valid_block_passes():
    st = _walk([b for _, b, _ in BLOCKS], [d for _, _, d in BLOCKS])
    assert (st == native.OK).all(), [(BLOCKS[i][0], native.describe(int(st[i]))) for i in np.flatnonzero(st)]


@needs_native
@pytest.mark.skipif(not native.available() or "lz4" not in native.status().codecs, reason="no liblz4")
def test_walk_accepts_exactly_what_the_safe_decoder_decodes():
    """Cut at every length, bytes flipped and overwritten, the wrong decoded size: the walk
    and ``LZ4_decompress_safe`` agree on every variant (none accepted that the decoder rejects).
    The one rule where they differ, a match offset of 0, has a test of its own."""
    variants = _variants()
    st = _walk([b for b, _ in variants], [d for _, d in variants])
    ref = np.array([_reference(b, d) for b, d in variants])
    accepted_bad = np.flatnonzero((st == native.OK) & (ref != native.OK))
    assert not len(accepted_bad), f"{len(accepted_bad)} blocks the decoder rejects passed the walk"
    refused_good = np.flatnonzero((st != native.OK) & (ref == native.OK))
    assert not len(refused_good), f"{len(refused_good)} blocks the decoder takes were refused"
    assert (st != native.OK).sum() > len(variants) // 2  # the damage was seen, not waved through


@needs_native
def test_offset_zero_is_refused():
    """LZ4's format has no offset 0; liblz4's decoder takes one (copying output bytes not yet
    written: whatever the buffer held). The walk refuses it; offset 1 is the same block, valid."""
    def block(offset: int) -> bytes:
        return bytes([13 << 4]) + b"a" * 13 + offset.to_bytes(2, "little") + bytes([8 << 4]) + b"b" * 8

    st = _walk([block(1), block(0)], [25, 25])
    assert st.tolist() == [native.OK, native.CORRUPT]
    assert _reference(block(1), 25) == native.OK


@needs_native
def test_spans_outside_the_buffer_are_refused():
    block = BLOCKS[0][1]
    buf = np.frombuffer(block, np.uint8).copy()
    st = native.lz4_check(buf, [0, 1, -1, 0], [len(block), len(block), 4, 0], [70000] * 4, 2)
    assert st.tolist() == [native.OK, native.BOUNDS, native.BOUNDS, native.BOUNDS]


@pytest.fixture(params=["native", "fallback"])
def mode(request):
    if request.param == "native" and not native.available():
        pytest.skip(f"native library: {native.status().reason}")
    with settings.set(native=request.param == "native"):
        yield request.param


def test_cpu_batch_decode_names_the_chunk(mode):
    """The GPU decode's CPU twin refuses a block cut short naming its chunk: walked first with
    the library (as the GPU walks it), numcodecs' own error without."""
    good = [b for _, b, _ in BLOCKS[:4]]
    sizes = np.array([d for _, _, d in BLOCKS[:4]], np.int64)
    for blocks, fails in ((good, False), ([good[0], good[1], good[2][: len(good[2]) // 2], good[3]], True)):
        buf = np.frombuffer(b"".join(blocks), np.uint8).copy()
        lens = np.array([len(b) for b in blocks], np.int64)
        dst = np.empty(int(sizes.sum()), np.uint8)
        args = ("lz4", buf, np.cumsum(lens) - lens, lens, dst, np.cumsum(sizes) - sizes, sizes, [f"c/{i}" for i in range(4)])
        if fails:
            with pytest.raises(CorruptChunkError, match="c/2"):
                decode_batch_cpu(*args, threads=2)
        else:
            decode_batch_cpu(*args, threads=2)
            assert dst[: sizes[0]].tobytes() == bytes(70000)


def test_damaged_blosc_lz4_stream_is_refused_by_the_stream_decode(mode):
    """A Blosc chunk whose LZ4 stream is damaged inside (every size and offset intact) passes the
    parse and is refused by the stream decode (the path nvCOMP takes on the GPU), naming the chunk."""
    raw = payload(65536, 2, "smooth")
    enc = bytearray(numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, 16384).encode(raw))
    staging = np.frombuffer(bytes(enc), np.uint8).copy()
    plan = parse_batch(staging, np.array([0]), np.array([len(enc)]), raw.nbytes, ["c/0/0"])
    lz = np.flatnonzero(plan.s_kind == 1)
    assert len(lz), "the chunk has no LZ4 stream to damage"
    s = int(plan.s_src[lz[0]])
    enc[s:s + 3] = bytes([0xF0 | (enc[s] & 0x0F), 0xFF, 0xFF])  # a first literal run far past the stream
    staging = np.frombuffer(bytes(enc), np.uint8).copy()
    plan = parse_batch(staging, np.array([0]), np.array([len(enc)]), raw.nbytes, ["c/0/0"])
    with pytest.raises(CorruptChunkError, match="c/0/0"):
        decode_plan(CpuOps(), staging, plan, np.empty(raw.nbytes, np.uint8), np.array([0]), ["c/0/0"])


_SHIM = """
extern "C" void run(long long* table, long long n, long long dummy_ptr, long long dummy_bytes, long long* code) {
    blockDim.x = n + 1;
    for (long long k = 0; k < n; ++k) { threadIdx.x = k; lz4_sanitize(table, n, dummy_ptr, dummy_bytes, code); }
}
"""


@needs_native
def test_gpu_walk_kernel_agrees_with_the_native_walk(tmp_path):
    """The CUDA walk (``lz4_sanitize``, compiled here as plain C++) flags exactly the blocks the
    native walk flags, on every variant of the agreement test, and swaps each for the dummy."""
    import ctypes

    from kernel_shim import build

    lib = build(tmp_path, _SHIM)
    variants = _variants()
    st = _walk([b for b, _ in variants], [d for _, d in variants])
    bufs = [np.frombuffer(b + b"\0", np.uint8).copy() for b, _ in variants]
    n = len(variants)
    table = np.zeros(7 * n, np.int64)
    table[:n] = [b.ctypes.data for b in bufs]
    table[n:2 * n] = [len(b) for b, _ in variants]
    table[2 * n:3 * n] = [d for _, d in variants]
    code = np.full(n, -1, np.int64)
    lib.run(table.ctypes.data_as(ctypes.c_void_p), ctypes.c_longlong(n), ctypes.c_longlong(99), ctypes.c_longlong(2),
            code.ctypes.data_as(ctypes.c_void_p))
    assert ((code != 0) == (st != native.OK)).all()
    assert (code[st == native.SIZE] == 21).all() and set(code[(st != 0) & (st != native.SIZE)].tolist()) <= {20}
    assert (table[:n][code != 0] == 99).all() and (table[n:2 * n][code != 0] == 2).all()


def _long_blocks(count: int, nbytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[bytes]]:
    """``count`` numcodecs LZ4 blocks of ``nbytes`` decoded bytes each, back to back in one buffer."""
    blocks = [bytes(numcodecs.LZ4().encode(payload(nbytes, 2, "smooth", seed=k).tobytes()))[4:] for k in range(count)]
    sizes = np.array([len(b) for b in blocks], np.int64)
    return np.frombuffer(b"".join(blocks), np.uint8).copy(), np.cumsum(sizes) - sizes, sizes, blocks


@needs_native
def test_long_blocks_are_walked_on_the_host_and_many_short_ones_left_to_the_gpu():
    """The GPU walks a block on one thread, the host all of them on its threads: a few blocks of
    megabytes are walked here, thousands of small streams are left to the GPU, and a damaged long
    block is refused here, naming its chunk."""
    from gpu_zarr.engine.codecs.lz4 import walk_blocks

    buf, offs, sizes, blocks = _long_blocks(3, 2 << 20)
    names = ["c/0", "c/1", "c/2"]
    assert walk_blocks(buf, offs, sizes, np.full(3, 2 << 20), names)
    many = np.full(4096, 32 << 10, np.int64)  # 128 MiB of 32 KiB streams (all the same bytes: only sizes matter)
    assert not walk_blocks(buf, np.zeros(4096, np.int64), np.full(4096, 1, np.int64), many, ["s"] * 4096)
    cut = np.frombuffer(blocks[0] + blocks[1][: len(blocks[1]) // 2] + blocks[2], np.uint8).copy()
    cut_sizes = np.array([len(blocks[0]), len(blocks[1]) // 2, len(blocks[2])], np.int64)
    with pytest.raises(CorruptChunkError, match="c/1: its LZ4 block does not decode"):
        walk_blocks(cut, np.cumsum(cut_sizes) - cut_sizes, cut_sizes, np.full(3, 2 << 20), names)
    with settings.set(native=False):
        assert not walk_blocks(buf, offs, sizes, np.full(3, 2 << 20), names)  # no library: the decoders walk


@needs_native
def test_chunks_walked_on_the_host_are_not_walked_again(monkeypatch):
    """numcodecs LZ4 chunks of 2 MiB (one block each) and a Blosc chunk of long LZ4 streams: the
    stages' host halves walk them, the decode does not walk them a second time, and a damaged
    stream is refused by the host half naming its chunk."""
    from gpu_zarr.engine.codecs.blosc import BloscStage
    from gpu_zarr.engine.codecs.lz4 import Lz4Stage

    walks = []
    real = native.lz4_check
    monkeypatch.setattr(native, "lz4_check", lambda *a: walks.append(len(a[1])) or real(*a))
    raws = [payload(2 << 20, 2, "smooth", seed=k) for k in range(2)]
    encs = [bytes(numcodecs.LZ4().encode(r.tobytes())) for r in raws]
    lens = np.array([len(e) for e in encs], np.int64)
    staging = np.frombuffer(b"".join(encs), np.uint8).copy()

    class Lay:  # what the stages read of a layout
        inner_nbytes = 2 << 20
        codec_params: dict = {}

    batch = SimpleNamespace(src_offsets=np.cumsum(lens) - lens, src_sizes=lens)  # what the stages read of a batch
    prep = Lz4Stage().prepare(staging, batch, Lay(), ["c/0", "c/1"])
    assert prep.walked and walks == [2]
    dst = np.empty(4 << 20, np.uint8)
    Lz4Stage().decode(CpuOps(), staging, batch, prep, dst, np.array([0, 2 << 20]), Lay(), ["c/0", "c/1"], 0, None)
    assert walks == [2], "the decode walked the blocks again"
    assert dst.tobytes() == b"".join(r.tobytes() for r in raws)

    raw = payload(1 << 20, 2, "smooth").view("<u2")  # Blosc blocks of 512 KiB, shuffled: streams of 256 KiB
    enc = bytearray(numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE, 1 << 20).encode(raw))
    one = SimpleNamespace(src_offsets=np.array([0]), src_sizes=np.array([len(enc)]))
    Lay.inner_nbytes = raw.nbytes
    plan = BloscStage().prepare(np.frombuffer(bytes(enc), np.uint8).copy(), one, Lay(), ["c/9"])
    assert plan.lz4_walked
    s = int(plan.s_src[np.flatnonzero(plan.s_kind == 1)[0]])
    enc[s:s + 2049] = bytes([0xF0 | (enc[s] & 0x0F)]) + b"\xff" * 2048  # a first literal run far past the stream
    with pytest.raises(CorruptChunkError, match="c/9"):
        BloscStage().prepare(np.frombuffer(bytes(enc), np.uint8).copy(), one, Lay(), ["c/9"])
