"""Opening a remote OME-Zarr costs few round trips (counted at the loopback server, no timing).

zarr-python opens a node in two round trips (zarr.json, .zarray, .zattrs, then .zgroup,
.zmetadata), and a viewer opens the root, each level and the labels several times: ~29 round
trips before napari showed the first plane. The remote store fetches a node's documents
together, reuses them for ``metadata_ttl`` seconds and asks for the OME children (levels,
labels, wells, fields) as soon as their parent's attributes name them.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr

pytest.importorskip("obstore")

from gpu_zarr import settings  # noqa: E402
from gpu_zarr.bench.remote_server import RangeServer  # noqa: E402
from gpu_zarr.engine.runtime import get_runtime  # noqa: E402
from gpu_zarr.engine.sources.remote import byte_cache  # noqa: E402
from gpu_zarr.location import METADATA_NAMES, clear_metadata_cache  # noqa: E402
from gpu_zarr.store import open_node  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    from gpu_zarr.sample import write_sample_omezarr

    root = tmp_path_factory.mktemp("remote-open")
    write_sample_omezarr(root / "plain.ome.zarr", version="0.4", shape=(2, 4, 64, 64), levels=3, labels=False,
                         compressor="blosc", chunks=(1, 4, 32, 32))
    write_sample_omezarr(root / "labels.ome.zarr", version="0.5", shape=(2, 4, 64, 64), levels=3, labels=True,
                         compressor="zstd", chunks=(1, 4, 32, 32))
    return root


@pytest.fixture
def server(root):
    byte_cache(get_runtime()).clear()
    clear_metadata_cache()
    with RangeServer(root, latency=0.03) as srv:
        yield srv
    byte_cache(get_runtime()).clear()
    clear_metadata_cache()


def waves(log: list[dict]) -> int:
    """Round trips on the critical path: the longest chain of requests each sent after the one
    before it was answered (requests in flight together are one round trip)."""
    done = sorted((e for e in log if "end" in e), key=lambda e: e["time"])
    depth: list[int] = []
    for i, e in enumerate(done):
        depth.append(1 + max((depth[j] for j in range(i) if done[j]["end"] <= e["time"]), default=0))
    return max(depth, default=0)


def settled(server: RangeServer) -> int:
    """The server's request count once the prefetches under way have been answered."""
    import time

    n, t = -1, time.monotonic()
    while n != len(server.log) and time.monotonic() - t < 10:
        n = len(server.log)
        time.sleep(0.2)
    return n


def _first_plane(url: str) -> np.ndarray:
    from gpu_zarr.napari_plugin._reader import napari_get_reader

    layers = napari_get_reader(url)(url)
    data = layers[0][0]
    coarsest = data[-1] if isinstance(data, list) else data
    return np.asarray(coarsest[(0,) * (coarsest.ndim - 2)])


@pytest.mark.parametrize("name", ["plain.ome.zarr", "labels.ome.zarr"])
def test_napari_first_plane_in_three_round_trips(server, root, name):
    import time

    pytest.importorskip("napari")
    url = f"{server.url}/{name}"
    got = _first_plane(url)
    done = time.monotonic()  # (the server's clock)
    level = zarr.open_group(root / name, mode="r")
    ms = dict(level.attrs).get("ome", dict(level.attrs))["multiscales"][0]["datasets"]
    want = zarr.open_array(root / name / ms[-1]["path"], mode="r")
    np.testing.assert_array_equal(got, want[(0,) * (want.ndim - 2)])
    log = list(server.log)
    # what the plane waited for: the requests answered before it was in hand (not those asked for
    # ahead of the viewer and still under way). Root; levels (+ the labels group asked for with
    # them); the plane, asked for beside the label images and their levels (guessed from the image's)
    before = [e for e in log if e.get("end", float("inf")) <= done]
    assert waves(before) <= 3, [(e["path"], round(e["time"] - log[0]["time"], 3)) for e in log]
    assert {e["method"] for e in log} <= {"GET", "HEAD"}
    # step 0 and the middle step lie in the same chunks here (4 z planes a chunk): fetched once
    chunks = [e["path"] for e in log if "/c/" in e["path"] or e["path"].rsplit("/", 1)[-1][:1].isdigit()]
    assert chunks and len(chunks) == len(set(chunks)), chunks


def test_a_node_is_fetched_once_within_the_ttl(server):
    url = f"{server.url}/plain.ome.zarr"
    open_node(url)
    n = settled(server)
    assert {e["path"].rsplit("/", 1)[-1] for e in server.log} >= set(METADATA_NAMES)  # all five at once
    for _ in range(3):
        open_node(url)
        open_node(url + "/0")
    assert settled(server) == n, "a later open of the same node (or a prefetched level) asked again"


