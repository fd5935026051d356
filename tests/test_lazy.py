"""GpuLazyArray: numpy basic-indexing semantics on real zarr v2/v3 stores, against zarr's CPU read."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from gpu_zarr.errors import GPUUnavailable
from gpu_zarr.lazy import GpuLazyArray, normalize_key

SHAPE = (2, 11, 13, 7)


@pytest.fixture(params=[2, 3], ids=["zarr-v2", "zarr-v3"])
def zarray(request, tmp_path):
    """A compressed uint16 array with edge chunks, written by zarr-python, reopened read-only."""
    fmt = request.param
    rng = np.random.default_rng(fmt)
    data = rng.integers(0, 60000, SHAPE, dtype=np.uint16)
    path = tmp_path / f"a{fmt}.zarr"
    a = zarr.create_array(str(path), shape=SHAPE, chunks=(1, 4, 5, 3), dtype="uint16",
                          zarr_format=fmt, fill_value=0)
    a[...] = data
    return zarr.open_array(str(path), mode="r"), data


BASIC_KEYS = [
    0, -1, 1, (1, 5), (0, slice(3, 10)), (Ellipsis, 4), (slice(None, None, 3),),
    (1, slice(2, 9, 2), slice(None), -2), Ellipsis, (), (slice(40, 50),),
    (0, 5, 7, 3), (-2, -11, -13, -7), (slice(-5, None), Ellipsis, slice(1, -1)),
    (np.int64(1), np.int32(3)), (0, slice(3, 3)),
]
NEGATIVE_STEP_KEYS = [
    (slice(None, None, -1),), (1, slice(10, 1, -3), slice(None), 3),
    (Ellipsis, slice(None, None, -2)), (0, slice(2, 8, -1)), (slice(None), slice(None, None, -4), 0, slice(5, 0, -2)),
]


@pytest.mark.parametrize("key", BASIC_KEYS, ids=repr)
def test_basic_indexing_matches_zarr(zarray, key):
    arr, data = zarray
    lazy = GpuLazyArray(arr, backend="cpu")
    got = lazy[key]
    want = arr[key]
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, data[key])


@pytest.mark.parametrize("key", NEGATIVE_STEP_KEYS, ids=repr)
def test_negative_steps_follow_numpy(zarray, key):
    # zarr itself refuses negative steps; numpy semantics are the reference.
    arr, data = zarray
    got = GpuLazyArray(arr, backend="cpu")[key]
    want = data[key]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_array_protocol(zarray):
    arr, data = zarray
    lazy = GpuLazyArray(arr)
    assert lazy.shape == arr.shape and lazy.dtype == arr.dtype
    assert lazy.ndim == 4 and lazy.size == data.size and len(lazy) == 2
    assert lazy.nbytes == data.nbytes
    np.testing.assert_array_equal(np.asarray(lazy), data)
    assert np.asarray(lazy, dtype=np.float32).dtype == np.float32
    assert "GpuLazyArray" in repr(lazy)


def test_channel_view(zarray):
    arr, data = zarray
    lazy = GpuLazyArray(arr, backend="cpu")
    view = lazy.index_axis(0, -1)
    assert view.shape == SHAPE[1:] and view.ndim == 3
    for key in [(4,), (slice(None, None, 2), 3), (Ellipsis, slice(None, None, -1)), (), (-1, -1, -1)]:
        np.testing.assert_array_equal(view[key], data[1][key])
    inner = view.index_axis(1, 2)  # fix y on top of c
    np.testing.assert_array_equal(inner[3], data[1, 3, 2])
    assert view.backend == "cpu"
    view.backend = "auto"  # shared with the parent level
    assert lazy.backend == "auto"
    with pytest.raises(IndexError, match="out of bounds"):
        lazy.index_axis(0, 2)


def test_fancy_keys_fall_back_to_zarr(zarray):
    arr, data = zarray
    lazy = GpuLazyArray(arr, backend="cpu")
    np.testing.assert_array_equal(lazy[[0, 1], 3], arr[[0, 1], 3])
    with pytest.raises(IndexError, match="basic indexing"):
        lazy.index_axis(0, 0)[[1, 2]]


@pytest.mark.parametrize(
    ("key", "match"),
    [((2,), "out of bounds for axis 0"), ((0, -12), "out of bounds for axis 1"),
     ((0, 0, 0, 0, 0), "too many indices"), ((Ellipsis, 0, Ellipsis), "single ellipsis")],
)
def test_index_errors_like_numpy(zarray, key, match):
    arr, data = zarray
    with pytest.raises(IndexError, match=match):
        GpuLazyArray(arr, backend="cpu")[key]
    with pytest.raises(IndexError):
        data[key]


def test_normalize_key():
    assert normalize_key((Ellipsis, -1), (3, 4)) == (slice(0, 3, 1), 3)
    assert normalize_key(slice(None, None, -1), (3,)) == (slice(2, -1, -1),)
    assert normalize_key(([0, 1],), (3,)) is None
    assert normalize_key((None,), (3,)) is None


def test_bad_inputs(zarray):
    arr, _ = zarray
    with pytest.raises(ValueError, match="backend must be one of"):
        GpuLazyArray(arr, backend="gds")
    with pytest.raises(TypeError, match="expected a zarr.Array"):
        GpuLazyArray(np.zeros(3))


def _has_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no cupy, no driver, no device
        return False


def test_cpu_backend_has_no_gpu_tiles(zarray):
    arr, _ = zarray
    lazy = GpuLazyArray(arr, backend="cpu")
    with pytest.raises(GPUUnavailable, match="GPU"):
        lazy.get_gpu((0, 1))
    with pytest.raises(GPUUnavailable, match="GPU-resident mode needs a GPU backend"):
        lazy.load_resident()
    assert not lazy.is_resident


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs cupy and a CUDA device")
@pytest.mark.parametrize("backend", ["auto", "zarr-gpu", "kvikio"])
def test_gpu_tiles(zarray, backend):
    import cupy

    arr, data = zarray
    lazy = GpuLazyArray(arr, backend=backend)
    if backend == "kvikio":  # the direct engine may not serve this machine or codec
        from gpu_zarr.errors import BackendUnavailable

        try:
            choice = lazy.backend_choice()
        except BackendUnavailable as exc:
            pytest.skip(f"kvikio does not serve this array here: {exc}")
        assert choice.backend == "kvikio"
    tile = lazy.get_gpu((1, slice(2, 9), Ellipsis))
    assert isinstance(tile, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(tile), data[1, 2:9])
    for key in BASIC_KEYS + NEGATIVE_STEP_KEYS:
        got = lazy[key]
        assert isinstance(got, np.ndarray)
        np.testing.assert_array_equal(got, data[key])


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs cupy and a CUDA device")
def test_gpu_resident_mode(zarray):
    import cupy

    arr, data = zarray
    lazy = GpuLazyArray(arr, backend="auto")
    view = lazy.index_axis(0, 1)
    res = view.load_resident()
    assert res.backend in ("kvikio", "zarr-gpu") and res.nbytes == data.nbytes
    assert lazy.is_resident and view.is_resident and lazy.resident_bytes == data.nbytes
    for key in BASIC_KEYS + NEGATIVE_STEP_KEYS:
        np.testing.assert_array_equal(lazy[key], data[key])
    np.testing.assert_array_equal(view[5], data[1, 5])
    assert isinstance(view.get_gpu(5), cupy.ndarray)
    lazy.release_resident()
    assert not view.is_resident and lazy.resident_bytes == 0
    np.testing.assert_array_equal(view[5], data[1, 5])


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs cupy and a CUDA device")
def test_resident_refuses_what_does_not_fit(tmp_path):
    import cupy

    from gpu_zarr.errors import OutOfGPUMemory

    free, total = cupy.cuda.runtime.memGetInfo()
    n = int(total // 8 * 2)  # float64 elements: 2x the whole device; metadata only, no chunks
    arr = zarr.create_array(str(tmp_path / "big.zarr"), shape=(n,), chunks=(2**26,), dtype="f8")
    lazy = GpuLazyArray(zarr.open_array(str(tmp_path / "big.zarr"), mode="r"))
    with pytest.raises(OutOfGPUMemory, match="GiB of GPU memory for the result plus"):
        lazy.load_resident()
    assert not lazy.is_resident and arr.nchunks > 0


def test_chunks_follow_the_view_and_the_inner_chunks_of_shards(zarray, tmp_path):
    """napari 0.9's multiscale slicing widens what it asks for to whole chunks of ``data.chunks``."""
    arr, _ = zarray
    lazy = GpuLazyArray(arr, backend="cpu")
    assert lazy.chunks == (1, 4, 5, 3)
    assert lazy.index_axis(0, 1).chunks == (4, 5, 3)
    assert lazy.index_axis(0, 1).index_axis(1, 0).chunks == (4, 3)
    sharded = zarr.create_array(str(tmp_path / "s.zarr"), shape=(8, 64, 64), chunks=(1, 16, 16), shards=(2, 32, 32),
                                dtype="uint8")
    assert GpuLazyArray(zarr.open_array(str(tmp_path / "s.zarr"), mode="r"), backend="cpu").chunks == (1, 16, 16)
    assert sharded.chunks == (1, 16, 16)
