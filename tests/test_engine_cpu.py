"""The engine's CPU twin against zarr-python's own read: same plan, batches and placement."""

from __future__ import annotations

import os

import numpy as np
import pytest

from gpu_zarr.engine import EngineOptions, read
from gpu_zarr.errors import CorruptChunkError, UnsupportedArrayError
from stores import DTYPES, LAYOUTS, SELECTIONS, write


def _expect(arr, sel):
    return arr[...][sel]  # zarr itself has no negative steps: apply the selection in numpy


def _check(arr, sel, **kw):
    res = read(arr, sel, device="cpu", **kw)
    got = res.data
    want = _expect(arr, sel)
    assert got.shape == want.shape
    assert got.dtype == want.dtype.newbyteorder("=")
    assert got.dtype.isnative
    np.testing.assert_array_equal(got, want)
    return res.stats


@pytest.mark.parametrize("name,kw", LAYOUTS, ids=[n for n, _ in LAYOUTS])
@pytest.mark.parametrize("sel", SELECTIONS, ids=range(len(SELECTIONS)))
def test_layouts_match_zarr(tmp_path, name, kw, sel):
    arr, _ = write(tmp_path / "a.zarr", **kw)
    _check(arr, sel)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt,codec", [(2, "raw"), (2, "zstd"), (3, "raw"), (3, "zstd")])
def test_dtypes_match_zarr(tmp_path, dtype, fmt, codec):
    arr, _ = write(tmp_path / "a.zarr", fmt=fmt, codec=codec, dtype=dtype,
                   fill_value=False if dtype == "|b1" else 0)
    _check(arr, Ellipsis)
    _check(arr, (slice(2, 30, 3), 11))


def test_small_batches_many_slots(tmp_path):
    """Batches of one chunk: the batching and slot rotation paths all run."""
    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", chunks=(4, 8, 7), shards=(8, 16, 14))
    stats = _check(arr, Ellipsis, options=EngineOptions(batch_bytes=1, slots=2, threads=3))
    assert stats["batches"] == stats["pieces"] - stats["missing"] > 10


def test_missing_everything_is_fill(tmp_path):
    import zarr

    arr = zarr.create_array(str(tmp_path / "e.zarr"), shape=(10, 10), chunks=(3, 3), dtype="f4", fill_value=2.5)
    res = read(arr, Ellipsis, device="cpu")
    assert (res.data == 2.5).all() and res.stats["batches"] == 0


def test_read_never_writes(tmp_path):
    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", chunks=(4, 8, 7), shards=(8, 16, 14))
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in (tmp_path / "a.zarr").rglob("*")}
    read(arr, Ellipsis, device="cpu")
    after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in (tmp_path / "a.zarr").rglob("*")}
    assert before == after


def _chunk_file(root, key="c/0/0/0"):
    return root / key


def test_truncated_raw_chunk(tmp_path):
    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="raw")
    f = _chunk_file(tmp_path / "a.zarr")
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(CorruptChunkError, match=r"c/0/0/0.*100 bytes.*truncated"):
        read(arr, Ellipsis, device="cpu")


