"""gpu_zarr.to_dask on the CPU: a 2-worker LocalCluster (processes) against zarr's own read.

Every store of the test corpus (tests/stores.py LAYOUTS, numcodecs Blosc v2 stores, OME-Zarr
0.4 and 0.5 pyramids) is computed on the cluster and compared with zarr-python's read.
"""

from __future__ import annotations

import io
import logging
import pickle

import numcodecs
import numpy as np
import pytest
import zarr

import gpu_zarr
from gpu_zarr import dask_array
from gpu_zarr.dask_array import block_shape, to_dask
from gpu_zarr.errors import NotAZarrError
from gpu_zarr.sample import write_sample_omezarr
from stores import CHUNKS, LAYOUTS, SHAPE, data, write

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

# small blocks, so that every store gives several blocks with edges (the 85 KB test arrays
# would otherwise be one block)
SMALL = "16KiB"


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


def _zarr_read(path) -> np.ndarray:
    a = np.asarray(zarr.open_array(str(path), mode="r")[...])
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def _blosc_v2(path, cname, shuffle):
    comp = numcodecs.Blosc(cname=cname, clevel=5, shuffle=shuffle)
    arr = zarr.create_array(str(path), shape=SHAPE, chunks=CHUNKS, dtype="<u2", zarr_format=2,
                            compressors=comp, fill_value=0)
    arr[: SHAPE[0] - 5] = data(SHAPE, "<u2")[: SHAPE[0] - 5]


BLOSC = [("v2-blosc-lz4-shuffle", "lz4", numcodecs.Blosc.SHUFFLE),
         ("v2-blosc-zstd-bitshuffle", "zstd", numcodecs.Blosc.BITSHUFFLE)]


@pytest.mark.parametrize("name,kw", LAYOUTS, ids=[n for n, _ in LAYOUTS])
def test_corpus_equals_zarr(client, tmp_path, name, kw):
    write(tmp_path / "a.zarr", **kw)
    x = to_dask(str(tmp_path / "a.zarr"), chunks=SMALL)
    assert x.npartitions > 1
    got = x.compute()
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, _zarr_read(tmp_path / "a.zarr"))


@pytest.mark.parametrize("name,cname,shuffle", BLOSC, ids=[b[0] for b in BLOSC])
def test_blosc_equals_zarr(client, tmp_path, name, cname, shuffle):
    _blosc_v2(tmp_path / "b.zarr", cname, shuffle)
    x = to_dask(tmp_path / "b.zarr", chunks=SMALL)
    np.testing.assert_array_equal(x.compute(), _zarr_read(tmp_path / "b.zarr"))
    # a reduction on the workers, and a region
    ref = _zarr_read(tmp_path / "b.zarr")
    assert int(x.astype("u8").sum().compute()) == int(ref.astype("u8").sum())
    np.testing.assert_array_equal(x[5:30:3, 7, ::-2].compute(), ref[5:30:3, 7, ::-2])


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_omezarr_levels(client, tmp_path, version):
    p = write_sample_omezarr(tmp_path / "img.ome.zarr", version=version, shape=(2, 12, 96, 80),
                             levels=3, chunks=(1, 4, 32, 32), labels=False)
    levels = to_dask(p, chunks=SMALL)
    assert isinstance(levels, list) and len(levels) == 3
    for i, x in enumerate(levels):
        np.testing.assert_array_equal(x.compute(), _zarr_read(p / str(i)))
    one = to_dask(p, level=-1)
    assert one.shape == levels[2].shape
    np.testing.assert_array_equal(one.compute(), _zarr_read(p / "2"))
    with pytest.raises(IndexError, match="level 3 does not exist"):
        to_dask(p, level=3)


def test_zarr_array_input_and_default_blocks(client, tmp_path):
    arr, values = write(tmp_path / "a.zarr", fmt=3, codec="zstd", partial=False)
    x = to_dask(arr)  # an opened zarr.Array (local store): reopened by path on the workers
    assert x.chunks == tuple((s,) for s in SHAPE)  # 85 KB: one block by the default rule
    np.testing.assert_array_equal(x.compute(), values)


def test_graph_is_picklable_without_handles(tmp_path):
    write(tmp_path / "a.zarr", fmt=3, codec="zstd", chunks=(4, 8, 7), shards=(8, 16, 14))
    path = str(tmp_path / "a.zarr")
    x = to_dask(path, chunks=SMALL)
    graph = dict(x.__dask_graph__())
    blob = pickle.dumps(graph)  # plain pickle: no lambdas, no closures
    classes: set[tuple[str, str]] = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module, name):
            classes.add((module, name))
            return super().find_class(module, name)

    back = Recorder(io.BytesIO(blob)).load()
    assert back.keys() == graph.keys()
    # only our reader and its description travel: no zarr array, store, codec, cupy object
    assert {m for m, _ in classes} <= {"gpu_zarr.dask_array", "builtins", "dask._task_spec"}, classes
    assert ("gpu_zarr.dask_array", "read_block") in classes
    sources = {a for v in graph.values() for a in _walk(v) if isinstance(a, dask_array.ArraySource)}
    assert sources == {dask_array.ArraySource(path, None, SHAPE, "<u2", dask_array._stamp(path))}
    assert len(graph) == x.npartitions > 1


def _walk(v):
    """Every argument of a task (legacy tuple or dask Task)."""
    if isinstance(v, tuple):
        for a in v:
            yield from _walk(a)
    elif hasattr(v, "args") and hasattr(v, "func"):
        for a in v.args:
            yield from _walk(getattr(a, "value", a))
    else:
        yield v


