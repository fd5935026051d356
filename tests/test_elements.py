"""Element steps (engine/codecs/elements.py) against numcodecs' own decode, bit for bit.

Each filter encodes random values (NaN, infinities and extremes among them) with numcodecs;
the step decodes a batch of such chunks -- rows end to end, at the start of their buffers or
some bytes in -- with numpy here and with cupy under ``-m gpu``: both must give numcodecs'
bytes exactly.
"""

from __future__ import annotations

import numcodecs
import numpy as np
import pytest

from gpu_zarr.engine.codecs import elements as el

M = 1000  # elements a chunk
N = 5  # chunks a batch


def _values(dtype, seed):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        v = rng.normal(size=N * M) * 1000
        v[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, np.finfo(dt).max]
        return v.astype(dt)
    info = np.iinfo(dt)
    v = rng.integers(info.min, info.max, size=N * M, endpoint=True, dtype=dt)
    v[:2] = [info.min, info.max]
    return v


FILTERS = [
    numcodecs.Delta(dtype="<u2"), numcodecs.Delta(dtype="<i4"), numcodecs.Delta(dtype="|i1"),
    numcodecs.Delta(dtype="<u8"),
    numcodecs.AsType(encode_dtype="<f4", decode_dtype="<f8"), numcodecs.AsType(encode_dtype="<f8", decode_dtype="<f4"),
    numcodecs.AsType(encode_dtype="<i2", decode_dtype="<f4"), numcodecs.AsType(encode_dtype="<i8", decode_dtype="<i2"),
    numcodecs.AsType(encode_dtype="<u4", decode_dtype="<f8"),
    numcodecs.Quantize(digits=2, dtype="<f8", astype="<f4"), numcodecs.Quantize(digits=5, dtype="<f4"),
    numcodecs.FixedScaleOffset(offset=1000, scale=10, dtype="<f8", astype="<u2"),
    numcodecs.FixedScaleOffset(offset=0.25, scale=3.7, dtype="<f4", astype="<i2"),
    numcodecs.FixedScaleOffset(offset=-7, scale=0.1, dtype="<f4", astype="<f4"),
    numcodecs.FixedScaleOffset(offset=1e6, scale=1 / 3, dtype="<f8", astype="<i8"),
    numcodecs.AsType(encode_dtype="<u8", decode_dtype="<f8"), numcodecs.AsType(encode_dtype="<i8", decode_dtype="<f4"),
    numcodecs.Shuffle(elementsize=2), numcodecs.Shuffle(elementsize=4), numcodecs.Shuffle(elementsize=8),
]


def _decoded(f):
    """The dtype the filter decodes to (a shuffle: unsigned integers of its element size)."""
    if f.codec_id == "shuffle":
        return np.dtype(f"<u{f.elementsize}")
    return np.dtype(getattr(f, "decode_dtype", None) or f.dtype)


def _encoded(f, seed):
    """(numcodecs' encoded bytes of N chunks, each chunk's decode by numcodecs)."""
    dec_dtype = _decoded(f)
    vals = _values(dec_dtype, seed).reshape(N, M)
    with np.errstate(all="ignore"):
        enc = [np.frombuffer(bytes(np.asarray(f.encode(v))), np.uint8) for v in vals]
        want = [np.frombuffer(bytes(np.asarray(f.decode(e))), np.uint8) for e in enc]
    return enc, want


def _run(xp, steps, enc, pad):
    """The steps on the N chunks laid out end to end, ``pad`` bytes into their buffers (the
    engine hands the last step a slice of its decoded buffer)."""
    src_size, dst_size = len(enc[0]), M * steps[-1].decoded.itemsize
    src = np.zeros(pad + N * src_size, np.uint8)
    src[pad:] = np.concatenate(enc)
    src, dst = xp.asarray(src), xp.zeros(pad + N * dst_size, xp.uint8)
    with np.errstate(all="ignore"):
        for lo, hi in ((0, 2), (2, N)):  # in two groups, as the CPU's threads take them
            el.run(xp, steps, src[pad:], dst[pad:], lo, hi, M, lambda n: xp.empty(n, xp.uint8))
    dst = dst.get() if hasattr(dst, "get") else dst
    return [dst[pad + k * dst_size:pad + (k + 1) * dst_size] for k in range(N)]