@pytest.mark.parametrize("damage,match", [
    (lambda b: b[:len(b) // 2], "truncated"),
    (lambda b: b"\x00" * 4 + b[4:], "magic"),
    (lambda b: b + b"junk", "follow the frame"),
    (lambda b: b[:3], "too short"),
])
def test_corrupt_zstd_chunk_named(tmp_path, damage, match):
    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd")
    f = _chunk_file(tmp_path / "a.zarr", "c/1/1/1")
    f.write_bytes(damage(f.read_bytes()))
    with pytest.raises(CorruptChunkError, match=match) as info:
        read(arr, Ellipsis, device="cpu")
    assert "c/1/1/1" in str(info.value)


def test_corrupt_shard_index(tmp_path):
    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", chunks=(4, 8, 7), shards=(8, 16, 14))
    f = _chunk_file(tmp_path / "a.zarr", "c/0/0/0")
    b = bytearray(f.read_bytes())
    b[-10] ^= 0xFF
    f.write_bytes(bytes(b))
    with pytest.raises(CorruptChunkError, match="checksum mismatch"):
        read(arr, Ellipsis, device="cpu")
    f.write_bytes(bytes(b[:20]))
    with pytest.raises(CorruptChunkError, match="truncated"):
        read(arr, Ellipsis, device="cpu")


def test_corrupt_inner_chunk_is_named_by_shard_and_position(tmp_path):
    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", chunks=(4, 8, 7), shards=(8, 16, 14))
    f = _chunk_file(tmp_path / "a.zarr", "c/0/0/0")
    b = bytearray(f.read_bytes())
    b[0:4] = b"\x00\x00\x00\x00"  # the first inner chunk's zstd magic
    f.write_bytes(bytes(b))
    with pytest.raises(CorruptChunkError, match=r"c/0/0/0 inner chunk \(\d+, \d+, \d+\)"):
        read(arr, Ellipsis, device="cpu")


@pytest.mark.parametrize("make", ["blosc-then-zstd", "filters"])
def test_chains_beyond_one_codec_are_read(tmp_path, make):
    """Two compressors, or a v2 filter: the frames and the codecs' own decode (tests/test_chains.py)."""
    import numcodecs
    import zarr
    from zarr.codecs import BloscCodec, ZstdCodec

    p = str(tmp_path / "u.zarr")
    if make == "blosc-then-zstd":
        a = zarr.create_array(p, shape=(4, 4), chunks=(2, 2), dtype="u2", compressors=[BloscCodec(), ZstdCodec()])
    else:
        a = zarr.create_array(p, shape=(4, 4), chunks=(2, 2), dtype="u2", zarr_format=2,
                              filters=[numcodecs.Delta(dtype="u2")])
    a[...] = np.arange(16, dtype="u2").reshape(4, 4) * 3
    np.testing.assert_array_equal(read(zarr.open_array(p, mode="r"), Ellipsis, device="cpu").data, a[...])


@pytest.mark.parametrize("make", ["string"])
def test_unsupported_arrays_say_why(tmp_path, make):
    import numcodecs
    import zarr
    from zarr.codecs import BloscCodec, TransposeCodec, ZstdCodec

    p = str(tmp_path / "u.zarr")
    if make == "blosc-then-zstd":  # Blosc alone is read (tests/test_blosc_engine.py); two compressors are not
        zarr.create_array(p, shape=(4, 4), chunks=(2, 2), dtype="u2", compressors=[BloscCodec(), ZstdCodec()])
    elif make == "transpose":
        zarr.create_array(p, shape=(4, 4), chunks=(2, 2), dtype="u2", filters=[TransposeCodec(order=(1, 0))])
    elif make == "order-F":
        zarr.create_array(p, shape=(4, 4), chunks=(2, 2), dtype="u2", zarr_format=2, order="F")
    elif make == "filters":
        zarr.create_array(p, shape=(4, 4), chunks=(2, 2), dtype="u2", zarr_format=2,
                          filters=[numcodecs.Delta(dtype="u2")])
    else:
        zarr.create_array(p, shape=(4,), chunks=(2,), dtype=str)
    with pytest.raises(UnsupportedArrayError, match="zarr-gpu"):
        read(zarr.open_array(p, mode="r"), Ellipsis, device="cpu")


@pytest.mark.parametrize("fmt,codec", [(2, None), (3, "zstd")])
def test_zero_dimensional_arrays_are_declined_and_read_by_zarr(tmp_path, fmt, codec):
    """A 0-d array (one value) is declined by the engine's layout, so every engine entry point
    refuses it (it was read as the fill value, then crashed the process); the public reads
    serve it through zarr-python."""
    import numcodecs
    import zarr
    from zarr.codecs import ZstdCodec

    from gpu_zarr import kvikio_zarr
    from gpu_zarr.zarr_io import read_zarr

    p = str(tmp_path / "z.zarr")
    comp = None if codec is None else (numcodecs.Zstd(1) if fmt == 2 else [ZstdCodec(level=1)])
    a = zarr.create_array(p, shape=(), chunks=(), dtype="<f4", zarr_format=fmt, compressors=comp, fill_value=0)
    a[...] = 12.5
    arr = zarr.open_array(p, mode="r")
    with pytest.raises(UnsupportedArrayError, match="at least one dimension"):
        read(arr, Ellipsis, device="cpu")
    assert not kvikio_zarr.supports(p)[0]
    res = read_zarr(p, prefer="cpu", progress=False)
    assert res.data.shape == () and res.data == arr[...] == 12.5


def test_bad_selection_errors(tmp_path):
    arr, _ = write(tmp_path / "a.zarr")
    with pytest.raises(IndexError, match="out of bounds"):
        read(arr, (100,), device="cpu")
    with pytest.raises(IndexError, match="too many indices"):
        read(arr, (1, 2, 3, 4), device="cpu")
    with pytest.raises(TypeError, match="basic indexing"):
        read(arr, ([1, 2],), device="cpu")


def test_path_input_is_opened_read_only(tmp_path):
    arr, values = write(tmp_path / "a.zarr", partial=False)
    np.testing.assert_array_equal(read(str(tmp_path / "a.zarr"), Ellipsis, device="cpu").data, values)
    assert os.access(tmp_path / "a.zarr", os.W_OK)  # we did not need to change permissions


# -- read_many: boxes of several arrays of one chunk format, one engine read ------------------
_MANY_OPS = {
    "native": lambda: None,  # the engine's own CPU ops: one native call (chunkwise)
    "twin": lambda: __import__("gpu_zarr.engine.ops", fromlist=["CpuOps"]).CpuOps(),  # batches: the GPU's twin
    "small-read": lambda: __import__("gpu_zarr.engine.ops", fromlist=["CpuOps"]).CpuOps(fast=True),
}


@pytest.mark.parametrize("ops", list(_MANY_OPS))
@pytest.mark.parametrize("name,kw", [LAYOUTS[i] for i in (1, 3, 4, 6, 10, 12, 14, 16)],
                         ids=[LAYOUTS[i][0] for i in (1, 3, 4, 6, 10, 12, 14, 16)])
def test_read_many_places_each_box_like_zarr(tmp_path, name, kw, ops):
    from gpu_zarr.engine import read_many
    from gpu_zarr.engine.metadata import layout_of
    from gpu_zarr.engine.plan import Part

    arrs = [write(tmp_path / f"{i}.zarr", seed=i, **kw)[0] for i in range(3)]  # partial: some chunks missing
    boxes = [((0, 0, 0), (37, 50, 23), (0, 0, 0)),  # a whole array
             ((5, 10, 3), (20, 41, 20), (0, 50, 0)),  # crossing chunk edges
             ((36, 49, 22), (37, 50, 23), (36, 90, 22))]  # one element
    parts = [Part(layout_of(a), start, stop, at) for a, (start, stop, at) in zip(arrs, boxes)]
    res = read_many(parts, (37, 91, 23), device="cpu", ops=_MANY_OPS[ops]())
    want = np.zeros((37, 91, 23), arrs[0].dtype.newbyteorder("="))
    got = res.data
    for a, (start, stop, at) in zip(arrs, boxes):
        box = tuple(slice(o, o + b - s) for s, b, o in zip(start, stop, at))
        want[box] = a[tuple(slice(s, b) for s, b in zip(start, stop))]
        np.testing.assert_array_equal(got[box], want[box])
    assert res.stats["arrays"] == 3 and res.stats["pieces"] > 3
    # into a given output: what no part covers keeps its value
    out = np.full((37, 91, 23), 9, want.dtype)
    read_many(parts, device="cpu", ops=_MANY_OPS[ops](), out=out)
    want[:, :, :] = 9
    for a, (start, stop, at) in zip(arrs, boxes):
        want[tuple(slice(o, o + b - s) for s, b, o in zip(start, stop, at))] = a[
            tuple(slice(s, b) for s, b in zip(start, stop))]
    np.testing.assert_array_equal(out, want)


def test_read_many_refuses_other_formats_and_bad_boxes(tmp_path):
    from gpu_zarr.engine import read_many
    from gpu_zarr.engine.metadata import layout_of
    from gpu_zarr.engine.plan import Part

    a = layout_of(write(tmp_path / "a.zarr", fmt=3, codec="zstd")[0])
    b = layout_of(write(tmp_path / "b.zarr", fmt=3, codec="zstd", chunks=(8, 16, 8))[0])
    c = layout_of(write(tmp_path / "c.zarr", fmt=3, codec="raw")[0])
    whole = ((0, 0, 0), (37, 50, 23))
    for other in (b, c):
        with pytest.raises(UnsupportedArrayError, match="one chunk format"):
            read_many([Part(a, *whole, (0, 0, 0)), Part(other, *whole, (0, 0, 0))], (37, 50, 23), device="cpu")
    with pytest.raises(ValueError, match="does not fit"):
        read_many([Part(a, *whole, (0, 1, 0))], (37, 50, 23), device="cpu")
    with pytest.raises(ValueError, match="does not fit"):
        read_many([Part(a, (0, 0, 0), (38, 50, 23), (0, 0, 0))], (40, 50, 23), device="cpu")
    with pytest.raises(ValueError, match="at least one"):
        read_many([], (1,), device="cpu")


def test_read_many_names_the_array_of_a_corrupt_chunk(tmp_path):
    from gpu_zarr.engine import read_many
    from gpu_zarr.engine.metadata import layout_of
    from gpu_zarr.engine.plan import Part

    arrs = [write(tmp_path / f"{i}.zarr", fmt=3, codec="zstd", seed=i)[0] for i in range(2)]
    f = _chunk_file(tmp_path / "1.zarr", "c/1/1/1")
    f.write_bytes(f.read_bytes()[:5])
    parts = [Part(layout_of(a), (0, 0, 0), (37, 50, 23), (0, 50 * i, 0)) for i, a in enumerate(arrs)]
    with pytest.raises(CorruptChunkError, match=r"c/1/1/1 of .*1\.zarr"):
        read_many(parts, (37, 100, 23), device="cpu")


@pytest.mark.parametrize("sel", [(3,), (slice(2, 9), 5), (slice(None, None, -3), slice(1, 20), 4), Ellipsis])
def test_read_places_into_the_box_it_is_given(tmp_path, sel):
    """``out=``: the selection's box lands in the caller's buffer (page-locked staging on the
    GPU's small reads); a plane of a box is a view of it, a stepped selection a copy."""
    from gpu_zarr.engine.plan import normalize_selection

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", chunks=(4, 8, 7), shards=(8, 16, 14))
    region = normalize_selection(arr.shape, sel)
    out = np.full(region.box_shape, 77, arr.dtype.newbyteorder("="))
    got = read(arr, sel, device="cpu", out=out).data
    np.testing.assert_array_equal(got, _expect(arr, sel))
    steps = isinstance(sel, tuple) and any(isinstance(s, slice) and s.step not in (None, 1) for s in sel)
    assert np.shares_memory(got, out) != steps
    np.testing.assert_array_equal(out[region.post], _expect(arr, sel))


def test_read_refuses_an_out_that_is_not_the_box(tmp_path):
    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", chunks=(4, 8, 7))
    for bad in (np.empty((1, 5, 5), arr.dtype), np.empty((1,) + arr.shape[1:], "f8"),
                np.empty((1, arr.shape[1], 2 * arr.shape[2]), arr.dtype)[:, :, ::2]):
        with pytest.raises(ValueError, match="out must be a C-contiguous"):
            read(arr, (3,), device="cpu", out=bad)
