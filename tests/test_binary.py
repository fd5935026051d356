"""The one definition of alignment and little-endian integers (:mod:`gpu_zarr.engine.binary`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpu_zarr.engine.binary import align_up, le_ints, le_uint, le_uints, packed_offsets


def test_le_readers_match_int_from_bytes():
    rng = np.random.default_rng(5)
    buf = rng.integers(0, 256, 256, dtype=np.uint8)
    buf[:8] = 0xFF  # values with the top bit set
    pos = np.array([[0, 3, 17], [100, 200, 1]])
    for n in range(1, 9):
        got = le_uints(buf, pos, n)
        assert got.dtype == np.int64 and got.shape == pos.shape
        want = [[int.from_bytes(bytes(buf[p:p + n]), "little") for p in row] for row in pos.tolist()]
        assert (got.astype(np.uint64) == np.array(want, np.uint64)).all(), n
        assert [le_uint(buf, p, n) for p in pos.ravel().tolist()] == sum(want, [])
        if n in (1, 2, 4, 8):
            signed = [[int.from_bytes(bytes(buf[p:p + n]), "little", signed=True) for p in row] for row in pos.tolist()]
            assert le_ints(buf, pos, n).tolist() == signed
    assert le_uints(buf, np.zeros(0, np.int64), 3).shape == (0,)
    assert le_uint(b"\x01\x02\x03", 1) == 0x0302
    with pytest.raises(ValueError):
        le_uints(buf, pos, 9)
    with pytest.raises(ValueError):
        le_ints(buf, pos, 3)


def test_alignment():
    assert align_up(17) == 32 and align_up(np.array([0, 1, 16]), 8).tolist() == [0, 8, 16]
    offs, total = packed_offsets(np.array([5, 20, 3]))
    assert offs.tolist() == [0, 16, 48] and total == 51


def test_one_definition_of_little_endian_readers():
    """No other module of the package spells out a little-endian read (the CUDA kernels'
    device code excepted: it lives in strings)."""
    src = Path(__file__).resolve().parents[1] / "src" / "gpu_zarr"
    bad = [str(p.relative_to(src)) for p in src.rglob("*.py") if p.name != "binary.py"
           and any(s in p.read_text() for s in ("int.from_bytes(", '.view("<', ".view('<"))]
    assert bad == []
