"""Remote writes into a real S3 server on 127.0.0.1 (moto): read back by zarr-python and by our
reader, metadata put last, existing zarrs refused or replaced, failures leave nothing complete."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

pytest.importorskip("obstore")

from gpu_zarr import read_zarr  # noqa: E402
from gpu_zarr.errors import DestinationExists, WriteError  # noqa: E402
from gpu_zarr.location import clear_metadata_cache  # noqa: E402
from gpu_zarr.write import remote  # noqa: E402
from gpu_zarr.write.api import write_zarr  # noqa: E402
from gpu_zarr.write.omezarr import write_ome_zarr  # noqa: E402
from s3 import moto_server  # noqa: E402


@pytest.fixture(scope="module")
def s3():
    """(endpoint, storage_options, boto3 client) of a fresh moto S3 server with the bucket "out"."""
    with moto_server() as (endpoint, client):
        client.create_bucket(Bucket="out")
        opts = {"key": "testing", "secret": "testing", "endpoint_url": endpoint, "timeout": 30, "max_retries": 1}
        yield endpoint, opts, client


@pytest.fixture(autouse=True)
def _fresh_metadata():
    clear_metadata_cache()
    yield
    clear_metadata_cache()


def _keys(client, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket="out", Prefix=prefix)
    return sorted(o["Key"][len(prefix):] for page in pages for o in page.get("Contents", []))


def _zarr_store(url: str, opts: dict):
    """zarr-python's own view of ``url``: its ObjectStore over the same obstore store."""
    from gpu_zarr.location import resolve

    return zarr.storage.ObjectStore(resolve(url, opts).object_store(), read_only=True)


def _zarr_read(url: str, opts: dict) -> np.ndarray:
    return zarr.open_array(_zarr_store(url, opts), mode="r")[...]


def _data(shape=(20, 96, 130)) -> np.ndarray:
    rng = np.random.default_rng(3)
    return (np.cumsum(rng.integers(-3, 4, shape), axis=2) % 3000).astype("uint16")


@pytest.mark.parametrize("fmt,shards", [(3, (10, 64, 64)), (3, False), (2, None)], ids=["v3-sharded", "v3", "v2"])
def test_write_zarr_to_s3_reads_back(s3, fmt, shards):
    _, opts, client = s3
    a = _data()
    url = f"s3://out/plain-{fmt}-{bool(shards)}.zarr"
    res = write_zarr(a, url, chunks=(5, 32, 64), shards=shards, zarr_format=fmt, encoder="cpu", storage_options=opts)
    assert res.path == url and res.stored_bytes > 0
    np.testing.assert_array_equal(_zarr_read(url, opts), a)
    np.testing.assert_array_equal(np.asarray(read_zarr(url, prefer="cpu", progress=None, storage_options=opts).data), a)


def test_a_big_shard_goes_out_as_a_multipart_upload(s3, monkeypatch):
    _, opts, client = s3
    calls = []
    import obstore

    real = obstore.put

    def put(store, key, file, **kw):
        calls.append((key, kw.get("use_multipart")))
        return real(store, key, file, **kw)

    monkeypatch.setattr(obstore, "put", put)
    a = np.random.default_rng(0).integers(0, 65535, (6, 1024, 1024), dtype=np.uint16)  # 12 MiB, incompressible
    write_zarr(a, "s3://out/big.zarr", chunks=(1, 512, 512), shards=(6, 1024, 1024), encoder="cpu",
               storage_options=opts)
    assert ("c/0/0/0", True) in calls
    np.testing.assert_array_equal(_zarr_read("s3://out/big.zarr", opts), a)


def test_ome_zarr_to_s3_puts_metadata_last(s3, monkeypatch):
    _, opts, client = s3
    order = []
    real = remote.RemoteDestination._put_one

    def put_one(self, key, parts):
        order.append(key)
        return real(self, key, parts)

    monkeypatch.setattr(remote.RemoteDestination, "_put_one", put_one)
    a = _data((2, 8, 96, 130))
    labels = {"cells": (_data((8, 96, 130)) % 7).astype("uint8")}
    url = "s3://out/img.ome.zarr"
    res = write_ome_zarr(a, url, axes="czyx", levels=2, chunks=(1, 4, 32, 64), labels=labels, encoder="cpu",
                         storage_options=opts)
    assert res.arrays == ["0", "1", "labels/cells/0", "labels/cells/1"]
    docs = [k for k in order if k.endswith("zarr.json")]
    assert order[-1] == "zarr.json" and order[-len(docs):] == docs  # data first, metadata after, the root last
    assert docs[-3:] == ["labels/cells/zarr.json", "labels/zarr.json", "zarr.json"]
    from gpu_zarr.omezarr import read_omezarr

    for level in (0, 1):
        arr, _ = read_omezarr(url, level=level, storage_options=opts)
        ref = zarr.open_group(_zarr_store(url, opts), mode="r")[str(level)][...]
        np.testing.assert_array_equal(np.asarray(arr[...]), ref)
    np.testing.assert_array_equal(np.asarray(read_omezarr(url, storage_options=opts)[0][...]), a)


