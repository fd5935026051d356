"""Chains beyond one core codec over http (a loopback RangeServer): frames, the codecs' own decode,
nested shards, through the remote stream (CPU) and remote groups (GPU) paths, against zarr's read."""

from __future__ import annotations

import numpy as np
import pytest

from chains import CHAINS

pytest.importorskip("obstore")

from gpu_zarr.bench.remote_server import RangeServer  # noqa: E402
from gpu_zarr.engine import read as engine_read  # noqa: E402
from gpu_zarr.store import open_array  # noqa: E402

NAMES = ["v3-shard-zstd-crc32c", "v3-raw-crc32c", "v3-shard-delta-crc32c", "v2-delta-zstd", "v2-lz4",
         "v3-numcodecs-blosc-crc32c", "v3-nested-shards", "v3-shard-zstd-bigendian-index",
         "v2-fixedscaleoffset-blosc", "v2-astype-u2-i4-raw", "v3-astype-crc32c"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote-chains")
    want = {name: dict(CHAINS)[name](root / f"{name}.zarr")[0][...] for name in NAMES}
    with RangeServer(root, latency=0.001) as srv:
        yield srv, want


@pytest.mark.parametrize("name", NAMES)
def test_remote_chain_cpu(served, name):
    srv, want = served
    arr = open_array(f"{srv.url}/{name}.zarr")
    np.testing.assert_array_equal(engine_read(arr, device="cpu").data, want[name])
    sel = (slice(3, 30, 2), 7, slice(None))
    np.testing.assert_array_equal(engine_read(arr, sel, device="cpu").data, want[name][sel])


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_remote_chain_gpu(served, name):
    import cupy

    srv, want = served
    arr = open_array(f"{srv.url}/{name}.zarr")
    got = engine_read(arr, device="gpu").data
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(got), want[name])