def test_ttl_zero_asks_every_time_and_changes_are_seen(server, root, tmp_path):
    url = f"{server.url}/plain.ome.zarr"
    with settings.set(metadata_ttl=0):
        open_node(url)
        n = settled(server)
        open_node(url)
        assert settled(server) > n
    # within the TTL a change of the metadata is seen once the cache is cleared (or the TTL ran out)
    open_node(url + "/0")
    attrs = root / "plain.ome.zarr" / "0" / ".zattrs"
    old = attrs.read_bytes() if attrs.exists() else None
    try:
        attrs.write_text('{"changed": 1}')
        assert "changed" not in dict(open_node(url + "/0").attrs)
        clear_metadata_cache()
        assert dict(open_node(url + "/0").attrs)["changed"] == 1
    finally:
        if old is None:
            attrs.unlink()
        else:
            attrs.write_bytes(old)


def _native_http() -> bool:
    from gpu_zarr.engine.sources import http as native_http

    return native_http.available()


def _agents(log: list[dict], name: str) -> list[str]:
    return [e["headers"].get("user-agent", "") for e in log if e["path"].endswith("/" + name)]


def test_children_are_asked_for_as_their_parent_arrives_and_handed_out_once(server, root):
    """The native client's thread sends a node's OME children's requests as the node's
    documents arrive (no hop through zarr's event loop): the root's early fetch alone brings the
    levels, the labels group, the label images and their levels; opening the image then asks
    for nothing more, and nothing twice."""
    if not _native_http():
        pytest.skip("the native HTTP client is not available here (it is in CI's main run)")
    from gpu_zarr import location
    from gpu_zarr.omezarr import open_ome

    url = f"{server.url}/labels.ome.zarr"
    location.metadata_cache(get_runtime()).early(location.resolve(url))  # (nobody asks for anything)
    settled(server)
    asked = [e["path"].split("/labels.ome.zarr/", 1)[-1] for e in server.log]
    assert {"0/zarr.json", "2/zarr.json", "labels/zarr.json", "labels/blobs/zarr.json",
            "labels/blobs/0/zarr.json"} <= set(asked), asked
    n = len(server.log)
    img = open_ome(url)
    assert list(img.labels) == ["blobs"] and len(img.levels) == 3
    settled(server)
    again = [e["path"] for e in server.log[n:] if "/c/" not in e["path"]]
    # (a label image's own labels group and v2 documents of absent nodes may still be asked for)
    assert not [p for p in again if p.endswith("zarr.json") and "/labels/blobs/labels" not in p], again
    docs = [e["path"] for e in server.log]
    assert len(docs) == len(set(docs)), sorted(docs)


def test_documents_come_through_the_native_client_and_its_connections(server, root):
    """Where the native HTTP client serves the store, the metadata documents come through it
    (its user agent), the root's and the levels' once each, and the pixels are zarr's."""
    if not _native_http():
        pytest.skip("the native HTTP client is not available here (it is in CI's main run)")
    from gpu_zarr.store import open_array

    url = f"{server.url}/plain.ome.zarr"
    open_node(url)
    settled(server)
    root_docs = [e for e in server.log if e["path"].rsplit("/", 1)[-1] in METADATA_NAMES
                 and e["path"].count("/") == 2]
    assert sorted(e["path"].rsplit("/", 1)[-1] for e in root_docs) == sorted(METADATA_NAMES)
    assert {e["headers"].get("user-agent") for e in root_docs} == {"gpu-zarr"}  # the native client's
    n = len(server.log)
    arr = open_array(url + "/0")  # prefetched with the root: no request
    assert len(server.log) == n
    assert _agents(server.log, "0/.zarray") == ["gpu-zarr"]
    want = zarr.open_array(root / "plain.ome.zarr" / "0", mode="r")
    np.testing.assert_array_equal(np.asarray(arr[0, 0]), want[0, 0])


def test_a_document_over_the_native_cap_is_asked_of_obstore(server, root, monkeypatch):
    """A document bigger than the native client takes is fetched again by obstore, whole, up to the
    ``metadata_bytes`` setting: the attributes are all there."""
    if not _native_http():
        pytest.skip("the native HTTP client is not available here (it is in CI's main run)")
    from gpu_zarr import location

    monkeypatch.setattr(location, "_root_cap", lambda: 64)  # .zattrs of the sample is longer
    attrs = root / "plain.ome.zarr" / ".zattrs"
    assert attrs.stat().st_size > 64
    node = open_node(f"{server.url}/plain.ome.zarr")
    assert dict(node.attrs) == dict(zarr.open_group(root / "plain.ome.zarr", mode="r").attrs)
    agents = _agents(server.log, "plain.ome.zarr/.zattrs")
    assert agents[0] == "gpu-zarr" and len(agents) == 2 and agents[1] != "gpu-zarr", agents