def test_existing_zarr_is_refused_or_replaced_cleanly(s3):
    _, opts, client = s3
    url = "s3://out/again.zarr"
    write_zarr(_data((20, 96, 130)), url, chunks=(5, 32, 64), shards=False, encoder="cpu", storage_options=opts)
    before = _keys(client, "again.zarr/")
    with pytest.raises(DestinationExists, match="already holds a zarr"):
        write_zarr(_data(), url, chunks=(5, 32, 64), encoder="cpu", storage_options=opts)
    assert _keys(client, "again.zarr/") == before
    small = _data((5, 32, 64))
    write_zarr(small, url, chunks=(5, 32, 64), shards=False, encoder="cpu", storage_options=opts, overwrite=True)
    assert _keys(client, "again.zarr/") == ["c/0/0/0", "zarr.json"]  # no chunk of the old array survives
    np.testing.assert_array_equal(_zarr_read(url, opts), small)


def test_objects_that_are_not_a_zarr_are_never_replaced(s3):
    _, opts, client = s3
    client.put_object(Bucket="out", Key="notes/readme.txt", Body=b"mine")
    for overwrite in (False, True):
        with pytest.raises(WriteError, match="not a zarr"):
            write_zarr(_data(), "s3://out/notes", chunks=(5, 32, 64), encoder="cpu", storage_options=opts,
                       overwrite=overwrite)
    assert _keys(client, "notes/") == ["readme.txt"]


def test_a_failed_put_leaves_nothing_that_looks_complete(s3, monkeypatch):
    _, opts, client = s3
    real, seen = remote.RemoteDestination._put_one, []

    def put_one(self, key, parts):
        seen.append(key)
        if len(seen) == 5:
            raise WriteError(f"cannot put {key}: injected")
        return real(self, key, parts)

    monkeypatch.setattr(remote.RemoteDestination, "_put_one", put_one)
    from gpu_zarr import settings

    with settings.set(batch_bytes=1 << 20, lanes=1), pytest.raises(WriteError, match="injected"):
        write_zarr(_data(), "s3://out/broken.zarr", chunks=(5, 32, 64), shards=False, encoder="cpu",
                   storage_options=opts)
    assert _keys(client, "broken.zarr/") == []


def test_bad_credentials_are_a_clear_error(s3):
    endpoint, opts, client = s3
    with pytest.raises(WriteError, match="s3://nobucket/x.zarr"):
        write_zarr(_data(), "s3://nobucket/x.zarr", chunks=(5, 32, 64), encoder="cpu", storage_options=opts)


def test_convert_local_ome_to_s3(s3, tmp_path):
    from gpu_zarr.omezarr import read_omezarr
    from gpu_zarr.write.convert import convert

    pytest.importorskip("dask")
    _, opts, client = s3
    a = _data((2, 4, 96, 130))
    write_ome_zarr(a, tmp_path / "src.ome.zarr", axes="czyx", levels=2, ome_version="0.4", codec="blosc-lz4",
                   encoder="cpu")
    res = convert(tmp_path / "src.ome.zarr", "s3://out/conv.ome.zarr", encoder="cpu", dst_storage_options=opts)
    assert res.path == "s3://out/conv.ome.zarr"
    arr, _ = read_omezarr("s3://out/conv.ome.zarr", storage_options=opts)
    np.testing.assert_array_equal(np.asarray(arr[...]), a)


def test_staged_frames_keep_every_request_busy(s3, tmp_path, monkeypatch):
    """The GPU encoder's frames reach the host a group of files at a time (here through a
    1-byte staging target, so a local write takes one file a group); to a remote store the
    lanes' groups together hold about as many objects as keep its requests busy, so its puts
    still run side by side. The objects are the ones zarr reads back."""
    from gpu_zarr import settings
    from gpu_zarr.write import api
    from staging import Staging, staged_encoder

    _, opts, _ = s3
    a = _data()
    runs = {}
    for where in ("local", "remote"):
        staging = Staging()
        Staged = staged_encoder(staging, 1)
        monkeypatch.setattr(api, "choose_encoder", lambda spec, encoder, threads, S=Staged: (S(spec, threads), "staged"))
        url = str(tmp_path / "l.zarr") if where == "local" else "s3://out/staged.zarr"
        with settings.set(batch_bytes=4 << 20, lanes=2):
            write_zarr(a, url, chunks=(5, 32, 64), shards=False, encoder="cpu",
                       storage_options=opts if where == "remote" else None)
        runs[where] = staging.copies
    from gpu_zarr.location import resolve

    n_files = 4 * 3 * 3  # (20, 96, 130) in (5, 32, 64) chunks, one batch
    at_once = -(-max(1, resolve("s3://out/staged.zarr", opts).requests() // remote.PART_CONCURRENCY) // 2)
    assert runs["local"] == n_files and runs["remote"] == -(-n_files // at_once) < n_files
    np.testing.assert_array_equal(_zarr_read("s3://out/staged.zarr", opts), a)
