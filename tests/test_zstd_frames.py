"""Host-side zstd frame checks: what nvCOMP must never see."""

from __future__ import annotations

import numcodecs
import numpy as np
import pytest

from gpu_zarr.engine.codecs.zstd_frames import check_frames
from gpu_zarr.errors import CorruptChunkError
from test_gpu import _frame_without_content_size

N = 300_000  # several zstd blocks


def _frames(checksum=False, n=3):
    rng = np.random.default_rng(1)
    raw = [(np.cumsum(rng.integers(-3, 4, N // 2)) % 5000).astype("u2").tobytes() for _ in range(n)]
    return [numcodecs.Zstd(level=1, checksum=checksum).encode(r) for r in raw], raw


def _pack(frames):
    offs, pos = [], 0
    for f in frames:
        offs.append(pos)
        pos += -(-len(f) // 16) * 16
    buf = np.zeros(pos, np.uint8)
    for o, f in zip(offs, frames):
        buf[o:o + len(f)] = np.frombuffer(f, np.uint8)
    return buf, np.array(offs), np.array([len(f) for f in frames])


@pytest.mark.parametrize("checksum", [False, True])
@pytest.mark.parametrize("strip", [False, True])
def test_valid_frames_pass(checksum, strip):
    frames, raw = _frames(checksum)
    if strip:
        frames = [_frame_without_content_size(f) for f in frames]
        # still a valid zstd frame for the reference decoder
        assert numcodecs.Zstd().decode(frames[0]) == raw[0]
    info = check_frames(*_pack(frames), N, ["a", "b", "c"])
    assert list(info.content_size) == ([-1] * 3 if strip else [N] * 3)


@pytest.mark.parametrize("damage,match", [
    (lambda f: f[:-1], "truncated"),
    (lambda f: f[: len(f) // 3], "truncated"),
    (lambda f: b"\xff" + f[1:], "magic"),
    (lambda f: f + b"\x00", "follow the frame"),
    (lambda f: f[:4] + bytes([f[4] | 0x08]) + f[5:], "reserved"),
    (lambda f: f[:4] + bytes([f[4] | 0x01]) + f[5:], "dictionary"),
])
def test_damaged_frame_is_named(damage, match):
    frames, _ = _frames()
    frames[1] = damage(frames[1])
    with pytest.raises(CorruptChunkError, match=match) as info:
        check_frames(*_pack(frames), N, ["c/0", "c/1", "c/2"])
    assert "c/1" in str(info.value)


def test_a_second_frame_is_named_as_such_not_as_damage():
    """Two frames back to back are valid zstd (libzstd decodes the sequence) that no zarr writer
    makes: the refusal says so and where they can be read, rather than calling the chunk corrupt."""
    frames, _ = _frames(n=2)
    with pytest.raises(CorruptChunkError, match="another zstd frame follows the first.*prefer='cpu'"):
        check_frames(*_pack([frames[0] + frames[1]]), -1, ["c/0"])


def test_wrong_content_size_refused():
    frames, _ = _frames()
    with pytest.raises(CorruptChunkError, match="metadata"):
        check_frames(*_pack(frames), N * 2, ["x", "y", "z"])


def test_block_header_corruption():
    frames, _ = _frames(n=1)
    f = bytearray(frames[0])
    # first block header sits after magic + FHD + FCS (4 bytes for this size, single segment)
    hdr = 4 + 1 + 4
    f[hdr:hdr + 3] = (3 << 1).to_bytes(3, "little")  # reserved block type
    with pytest.raises(CorruptChunkError, match="block header"):
        check_frames(*_pack([bytes(f)]), N, ["only"])


def test_truncated_frame_header_is_reported_not_an_index_error():
    frames, _ = _frames()
    f = np.frombuffer(frames[0][:7], np.uint8).copy()  # magic + FHD + part of the content size
    with pytest.raises(CorruptChunkError, match="truncated"):
        check_frames(f, np.array([0]), np.array([7]), N, ["c/0"])


_SHIM = """
extern "C" void run(long long* table, long long n, long long dummy_ptr, long long dummy_bytes, long long* code) {
    blockDim.x = n + 1;
    for (long long k = 0; k < n; ++k) { threadIdx.x = k; zstd_sanitize(table, n, dummy_ptr, dummy_bytes, code); }
}
"""


def test_gpu_frame_check_kernel_agrees_with_the_host_check(tmp_path):
    """The CUDA frame walk (compiled here as plain C++) flags exactly what check_frames flags."""
    import ctypes

    from kernel_shim import build

    lib = build(tmp_path, _SHIM)
    frames, raw = _frames(n=2)
    frames += [numcodecs.Zstd(level=3, checksum=True).encode(raw[0]), _frame_without_content_size(frames[0]),
               numcodecs.Zstd(level=1).encode(bytes(N))]
    rng = np.random.default_rng(0)
    cases = [(bytes(f), True) for f in frames]
    for t in range(1500):
        b = bytearray(frames[int(rng.integers(len(frames)))])
        kind = t % 5
        if kind == 0:
            b = b[:int(rng.integers(0, len(b)))]
        elif kind == 1:
            b[int(rng.integers(0, len(b)))] ^= int(rng.integers(1, 256))
        elif kind == 2:
            b[int(rng.integers(0, 20))] ^= int(rng.integers(1, 256))
        elif kind == 3:
            b = bytearray(rng.integers(0, 256, len(b), dtype=np.uint8).tobytes())
        else:
            b += bytes(int(rng.integers(1, 5)))
        cases.append((bytes(b), False))
    flagged = 0
    for data, valid in cases:
        buf = np.frombuffer(data + bytes(1), np.uint8).copy()
        table = np.zeros(7, np.int64)
        table[:3] = buf.ctypes.data, len(data), N
        code = np.zeros(1, np.int64)
        lib.run(table.ctypes.data_as(ctypes.c_void_p), ctypes.c_longlong(1), ctypes.c_longlong(99),
                ctypes.c_longlong(10), code.ctypes.data_as(ctypes.c_void_p))
        try:
            check_frames(buf, np.array([0]), np.array([len(data)]), N, ["x"])
            host_bad = False
        except CorruptChunkError:
            host_bad = True
        assert bool(code[0]) == host_bad, (code[0], host_bad, data[:16].hex(), len(data))
        if code[0]:
            flagged += 1
            assert tuple(table[:2]) == (99, 10)  # nvCOMP gets the harmless stand-in frame
        if valid:
            assert code[0] == 0
    assert flagged > 800  # truncations, garbage and trailing bytes are all caught
