"""Planning and batching (pure: no I/O, no GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_zarr.engine.plan import make_batches, normalize_selection


@pytest.mark.parametrize("batch_bytes", [1, 100, 1000, 10**6])
def test_batches_cover_every_present_piece_once_with_contiguous_runs(batch_bytes):
    rng = np.random.default_rng(0)
    n = 200
    file_id = rng.integers(0, 5, n)
    nbytes = rng.integers(1, 90, n)
    nbytes[rng.random(n) < 0.1] = -1  # missing pieces
    offset = np.zeros(n, np.int64)
    for f in range(5):  # pieces of one file packed back to back, like a shard
        m = np.flatnonzero(file_id == f)
        sizes = np.maximum(nbytes[m], 0)
        offset[m] = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        offset[m[rng.random(len(m)) < 0.2]] += 7  # some gaps break runs
    batches = make_batches(file_id, offset, nbytes, decoded_nbytes=50, batch_bytes=batch_bytes)
    seen = np.concatenate([b.pieces for b in batches])
    assert sorted(seen.tolist()) == sorted(np.flatnonzero(nbytes >= 0).tolist())
    for b in batches:
        assert len(b.pieces) == 1 or b.staging_bytes <= batch_bytes
        assert len(b.pieces) <= max(1, batch_bytes // 50)
        assert b.runs[0, 0] == 0 and b.runs[-1, 1] == len(b.pieces)
        for a, e in b.runs.tolist():
            assert b.src_offsets[a] % 16 == 0
            for k in range(a + 1, e):  # a run mirrors the file: contiguous in staging
                assert b.file_id[k] == b.file_id[a]
                assert b.file_offset[k] == b.file_offset[k - 1] + b.src_sizes[k - 1]
                assert b.src_offsets[k] == b.src_offsets[k - 1] + b.src_sizes[k - 1]
        ends = b.src_offsets + b.src_sizes
        assert np.all(b.src_offsets[1:] >= ends[:-1]) and ends.max() == b.staging_bytes


@pytest.mark.parametrize("sel", [Ellipsis, 3, -1, slice(None, None, -1), (slice(2, 9, 3), 4), (Ellipsis, 0),
                                 (slice(8, 2, -2), slice(None)), (slice(100, 200),), (3,), (-2, 5), (), (4, -6),
                                 (np.int64(2),), (True,)])
def test_normalize_selection_matches_numpy(sel):
    a = np.arange(10 * 6).reshape(10, 6)
    if sel == (True,):  # a boolean is not an integer index here (numpy would add an axis)
        with pytest.raises(TypeError, match="only integers, slices and Ellipsis"):
            normalize_selection(a.shape, sel)
        return
    r = normalize_selection(a.shape, sel)
    box = a[tuple(slice(x, y) for x, y in zip(r.start, r.stop))]
    assert np.array_equal(box[r.post], a[sel])
    assert a[sel].shape == r.out_shape


@pytest.mark.parametrize("sel", [(10,), (-11,), (0, 6), (1, 2, 3)])
def test_integer_selections_out_of_range_say_so(sel):
    """A plane's integers take a shorter path; out of range, or too many, they still fail as numpy's do."""
    with pytest.raises(IndexError, match="out of bounds|too many indices"):
        normalize_selection((10, 6), sel)


def test_small_plans_in_plain_python_equal_numpys(monkeypatch):
    """plan_pieces works in plain Python up to SMALL_PLAN pieces (a viewer's plane: faster
    than two dozen numpy calls) and with numpy above: both give the same pieces, every
    dimensionality, ragged edges, empty boxes."""
    from types import SimpleNamespace

    import gpu_zarr.engine.plan as plan

    rng = np.random.default_rng(7)
    for _ in range(500):
        nd = int(rng.integers(0, 5))
        shape = tuple(int(x) for x in rng.integers(1, 40, nd))
        lay = SimpleNamespace(ndim=nd, inner_shape=tuple(int(x) for x in rng.integers(1, 16, nd)))
        start = tuple(int(rng.integers(0, s)) for s in shape)
        stop = tuple(int(rng.integers(a, s + 1)) for a, s in zip(start, shape))
        monkeypatch.setattr(plan, "SMALL_PLAN", 10**9)
        small = plan.plan_pieces(lay, start, stop)
        monkeypatch.setattr(plan, "SMALL_PLAN", -1)
        big = plan.plan_pieces(lay, start, stop)
        # (the small plan's keys come from Python ints, its arrays when first asked for)
        assert len(small) == len(big) and small.cells == [tuple(c) for c in big.coords.tolist()]
        for a, b in ((small.coords, big.coords), (small.table, big.table)):
            assert a.dtype == b.dtype == np.int64 and a.shape == b.shape
            np.testing.assert_array_equal(a, b)


def test_chunk_keys_of_a_0d_array_are_zarrs():
    from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding, V2ChunkKeyEncoding

    from gpu_zarr.engine.layout import ChunkKeys

    assert ChunkKeys("c", "/")(()) == DefaultChunkKeyEncoding(separator="/").encode_chunk_key(())
    assert ChunkKeys("", ".")(()) == V2ChunkKeyEncoding(separator=".").encode_chunk_key(())


@pytest.mark.parametrize("shape", [(5,), (6, 7, 8)])
@pytest.mark.parametrize("fmt,encoding", [(2, "."), (2, "/"), (3, ("default", "/")), (3, ("default", ".")),
                                          (3, ("v2", ".")), (3, ("v2", "/"))])
def test_chunk_keys_are_zarrs(tmp_path, shape, fmt, encoding):
    """The layout names chunks as plain data (prefix, separator), exactly as zarr's own encoder."""
    import zarr

    from gpu_zarr.engine.metadata import layout_of

    kw: dict = {"dimension_separator": encoding} if fmt == 2 else {
        "chunk_key_encoding": {"name": encoding[0], "separator": encoding[1]}}
    if fmt == 2:
        a = zarr.open_array(str(tmp_path / "a.zarr"), mode="w", shape=shape, chunks=tuple(max(1, s // 2) for s in shape),
                            dtype="<u2", zarr_format=2, **kw)
    else:
        a = zarr.create_array(str(tmp_path / "a.zarr"), shape=shape, chunks=tuple(max(1, s // 2) for s in shape),
                              dtype="<u2", **kw)
    keys = layout_of(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")).chunk_key
    for coords in [tuple(0 for _ in shape), tuple(range(1, len(shape) + 1)), tuple(9 for _ in shape)]:
        assert keys(coords) == a.metadata.encode_chunk_key(coords)