def test_a_document_over_metadata_bytes_is_refused_by_name(root):
    """Past the ``metadata_bytes`` setting neither client reads a document: a clear error names the
    URL and the setting (a server's 400 MiB answer is never held)."""
    from gpu_zarr.errors import RemoteError

    clear_metadata_cache()
    (root / "big.zarr").mkdir(exist_ok=True)
    (root / "big.zarr" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {"pad": "'
                                                  + "x" * 4096 + '"}}')
    with RangeServer(root) as srv, settings.set(metadata_bytes=1024):
        with pytest.raises(RemoteError, match=r"big\.zarr/zarr\.json is larger than .* metadata_bytes"):
            open_node(f"{srv.url}/big.zarr")
    clear_metadata_cache()


def test_failing_documents_are_retried_by_obstore_and_explained(root):
    """Every answer a 503: the native client's single try gives way to obstore, which retries
    and raises an error that names the URL (no hang, no partial metadata)."""
    from gpu_zarr.errors import RemoteError
    from gpu_zarr.store import open_array

    clear_metadata_cache()
    with RangeServer(root, fail_503=1.0) as srv:
        url = f"{srv.url}/plain.ome.zarr/0"
        with pytest.raises(RemoteError, match="503") as info:
            open_array(url, storage_options={"max_retries": 1, "retry_timeout": 2})
        assert url in str(info.value)
        if _native_http():  # the native client tried first, then obstore
            assert {"gpu-zarr"} < set(_agents(srv.log, "0/zarr.json")), _agents(srv.log, "0/zarr.json")
    clear_metadata_cache()


def test_the_obstore_store_is_built_only_when_needed(server, root, monkeypatch):
    """Opening a URL the native client serves builds no obstore store (4-7 ms each, one per
    level of an OME-Zarr): the documents and chunks come through the native client; the first
    use that needs one builds it. A store compares equal by URL and options."""
    if not _native_http():
        pytest.skip("the native HTTP client is not available here (it is in CI's main run)")
    import gpu_zarr.location as location
    from gpu_zarr.engine import read as engine_read
    from gpu_zarr.store import open_array

    built: list[str] = []
    make = location._make_store
    monkeypatch.setattr(location, "_make_store", lambda loc: built.append(loc.url) or make(loc))
    url = f"{server.url}/plain.ome.zarr/0"
    arr = open_array(url)
    want = zarr.open_array(root / "plain.ome.zarr" / "0", mode="r")
    np.testing.assert_array_equal(engine_read(arr, (1,), device="cpu").data, want[1])
    assert built == []
    assert str(arr.store) == f"object_store://{url}" and built == []
    assert type(arr.store.store).__module__.startswith("obstore") and built == [url]  # needed: built
    again = arr.store.with_read_only(True)
    assert again == arr.store and again.store is arr.store.store and built == [url]
    assert open_array(f"{server.url}/plain.ome.zarr/1").store != arr.store
    np.testing.assert_array_equal(np.asarray(arr[1]), want[1])


# -- the middle plane asked for ahead (napari slices step 0, then the middle) ---------------------

@pytest.fixture(scope="module")
def thin(tmp_path_factory):
    """(c, z, y, x) with one z per chunk: planes are chunks of their own."""
    from gpu_zarr.sample import write_sample_omezarr

    root = tmp_path_factory.mktemp("remote-thin")
    write_sample_omezarr(root / "t.ome.zarr", version="0.5", shape=(2, 5, 64, 64), levels=2, labels=False,
                         compressor="zstd", chunks=(1, 1, 32, 32))
    return root


def _chunk_requests(log: list[dict], level: str) -> list[str]:
    return [e["path"].split("/t.ome.zarr/", 1)[1] for e in log if f"/t.ome.zarr/{level}/c/" in e["path"]]


def test_a_read_inside_a_running_prefetch_waits_for_it(thin):
    from collections import Counter

    from gpu_zarr.lazy import GpuLazyArray

    byte_cache(get_runtime()).clear()
    with RangeServer(thin, latency=0.15) as srv:
        arr = GpuLazyArray(f"{srv.url}/t.ome.zarr/0")
        arr._src.prepared()  # (opened: only the prefetch's requests follow)
        assert arr.prefetch((slice(None), 2))
        got = np.stack([arr.index_axis(0, c)[2] for c in range(2)])  # each inside the running prefetch
        want = zarr.open_array(thin / "t.ome.zarr" / "0", mode="r")[:, 2]
        np.testing.assert_array_equal(got, want)
        asked = Counter(_chunk_requests(srv.log, "0"))
    # the plane's 2 x 2 x 2 chunks, each asked for once (by the prefetch), none of another plane
    assert len(asked) == 8 and set(asked.values()) == {1}, asked
    assert all(p.split("/")[3] == "2" for p in asked), asked


def test_no_prefetch_without_a_chunk_cache(thin):
    from gpu_zarr.lazy import GpuLazyArray

    with RangeServer(thin) as srv, settings.set(cache_bytes=0):
        arr = GpuLazyArray(f"{srv.url}/t.ome.zarr/0")
        assert not arr.prefetch((0, 2))


def test_the_napari_reader_asks_for_the_first_and_middle_planes_ahead(thin):
    """napari slices each new layer at step 0 and then the viewer's layers at the middle step,
    at the coarsest level: the reader asks for every channel's plane at step 0 and at the
    middle step as it opens the levels, together."""
    from gpu_zarr.napari_plugin._reader import read_zarr_layers

    byte_cache(get_runtime()).clear()
    clear_metadata_cache()
    with RangeServer(thin, latency=0.15) as srv:
        layers = read_zarr_layers(f"{srv.url}/t.ome.zarr")
        coarsest = layers[0][0][-1]
        pending = coarsest._src.prefetching
        assert pending is not None and not pending.done()
        first = np.asarray(coarsest[0])  # napari's first slice, inside the running prefetch
        pending.result(timeout=30)
        asked = _chunk_requests(srv.log, "1")
    np.testing.assert_array_equal(first, zarr.open_array(thin / "t.ome.zarr" / "1", mode="r")[0, 0])
    # level 1: (2, 5, 32, 32) in (1, 1, 32, 32) chunks; the middle z of 5 is 2: one chunk per
    # channel and step
    assert sorted(asked) == ["1/c/0/0/0/0", "1/c/0/2/0/0", "1/c/1/0/0/0", "1/c/1/2/0/0"], asked
    assert not _chunk_requests(srv.log, "0")  # nothing of the full-resolution level


def test_label_levels_named_otherwise_than_the_images_open_right(root, tmp_path):
    """The label images' levels are asked for beside the label images, guessed to have the
    image's level paths; a label image whose levels are named otherwise opens all the same."""
    pytest.importorskip("napari")  # the label layers' colormap
    import json
    import shutil

    from gpu_zarr.napari_plugin._reader import read_zarr_layers

    store = tmp_path / "renamed.ome.zarr"
    shutil.copytree(root / "labels.ome.zarr", store)
    blobs = store / "labels" / "blobs"
    doc = json.loads((blobs / "zarr.json").read_text())
    for ds in doc["attributes"]["ome"]["multiscales"][0]["datasets"]:
        (blobs / ds["path"]).rename(blobs / f"s{ds['path']}")
        ds["path"] = f"s{ds['path']}"
    (blobs / "zarr.json").write_text(json.dumps(doc))
    byte_cache(get_runtime()).clear()
    clear_metadata_cache()
    with RangeServer(tmp_path, latency=0.01) as srv:
        layers = read_zarr_layers(f"{srv.url}/renamed.ome.zarr")
        labels = [data for data, _, kind in layers if kind == "labels"]
        assert len(labels) == 1
        got = np.asarray(labels[0][0][0, 0] if isinstance(labels[0], list) else labels[0][0, 0])
        paths = {e["path"].split("/renamed.ome.zarr/", 1)[1] for e in srv.log}
    want = zarr.open_array(blobs / "s0", mode="r")[0, 0]
    np.testing.assert_array_equal(got, want)
    assert "labels/blobs/0/zarr.json" in paths and "labels/blobs/s0/zarr.json" in paths  # guessed, then read


def test_the_cascade_asked_for_ahead_is_bounded(tmp_path, monkeypatch):
    """Nodes asked for ahead of a reader (a plate's wells, their fields, their levels...) are
    bounded per open (``PREFETCH``): a big plate's rest is asked for when the reader opens it."""
    if not _native_http():
        pytest.skip("the native HTTP client is not available here (it is in CI's main run)")
    pytest.importorskip("ome_zarr")
    from gpu_zarr import location
    from plates import write_plate  # tests/plates.py

    write_plate(tmp_path / "p.ome.zarr")  # 4 wells listed, 2 fields each, 3 levels each
    monkeypatch.setattr(location._MetadataCache, "PREFETCH", 5)
    clear_metadata_cache()
    with RangeServer(tmp_path) as srv:
        location.metadata_cache(get_runtime()).early(location.resolve(f"{srv.url}/p.ome.zarr"))
        settled(srv)
        nodes = {e["path"].split("/p.ome.zarr", 1)[1].rsplit("/", 1)[0] for e in srv.log}
    # the root, then at most 5 nodes below it (the first wells, nothing deeper than the budget)
    assert "" in nodes and 1 <= len(nodes - {""}) <= 5, sorted(nodes)
