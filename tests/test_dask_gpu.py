"""gpu_zarr.to_dask on GPUs: one GPU in-process, and dask-cuda's LocalCUDACluster (one worker per GPU).

The CPU twin of every check here is in test_dask_array.py (a 2-worker LocalCluster).
"""

from __future__ import annotations

import os

import numcodecs
import numpy as np
import pytest
import zarr

pytest.importorskip("dask.array")
pytest.importorskip("distributed")

import dask

from gpu_zarr.dask_array import to_dask
from gpu_zarr.sample import write_sample_omezarr
from stores import write

pytestmark = pytest.mark.gpu


def _ref(path) -> np.ndarray:
    a = np.asarray(zarr.open_array(str(path), mode="r")[...])
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def _host(x) -> np.ndarray:
    return x.get() if hasattr(x, "get") else np.asarray(x)


def _block_info(b) -> tuple[str, str, str, int]:
    """Type of a block, and which physical GPU the worker holding it uses."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    bus = cupy.cuda.Device(dev).pci_bus_id
    kind = "cupy.ndarray" if isinstance(b, cupy.ndarray) else type(b).__module__ + "." + type(b).__name__
    return (kind, bus, os.environ.get("CUDA_VISIBLE_DEVICES", ""), dev)


def _worker_gpu() -> tuple[str, int, str]:
    import cupy

    from gpu_zarr.capabilities import probe

    assert probe().gpu
    dev = cupy.cuda.runtime.getDevice()
    return os.environ.get("CUDA_VISIBLE_DEVICES", ""), dev, cupy.cuda.Device(dev).pci_bus_id


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("dask-gpu")
    out = {}
    for name, kw in [("v3-zstd", {"fmt": 3, "codec": "zstd", "shape": (64, 96, 80), "chunks": (8, 32, 40)}),
                     ("v2-zstd", {"fmt": 2, "codec": "zstd", "shape": (40, 50, 23), "chunks": (8, 16, 7)}),
                     ("v3-shard", {"fmt": 3, "codec": "zstd", "shape": (37, 50, 23), "chunks": (4, 8, 7),
                                       "shards": (8, 16, 14)}),
                     ("v3-raw", {"fmt": 3, "codec": "raw", "shape": (37, 50, 23), "chunks": (8, 16, 7)})]:
        write(base / f"{name}.zarr", **kw)
        out[name] = base / f"{name}.zarr"
    b = zarr.create_array(str(base / "blosc.zarr"), shape=(40, 64, 48), chunks=(8, 32, 16), dtype="<u2",
                          zarr_format=2, compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE))
    b[...] = np.random.default_rng(1).integers(0, 4000, (40, 64, 48), dtype=np.uint16)
    out["v2-blosc"] = base / "blosc.zarr"
    out["ome"] = write_sample_omezarr(base / "img.ome.zarr", shape=(2, 16, 128, 96), levels=3,
                                      chunks=(1, 8, 64, 64), labels=False)
    return out


def test_one_gpu_in_process(stores):
    import cupy

    x = to_dask(stores["v3-zstd"], chunks="64KiB")
    assert isinstance(x._meta, cupy.ndarray) and "chunktype=cupy.ndarray" in repr(x)
    assert x.npartitions > 1
    got = x.compute(scheduler="threads")
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(got.get(), _ref(stores["v3-zstd"]))
    kinds = dask.compute(*[dask.delayed(_block_info)(b) for b in x.to_delayed().ravel()], scheduler="sync")
    assert {k[0] for k in kinds} == {"cupy.ndarray"}


@pytest.fixture(scope="module")
def cuda_client():
    """One worker per GPU (up to 2): dask-cuda's LocalCUDACluster, or, where dask-cuda cannot
    start, the same layout by hand (one Nanny per GPU with CUDA_VISIBLE_DEVICES), as the benchmark does."""
    import sys
    from pathlib import Path

    import cupy
    from distributed import Client

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_dask

    n = min(2, cupy.cuda.runtime.getDeviceCount())
    cluster, kind = bench_dask.make_cluster(n, cpu=False)
    print(f"cluster: {kind}, {n} worker(s)")
    with cluster, Client(cluster) as client:
        client.wait_for_workers(n)
        yield client, n


def test_dask_cuda_imports():
    pytest.importorskip("dask_cuda")
    from dask_cuda import LocalCUDACluster  # noqa: F401  (fails here if cuda-core is too old)


def test_workers_each_use_their_own_gpu(cuda_client):
    client, n = cuda_client
    info = list(client.run(_worker_gpu).values())
    assert len(info) == n
    assert all(dev == 0 for _, dev, _ in info), info  # relative device 0 ...
    assert len({bus for _, _, bus in info}) == n, info  # ... a different physical GPU each
    assert len({vis.split(",")[0] for vis, _, _ in info}) == n, info


@pytest.mark.parametrize("name", ["v3-zstd", "v2-zstd", "v3-shard", "v3-raw", "v2-blosc"])
def test_cluster_compute_equals_zarr(cuda_client, stores, name):
    _client, _n = cuda_client
    x = to_dask(stores[name], chunks="16KiB")
    assert x.npartitions > 1
    np.testing.assert_array_equal(_host(x.compute()), _ref(stores[name]))


def test_cluster_omezarr_levels(cuda_client, stores):
    levels = to_dask(stores["ome"], chunks="64KiB")
    assert len(levels) == 3
    for i, x in enumerate(levels):
        np.testing.assert_array_equal(_host(x.compute()), _ref(stores["ome"] / str(i)))


def test_persist_and_reduce_on_the_workers(cuda_client, stores):
    from distributed import wait

    client, n = cuda_client
    path = stores["v3-zstd"]
    x = to_dask(path, chunks="32KiB").persist()
    wait(x)
    ref = _ref(path)
    infos = client.compute([dask.delayed(_block_info)(b) for b in x.to_delayed().ravel()], sync=True)
    assert {k[0] for k in infos} == {"cupy.ndarray"}, infos
    assert {k[3] for k in infos} == {0}
    if n > 1:
        assert len({k[1] for k in infos}) == n, "blocks persisted on only one GPU"
    total = x.astype("u8").sum().compute()
    assert int(total) == int(ref.astype("u8").sum())
    assert float(x.mean().compute()) == pytest.approx(float(ref.mean()))
