"""``storage_options`` is an explicit keyword everywhere a store is named, and what a call opens
below the store (levels, labels, wells, dask workers in other processes) uses the same options.

The options under test are HTTP headers: the loopback server records every request's headers,
so a request sent without the caller's options is seen (nothing is remembered between calls).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import zarr

pytest.importorskip("obstore")

from gpu_zarr.bench.remote_server import RangeServer  # noqa: E402
from gpu_zarr.engine.runtime import get_runtime  # noqa: E402
from gpu_zarr.engine.sources.remote import byte_cache  # noqa: E402

SECRET = "s3cr3t-t0ken"
OPTS = {"headers": {"X-Gpu-Zarr-Token": SECRET}}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    from gpu_zarr.sample import write_sample_omezarr

    root = tmp_path_factory.mktemp("opts")
    write_sample_omezarr(root / "img.ome.zarr", version="0.5", shape=(2, 4, 64, 64), levels=2,
                         compressor="zstd", chunks=(1, 2, 32, 32))
    a = zarr.create_array(root / "plain.zarr", shape=(8, 40, 30), chunks=(2, 16, 16), dtype="<u2",
                          compressors=zarr.codecs.ZstdCodec(), fill_value=0)
    a[:] = np.arange(8 * 40 * 30, dtype="<u2").reshape(8, 40, 30)
    return root


@pytest.fixture
def server(stores):
    byte_cache(get_runtime()).clear()
    get_runtime().clear_caches()
    with RangeServer(stores) as srv:
        yield srv
    byte_cache(get_runtime()).clear()


def _settle(srv: RangeServer) -> None:
    """Until nothing is in flight at the server and no new request came for 0.2 s."""
    import time

    n, t = -1, time.monotonic()
    while (n != len(srv.log) or srv.in_flight) and time.monotonic() - t < 10:
        n = len(srv.log)
        time.sleep(0.2)


def _all_carry_options(srv: RangeServer) -> None:
    assert srv.log, "no request reached the server"
    missing = [e["path"] for e in srv.log if e["headers"].get("x-gpu-zarr-token") != SECRET]
    assert not missing, f"requests sent without the caller's storage_options: {missing[:5]}"


def _disk(stores, rel):
    return zarr.open_array(stores / rel, mode="r")[...]


def test_nothing_is_remembered(server):
    from gpu_zarr.store import open_array

    open_array(f"{server.url}/plain.zarr", OPTS)
    _settle(server)  # (the open's v2 documents, not needed once zarr.json came, may still be answered)
    _all_carry_options(server)
    server.reset_counters()
    open_array(f"{server.url}/plain.zarr")  # no options: none are sent (none were remembered)
    assert server.log and all("x-gpu-zarr-token" not in e["headers"] for e in server.log)


def test_read_functions_take_storage_options(server, stores):
    from gpu_zarr.kvikio_zarr import supports
    from gpu_zarr.zarr_io import choose_backend, prepare, read_region, read_selection, read_zarr

    url = f"{server.url}/plain.zarr"
    ref = _disk(stores, "plain.zarr")
    np.testing.assert_array_equal(read_zarr(url, prefer="cpu", progress=False, storage_options=OPTS).data, ref)
    np.testing.assert_array_equal(read_region(url, (1, slice(3, 20)), backend="cpu", storage_options=OPTS),
                                  ref[1, 3:20])
    np.testing.assert_array_equal(read_selection(url, (2,), prefer="cpu", progress=False,
                                                 storage_options=OPTS).data, ref[2])
    prep = prepare(url, "cpu", storage_options=OPTS)
    np.testing.assert_array_equal(prep.read((3,)).data, ref[3])
    assert choose_backend(url, "cpu", storage_options=OPTS).backend == "cpu"
    assert supports(url, storage_options=OPTS)[0]
    _all_carry_options(server)
    assert SECRET not in repr(prep)


def test_omezarr_levels_and_labels_use_the_options(server, stores):
    from gpu_zarr.omezarr import is_ome_zarr, open_ome, read_omezarr

    url = f"{server.url}/img.ome.zarr"
    assert is_ome_zarr(url, OPTS)
    img = open_ome(url, storage_options=OPTS)
    assert img.labels, "the sample has labels"
    for name, lab in img.labels.items():
        np.testing.assert_array_equal(lab.open_level(0)[...], _disk(stores, f"img.ome.zarr/labels/{name}/0"))
    arr, _ = read_omezarr(url, level=1, storage_options=OPTS)
    np.testing.assert_array_equal(arr[...], _disk(stores, "img.ome.zarr/1"))
    _all_carry_options(server)
    assert SECRET not in repr(img) and SECRET not in repr(img.labels)


def test_lazy_array_takes_a_url_and_options(server, stores):
    from gpu_zarr.lazy import GpuLazyArray

    lazy = GpuLazyArray(f"{server.url}/img.ome.zarr/0", backend="cpu", storage_options=OPTS)
    np.testing.assert_array_equal(lazy[1, 2], _disk(stores, "img.ome.zarr/0")[1, 2])
    _all_carry_options(server)
    assert SECRET not in repr(lazy)


def test_storage_options_for_a_local_path_or_an_open_array_are_refused(stores):
    from gpu_zarr.store import open_array
    from gpu_zarr.zarr_io import read_zarr

    with pytest.raises(ValueError, match="local path"):
        read_zarr(str(stores / "plain.zarr"), prefer="cpu", progress=False, storage_options=OPTS)
    with pytest.raises(ValueError, match="opened zarr.Array"):
        open_array(zarr.open_array(stores / "plain.zarr", mode="r"), OPTS)


def test_to_dask_options_travel_to_worker_processes(server, stores):
    pytest.importorskip("dask.array")
    import dask

    from gpu_zarr.dask_array import to_dask

    levels = to_dask(f"{server.url}/img.ome.zarr", backend="cpu", storage_options=OPTS)
    source = next(iter(levels[0].dask.values()))[1]
    assert source.storage_options == OPTS and SECRET not in repr(source)
    server.reset_counters()
    with dask.config.set(scheduler="processes", num_workers=2):
        got = levels[0].compute()  # other processes: the options came in the pickled graph
    np.testing.assert_array_equal(got, _disk(stores, "img.ome.zarr/0"))
    _all_carry_options(server)
    # an array opened from a URL by gpu_zarr knows its URL and options
    from gpu_zarr.store import open_array

    d = to_dask(open_array(f"{server.url}/plain.zarr", OPTS), backend="cpu")
    np.testing.assert_array_equal(d.compute(scheduler="threads"), _disk(stores, "plain.zarr"))


def test_plate_and_well_use_the_options(tmp_path):
    pytest.importorskip("ome_zarr")
    from gpu_zarr.plate import is_plate, is_well, open_plate, open_well
    from plates import write_plate  # tests/plates.py

    write_plate(tmp_path / "p.ome.zarr")
    byte_cache(get_runtime()).clear()
    with RangeServer(tmp_path) as srv:
        url = f"{srv.url}/p.ome.zarr"
        assert is_plate(url, OPTS)
        plate = open_plate(url, storage_options=OPTS)
        view = plate.level(0, backend="cpu")
        np.asarray(view[(0,) * (view.ndim - 2)])
        well = plate.well(plate.wells[0].name)
        assert is_well(well.path, OPTS)
        w = open_well(well.path, storage_options=OPTS)
        np.asarray(w.level(0, backend="cpu")[(0,) * (w.image.ndim - 2)])
        _all_carry_options(srv)
        assert SECRET not in repr(plate) and SECRET not in repr(w)


def test_cli_storage_option_flag(server, stores):
    for cmd in (["info", f"{server.url}/img.ome.zarr"],
                ["read", f"{server.url}/img.ome.zarr", "--backend", "cpu", "--repeat", "1", "--level", "1"]):
        server.reset_counters()
        out = subprocess.run([sys.executable, "-m", "gpu_zarr.cli", *cmd, "--storage-option",
                              "headers=" + json.dumps(OPTS["headers"])],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert SECRET not in out.stdout + out.stderr
        _all_carry_options(server)
    out = subprocess.run([sys.executable, "-m", "gpu_zarr.cli", "info", f"{server.url}/img.ome.zarr",
                          "--storage-option", "novalue"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "KEY=VALUE" in out.stderr


def test_cli_parses_options():
    from gpu_zarr.cli import _option, _storage_options, main  # noqa: F401

    assert _option("anon=true") == ("anon", True)
    assert _option("requests=128") == ("requests", 128)
    assert _option("endpoint_url=http://127.0.0.1:9000") == ("endpoint_url", "http://127.0.0.1:9000")
    assert _option('client_kwargs={"region_name": "eu-west-1"}') == ("client_kwargs", {"region_name": "eu-west-1"})
    import argparse

    ns = argparse.Namespace(storage_option=[("key", "k")], anon=True)
    assert _storage_options(ns) == {"key": "k", "anon": True}
    assert _storage_options(argparse.Namespace(storage_option=None, anon=False)) is None


def test_object_stores_kept_are_bounded(monkeypatch):
    """The obstore store of each (URL, options) is kept for reuse, the least recently used dropped past a bound."""
    pytest.importorskip("obstore")
    import gpu_zarr.location as location
    from gpu_zarr.engine.runtime import Runtime

    rt = Runtime()  # (its own: the registry starts empty)
    monkeypatch.setattr(type(location.object_stores(rt)), "MAX", 3)
    locs = [location.resolve(f"http://127.0.0.1:9/s{k}.zarr") for k in range(5)]
    first = locs[0].object_store(rt)
    assert locs[0].object_store(rt) is first  # reused
    for loc in locs[1:]:
        loc.object_store(rt)
    assert len(location.object_stores(rt)) == 3
    assert locs[0].object_store(rt) is not first  # dropped, made again
    rt.close()
    assert len(location.object_stores(rt)) == 0  # released by close