def test_each_worker_opens_each_array_once(client, tmp_path):
    write(tmp_path / "a.zarr", fmt=2, codec="zstd", partial=False)
    path = str(tmp_path / "a.zarr")
    x = to_dask(path, chunks="4KiB")
    n = x.npartitions
    assert n >= 12
    client.run(dask_array.clear_cache)
    np.testing.assert_array_equal(x.compute(), _zarr_read(path))
    np.testing.assert_array_equal((x + 1).compute(), _zarr_read(path) + 1)  # second pass: no new open
    info = client.run(dask_array.cache_info)
    assert len({i["pid"] for i in info.values()}) == 2
    opens = [i["opens"].get(path, 0) for i in info.values()]
    reads = [i["reads"].get(path, 0) for i in info.values()]
    assert sum(reads) == 2 * n
    assert all(o == (1 if r else 0) for o, r in zip(opens, reads)), (opens, reads)


def test_persist_and_reduce_on_workers(client, tmp_path):
    write(tmp_path / "a.zarr", fmt=3, codec="zstd", chunks=(4, 8, 7), shards=(8, 16, 14), partial=False)
    path = str(tmp_path / "a.zarr")
    x = to_dask(path, chunks=SMALL).persist()
    distributed.wait(x)
    ref = _zarr_read(path)
    who = client.who_has(x)
    assert all(who.values())
    assert float(x.mean().compute()) == pytest.approx(float(ref.mean()))
    assert int(x.max().compute()) == int(ref.max())


def test_block_rule():
    # the 16 GiB benchmark volume, zstd 1x512x1024 chunks: 64 whole planes per 512 MiB block
    assert block_shape((2048, 2048, 2048), (1, 512, 1024), 2, 512 << 20) == (64, 2048, 2048)
    # shards are the unit; blocks never split them
    assert block_shape((512, 2048, 2048), (16, 1024, 2048), 2, 512 << 20) == (64, 2048, 2048)
    # a unit bigger than the target stays one unit
    assert block_shape((100, 4096, 4096), (4, 4096, 4096), 2, 64 << 20) == (4, 4096, 4096)
    # a small array is one block
    assert block_shape(SHAPE, CHUNKS, 2, 512 << 20) == SHAPE
    # partial fill of the last axis
    assert block_shape((10, 10, 1000), (1, 1, 100), 1, 350) == (1, 1, 300)


def test_default_block_size_and_alignment(tmp_path):
    arr = zarr.create_array(str(tmp_path / "big.zarr"), shape=(40, 1024, 1024), chunks=(1, 512, 1024),
                            dtype="u2", zarr_format=3, fill_value=0)  # nothing written: metadata only
    x = to_dask(arr)  # CPU client: numpy blocks, 128 MiB target
    assert x.chunks[1:] == ((1024,), (1024,)) and x.chunks[0] == (40,)
    y = to_dask(arr, chunks="8MiB")
    assert y.chunksize == (4, 1024, 1024)
    z = to_dask(arr, chunks=(3, 512, 512))
    assert z.chunksize == (3, 512, 512)
    assert isinstance(x._meta, np.ndarray) and "chunktype=numpy.ndarray" in repr(x)


def test_cpu_client_says_so_once(tmp_path, caplog):
    write(tmp_path / "a.zarr", fmt=3, codec="raw")
    dask_array.worker_state().said_cpu = False
    with caplog.at_level(logging.WARNING, logger="gpu_zarr.dask"):
        to_dask(str(tmp_path / "a.zarr"))
        to_dask(str(tmp_path / "a.zarr"))
    if gpu_zarr.probe().gpu:
        pytest.skip("this machine has a GPU")
    msgs = [r.getMessage() for r in caplog.records if "no usable GPU" in r.getMessage()]
    assert len(msgs) == 1 and "numpy" in msgs[0]


def test_threaded_scheduler_without_cluster(tmp_path):
    _, values = write(tmp_path / "a.zarr", fmt=3, codec="zstd", partial=False)
    x = to_dask(str(tmp_path / "a.zarr"), chunks=SMALL, backend="cpu")
    np.testing.assert_array_equal(x.compute(scheduler="threads"), values)
    assert isinstance(x, da.Array)


def test_bad_input(tmp_path):
    with pytest.raises(NotAZarrError, match="does not exist"):
        to_dask(tmp_path / "missing.zarr")
    write(tmp_path / "a.zarr")
    with pytest.raises(ValueError, match="plain zarr array"):
        to_dask(tmp_path / "a.zarr", level=1)
    with pytest.raises(ValueError, match="backend must be one of"):
        to_dask(tmp_path / "a.zarr", backend="gpu")
    mem = zarr.create_array(zarr.storage.MemoryStore(), shape=(4,), chunks=(2,), dtype="u1")
    with pytest.raises(NotAZarrError, match="MemoryStore"):
        to_dask(mem)
    zarr.open_group(str(tmp_path / "g.zarr"), mode="w").create_array("x", shape=(2,), dtype="u1")
    with pytest.raises(NotAZarrError, match="multiscales"):
        to_dask(tmp_path / "g.zarr")


def test_changed_store_is_reported(tmp_path):
    write(tmp_path / "a.zarr", fmt=3)
    x = to_dask(str(tmp_path / "a.zarr"), backend="cpu")
    write(tmp_path / "a.zarr", fmt=3, shape=(5, 5, 5), chunks=(5, 5, 5))
    dask_array.clear_cache()
    with pytest.raises(gpu_zarr.errors.GpuZarrError, match="changed since the dask graph was built"):
        x.compute(scheduler="sync")