def _same(got, want, dtype) -> bool:
    """Bit for bit, but a NaN may carry another payload (the GPU writes the canonical quiet NaN
    where numpy keeps the payload through a cast: both are NaN to every reader)."""
    if dtype.kind != "f":
        return got.tobytes() == want.tobytes()
    g, w = got.view(dtype), want.view(dtype)
    nan = np.isnan(w)
    return bool((np.isnan(g) == nan).all() and g[~nan].tobytes() == w[~nan].tobytes())


def _check(xp, f):
    steps = el.element_steps([f], _decoded(f))
    assert steps is not None and len(steps) == 1, f
    for seed, pad in ((0, 0), (1, 16), (2, 8)):
        enc, want = _encoded(f, seed)
        for k, (g, w) in enumerate(zip(_run(xp, steps, enc, pad), want, strict=True)):
            assert _same(g, w, steps[-1].decoded), (f, seed, pad, k)


@pytest.mark.parametrize("f", FILTERS, ids=repr)
def test_steps_decode_what_numcodecs_decodes(f):
    _check(np, f)


@pytest.mark.gpu
@pytest.mark.parametrize("f", FILTERS, ids=repr)
def test_steps_on_the_gpu_decode_what_numcodecs_decodes(f):
    cupy = pytest.importorskip("cupy")
    _check(cupy, f)


@pytest.mark.parametrize("f", [
    numcodecs.Delta(dtype="<f4"),  # a running sum of floats depends on the order of the additions
    numcodecs.Delta(dtype="<i4", astype="<i2"),
    numcodecs.Delta(dtype=">i2"),
    numcodecs.AsType(encode_dtype="<f4", decode_dtype="<i4"),  # float to integer: NaN and overflow differ
    numcodecs.FixedScaleOffset(offset=0, scale=10, dtype="<i4", astype="<i2"),
    numcodecs.Quantize(digits=2, dtype="<f2"),
    numcodecs.Shuffle(elementsize=3),
    numcodecs.PackBits(),
], ids=repr)
def test_filters_without_an_exact_step_are_left_to_the_codecs(f):
    assert el.element_steps([f], np.dtype("<i4")) is None


def test_identity_filters_need_no_step_and_steps_must_chain():
    assert el.element_steps([numcodecs.BitRound(keepbits=5)], np.dtype("<f4")) == ()
    # AsType's 8-byte elements do not chain into Delta's 4-byte ones
    assert el.element_steps([numcodecs.AsType(encode_dtype="<i8", decode_dtype="<i8"),
                             numcodecs.Delta(dtype="<i4")], np.dtype("<i4")) is None
    # the last step must write the array's item size
    assert el.element_steps([numcodecs.Delta(dtype="<i2")], np.dtype("<i4")) is None


@pytest.mark.parametrize("pad", [0, 8, 16])
def test_two_steps_at_any_stride(pad):
    """Delta after AsType (encode order), the chunks at the start of their buffers or some bytes
    in: the step between them reads the rows the first wrote into scratch."""
    _two_steps(np, pad)


@pytest.mark.gpu
@pytest.mark.parametrize("pad", [0, 8, 16])
def test_two_steps_on_the_gpu_at_any_stride(pad):
    _two_steps(pytest.importorskip("cupy"), pad)


def _two_steps(xp, pad):
    filters = [numcodecs.Delta(dtype="<i4"), numcodecs.AsType(encode_dtype="<i8", decode_dtype="<i4")]
    steps = el.element_steps(filters, np.dtype("<i4"))
    assert [s.name for s in steps] == ["astype", "delta"]
    vals = _values("<i4", 3).reshape(N, M)
    enc, want = [], []
    for v in vals:
        e = v
        for f in filters:
            e = f.encode(e)
        enc.append(np.frombuffer(bytes(np.asarray(e)), np.uint8))
        want.append(v.view(np.uint8))
    for k, (g, w) in enumerate(zip(_run(xp, steps, enc, pad), want, strict=True)):
        assert g.tobytes() == w.tobytes(), k
