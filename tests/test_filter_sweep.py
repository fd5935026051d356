"""Seeded random filter chains against zarr-python's own read.

Each case draws a dtype, a shape with edge chunks (chunk sizes that are not a multiple of 16
bytes too), one or two filters (Delta, AsType, FixedScaleOffset, Quantize, Shuffle, BitRound,
each with random parameters), a compressor, v2 or v3 (v3 sometimes sharded, sometimes with
crc32c), writes it with zarr-python and reads it whole and in a strided region through the
engine's CPU twin, in one batch and in batches of one chunk. Most cases run element steps,
the rest the codecs' own decode; every one must equal zarr's read.
"""

from __future__ import annotations

import random

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

from gpu_zarr.engine import EngineOptions, read
from gpu_zarr.engine.metadata import layout_of

INTS = ["|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8"]
FLOATS = ["<f4", "<f8"]
CASES = 24


def _nc():
    try:
        from zarr.codecs import numcodecs as nc
    except ImportError:
        import numcodecs.zarr3 as nc
    return nc


def _filter(rng, dt):
    d, kind = np.dtype(dt), rng.choice(["delta", "astype", "fso", "quantize", "shuffle", "bitround"])
    if kind == "delta" and d.kind in "iu":
        return numcodecs.Delta(dtype=dt)
    if kind == "astype":
        return numcodecs.AsType(encode_dtype=rng.choice(INTS + FLOATS) if d.kind in "iu" else rng.choice(FLOATS),
                                decode_dtype=dt)
    if kind == "fso" and d.kind == "f":
        return numcodecs.FixedScaleOffset(offset=rng.choice([0, 1.5, -100, 1000]), scale=rng.choice([1, 10, 3.3, 0.25]),
                                          dtype=dt, astype=rng.choice(["<i4", "<u2", "<i8", "<f4", dt]))
    if kind == "quantize" and d.kind == "f":
        return numcodecs.Quantize(digits=rng.choice([1, 3, 6]), dtype=dt)
    if kind == "shuffle":
        return numcodecs.Shuffle(elementsize=d.itemsize)
    if kind == "bitround" and d.kind == "f":
        return numcodecs.BitRound(keepbits=rng.choice([3, 10]))
    return None


def _values(rng, shape, dt):
    d, r = np.dtype(dt), np.random.default_rng(rng.randrange(1 << 30))
    if d.kind == "f":
        return (r.normal(size=shape) * 100).astype(d)
    info = np.iinfo(d)
    return r.integers(max(info.min, -1000), min(info.max, 60000), size=shape, dtype=d, endpoint=True)


def _v3_filters(filters):
    nc = _nc()
    wrap = {"delta": nc.Delta, "astype": nc.AsType, "fixedscaleoffset": nc.FixedScaleOffset,
            "quantize": nc.Quantize, "bitround": nc.BitRound}
    aa = [wrap[f.codec_id](**{k: v for k, v in f.get_config().items() if k != "id"})
          for f in filters if f.codec_id in wrap]
    bb = [nc.Shuffle(elementsize=f.elementsize) for f in filters if f.codec_id == "shuffle"][:1]
    return aa, bb


def _store(rng, path):
    """A random filter chain's store and its values, or None where zarr cannot write the draw."""
    dt = rng.choice(INTS + FLOATS)
    nd = rng.choice([1, 2, 3])
    shape = tuple(rng.randint(1, 40) for _ in range(nd))
    chunks = tuple(rng.randint(1, 17) for _ in range(nd))
    filters = [f for f in (_filter(rng, dt) for _ in range(rng.choice([1, 1, 2]))) if f is not None]
    if not filters:
        return None
    try:
        if rng.random() < 0.5:
            comp = rng.choice([None, numcodecs.Zstd(1), numcodecs.Blosc("lz4", 5, rng.choice([0, 1, 2])),
                               numcodecs.Zlib(1), numcodecs.GZip(1)])
            arr = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype=dt, zarr_format=2, filters=filters,
                                    compressors=comp, fill_value=0)
        else:
            aa, bb = _v3_filters(filters)
            comps = [*bb, rng.choice([ZstdCodec(level=1), GzipCodec(level=1), BloscCodec(cname="lz4")]),
                     *rng.choice([[], [Crc32cCodec()]])]
            shards = tuple(c * rng.choice([1, 2]) for c in chunks) if rng.random() < 0.4 else None
            arr = zarr.create_array(str(path), shape=shape, chunks=chunks, shards=shards, dtype=dt, zarr_format=3,
                                    filters=aa or None, compressors=comps, fill_value=0)
        with np.errstate(all="ignore"):
            arr[...] = _values(rng, shape, dt)
        arr = zarr.open_array(str(path), mode="r")
        return arr, arr[...]
    except (ValueError, TypeError, OverflowError):  # a draw zarr or numcodecs refuses
        return None


def _first_store(seed, tmp_path):
    """The first draw of ``seed`` that zarr can write."""
    rng = random.Random(seed)
    for attempt in range(20):
        made = _store(rng, tmp_path / f"a{attempt}.zarr")
        if made is not None:
            return made
    raise AssertionError(f"seed {seed}: zarr wrote none of 20 draws")


@pytest.mark.parametrize("seed", range(CASES))
def test_random_filter_chain_matches_zarr(tmp_path, seed):
    arr, want = _first_store(seed, tmp_path)
    sel = tuple(slice(s // 3, s, 2) for s in arr.shape)
    for opts in (None, EngineOptions(batch_bytes=1, slots=2, threads=3)):
        got = read(arr, Ellipsis, device="cpu", options=opts).data
        assert got.dtype == want.dtype.newbyteorder("=")
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(read(arr, sel, device="cpu", options=opts).data, want[sel])


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(CASES))
def test_random_filter_chain_on_the_gpu_matches_zarr(tmp_path, seed):
    """The same draws through the engine on the GPU (nvCOMP, then the element steps in cupy)."""
    arr, want = _first_store(seed, tmp_path)
    sel = tuple(slice(s // 3, s, 2) for s in arr.shape)
    for opts in (None, EngineOptions(batch_bytes=1, slots=2)):
        for region in (Ellipsis, sel):
            got = read(arr, region, device="gpu", options=opts).data
            assert got.dtype == want.dtype.newbyteorder("=")
            np.testing.assert_array_equal(got.get(), want[region])


def test_most_random_filter_chains_run_element_steps(tmp_path):
    rng, steps, made = random.Random(1000), 0, 0
    for k in range(40):
        got = _store(rng, tmp_path / f"b{k}.zarr")
        if got is not None:
            made += 1
            steps += bool(layout_of(got[0]).elements)
    assert made >= 20 and steps >= made * 0.6, (steps, made)
