"""The native HTTP client (``native/gz_http.c`` over libcurl, :mod:`gpu_zarr.engine.sources.http`)
against a real loopback server with Range support: whole objects, byte ranges and suffixes land
exactly in the caller's buffers; injected 503s, 429s, resets and truncated bodies are retried;
what cannot be served comes back with a status, never as data. The remote suite
(``test_remote.py``) runs every reader through this client, and CI runs it again with
``GPU_ZARR_NATIVE_HTTP=0`` (obstore)."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

import numpy as np
import pytest

from gpu_zarr.bench.remote_server import RangeServer
from gpu_zarr.engine.sources import http as nh

pytestmark = pytest.mark.skipif(not nh.available(), reason=f"native HTTP client: {nh.status()}")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp("http")
    rng = np.random.default_rng(1)
    for k in range(40):
        (d / f"obj{k}").write_bytes(rng.integers(0, 256, 1000 + 997 * k, dtype=np.uint8).tobytes())
    return d


def _reqs(pairs):
    r = nh.new_requests(len(pairs))
    for i, (a, b) in enumerate(pairs):
        r["start"][i], r["end"][i] = a, b
    return r


def test_libcurl_option_ids_match_the_library():
    """The option numbers gz_http.c hard-codes (it includes no curl header) are libcurl's."""
    name = ctypes.util.find_library("curl") or "libcurl.so.4"
    lib = ctypes.CDLL(name)

    class Opt(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p), ("id", ctypes.c_int), ("type", ctypes.c_int), ("flags", ctypes.c_uint)]
    lib.curl_easy_option_by_name.restype = ctypes.POINTER(Opt)
    src = (__import__("pathlib").Path(nh.__file__).parents[1] / "native" / "gz_http.c").read_text()
    want = {"WRITEDATA": 10001, "URL": 10002, "RANGE": 10007, "ERRORBUFFER": 10010, "USERAGENT": 10018,
            "HTTPHEADER": 10023, "HEADERDATA": 10029, "PRIVATE": 10103, "WRITEFUNCTION": 20011,
            "HEADERFUNCTION": 20079, "LOW_SPEED_LIMIT": 19, "LOW_SPEED_TIME": 20, "FOLLOWLOCATION": 52,
            "MAXREDIRS": 68, "FILETIME": 69, "BUFFERSIZE": 98, "NOSIGNAL": 99, "TCP_NODELAY": 121,
            "CONNECTTIMEOUT_MS": 156}
    for opt, num in want.items():
        assert f"O_{opt} = {num}" in src, opt
        assert lib.curl_easy_option_by_name(opt.encode()).contents.id == num, opt


AGENTS = pytest.mark.parametrize("agents", [1, 3], ids=["one-thread", "three-threads"])


@AGENTS
def test_whole_ranges_and_suffixes_land_in_place(root, agents):
    data = {k: (root / f"obj{k}").read_bytes() for k in range(40)}
    jobs = [(0, -1), (10, 500), (-300, 0), (0, -1)] * 10
    urls = []
    with RangeServer(root) as srv:
        urls = [f"{srv.url}/obj{k}" for k in range(40)]
        caps = [len(data[k]) if b < 0 and a == 0 else (b - a if b > 0 else -a) for k, (a, b) in enumerate(jobs)]
        big = np.zeros(sum(caps) + 64, np.uint8)  # one staging buffer, every body at its own offset
        at = np.concatenate([[0], np.cumsum(caps)])
        dests = [big[at[k]:at[k] + caps[k]] for k in range(40)]
        seen = []
        caller = threading.get_ident()
        threads = set()

        def done(i):
            threads.add(threading.get_ident())
            seen.append(i)
        r = nh.HttpClient().fetch(urls, _reqs(jobs), dests, 8, done, agents=agents)
    assert sorted(seen) == list(range(40))  # each reported once, on the caller's thread
    assert threads == {caller}
    for k, (a, b) in enumerate(jobs):
        want = data[k] if (a, b) == (0, -1) else data[k][a:b] if b > 0 else data[k][a:]
        assert int(r["got"][k]) == len(want)
        assert bytes(dests[k][:len(want)]) == want
        assert int(r["status"][k]) == (200 if (a, b) == (0, -1) else 206)
        assert int(r["size"][k]) == len(data[k])
        assert r["mtime"][k] > 0
    assert big[-64:].sum() == 0  # nothing written past the bodies


@AGENTS
@pytest.mark.parametrize("fault", ["fail_503", "fail_429", "fail_reset", "fail_truncate"])
def test_injected_failures_are_retried(root, fault, agents):
    with RangeServer(root, seed=3, **{fault: 0.3}) as srv:
        urls = [f"{srv.url}/obj{k}" for k in range(40)]
        dests = [np.zeros(20000, np.uint8) for _ in range(40)]
        seen = []
        r = nh.HttpClient(backoff_s=0.001).fetch(urls, _reqs([(100, 900)] * 40), dests, 16, seen.append, agents=agents)
        assert sorted(seen) == list(range(40))
        assert (r["status"] == 206).all() and (r["got"] == 800).all()
        assert r["attempts"].max() > 1  # the faults happened, and were retried
    for k in range(40):
        assert bytes(dests[k][:800]) == (root / f"obj{k}").read_bytes()[100:900]


def test_a_range_past_the_end_is_reported_short(root):
    """An object shorter than the range asked for (it changed): status and length say so."""
    with RangeServer(root) as srv:
        r = nh.HttpClient(backoff_s=0.001).fetch([f"{srv.url}/obj0"], _reqs([(100, 5100)]), [np.zeros(5000, np.uint8)], 1)
    assert int(r["status"][0]) == 206 and int(r["got"][0]) == 900 and int(r["size"][0]) == 1000
    assert int(r["attempts"][0]) == 1  # not retried: it will not get longer


def test_what_cannot_be_served_comes_back_as_a_status(root):
    with RangeServer(root, forbidden=("obj3",)) as srv:
        urls = [f"{srv.url}/missing", f"{srv.url}/obj3", f"{srv.url}/obj1", f"{srv.url}/obj2"]
        dests = [np.zeros(100, np.uint8), np.zeros(100, np.uint8), np.zeros(100, np.uint8), np.zeros(10, np.uint8)]
        r = nh.HttpClient(attempts=2, backoff_s=0.001).fetch(urls, _reqs([(0, -1), (0, 10), (10**9, 10**9 + 5),
                                                                          (0, -1)]), dests, 4)
    assert list(r["status"]) == [404, 403, 416, nh.TOO_LONG]  # a body longer than its buffer: never past it
    assert r["got"][3] <= 10


def test_a_server_without_ranges_is_reported_not_guessed(root):
    with RangeServer(root, ranges=False) as srv:
        r = nh.HttpClient().fetch([f"{srv.url}/obj39"], _reqs([(0, 100)]), [np.zeros(100, np.uint8)], 1)
    assert int(r["status"][0]) in (200, nh.TOO_LONG)  # the caller gives such a server to obstore


def test_dead_server_and_callback_errors():
    r = nh.HttpClient(attempts=2, backoff_s=0.001, connect_timeout_s=2).fetch(
        ["http://127.0.0.1:1/x"], _reqs([(0, -1)]), [np.zeros(10, np.uint8)], 1)
    assert r["status"][0] == -1 and r["curl"][0] == 7 and b"connect" in bytes(r["err"][0]).lower()


@AGENTS
def test_an_error_in_the_callback_stops_the_rest(root, agents):
    with RangeServer(root, latency=0.01) as srv:
        urls = [f"{srv.url}/obj{k}" for k in range(40)]

        def boom(i):
            raise ValueError(f"stop at {i}")
        with pytest.raises(ValueError, match="stop at"):
            nh.HttpClient().fetch(urls, _reqs([(0, 100)] * 40), [np.zeros(100, np.uint8) for _ in range(40)], 3, boom,
                                  agents=agents)
        assert len(srv.log) < 40  # the rest were not asked for


def test_threads_for_a_fetch():
    """One receiving thread per 16 MiB of answers, at most 4 and a quarter of the cores."""
    assert nh.agents_for(1 << 20, 4, cores=16) == 1  # a viewer's plane
    assert nh.agents_for(81 << 20, 8, cores=16) == 4  # a sharded level
    assert nh.agents_for(81 << 20, 2, cores=16) == 2  # no more than the requests
    assert nh.agents_for(1 << 30, 4096, cores=2) == 1  # the 2-core machine
    assert nh.agents_for(1 << 30, 4096, cores=64) == nh.MAX_AGENTS


def test_status_line():
    assert nh.status().startswith("native (libcurl")


def test_bodies_land_in_a_carved_block_and_a_done_may_fetch_again(root):
    """Destinations carved from one block (``Carved``: a remote read's answers in one lease)
    get exactly their bodies; a ``done`` that runs a fetch of its own (the callback is one
    native thunk for the process, dispatching to the innermost fetch of the thread) gets its
    own answers, and the outer fetch's later ``done`` calls still reach the outer callback."""
    data = {k: (root / f"obj{k}").read_bytes() for k in range(6)}
    with RangeServer(root) as srv:
        urls = [f"{srv.url}/obj{k}" for k in range(6)]
        caps = [len(data[k]) for k in range(6)]
        offsets = [sum(-(-c // 64) * 64 for c in caps[:k]) for k in range(6)]
        block = np.zeros(offsets[-1] + caps[-1] + 64, np.uint8)
        outer, inner = [], []

        def done(i):
            outer.append(i)
            if len(outer) == 1:  # a fetch inside the first report
                dest = np.zeros(caps[5], np.uint8)
                r2 = nh.HttpClient().fetch([urls[5]], _reqs([(0, -1)]), [dest], 1, inner.append)
                assert int(r2["got"][0]) == caps[5] and bytes(dest) == data[5]
        r = nh.HttpClient().fetch(urls, _reqs([(0, -1)] * 6), nh.Carved(block, offsets, caps), 2, done)
    assert sorted(outer) == list(range(6)) and inner == [0]
    for k in range(6):
        assert int(r["got"][k]) == caps[k]
        assert bytes(block[offsets[k]:offsets[k] + caps[k]]) == data[k]
    assert block[-64:].sum() == 0


@AGENTS
def test_a_landing_is_made_once_the_requests_are_written(root, agents):
    """``Landing``: the destinations are made after the requests left (one thread: at
    ``on_sent``, before it and before any answer is reported; several threads receiving: before
    the requests leave), once, and every body lands exactly in them."""
    data = {k: (root / f"obj{k}").read_bytes() for k in range(12)}
    events: list[str] = []
    with RangeServer(root) as srv:
        urls = [f"{srv.url}/obj{k}" for k in range(12)]
        caps = [len(data[k]) for k in range(12)]
        made: list[np.ndarray] = []

        def make():
            events.append("make")
            made.extend(np.zeros(c, np.uint8) for c in caps)
            return made
        r = nh.HttpClient().fetch(urls, _reqs([(0, -1)] * 12), nh.Landing(caps, make), 4,
                                  lambda i: events.append("done"), agents=agents,
                                  on_sent=lambda: events.append("sent"))
    assert events.count("make") == 1 and events[:2] == ["make", "sent"] and events.count("done") == 12
    for k in range(12):
        assert int(r["status"][k]) == 200 and int(r["got"][k]) == caps[k]
        assert bytes(made[k]) == data[k]


def test_an_answer_already_there_waits_for_its_landing():
    """A server that answers before it reads the request (the answer is in the socket when
    libcurl first looks): the body waits (paused) until the landing is made, then lands whole."""
    import socket
    import time

    body = bytes(range(256)) * 64
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)

    def serve():
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            try:
                c.settimeout(1)
                c.recv(65536)
            except OSError:
                pass
            c.close()
    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        for _ in range(5):
            made: list[np.ndarray] = []

            def make():
                time.sleep(0.02)  # (the answer is in long before)
                made.append(np.zeros(len(body), np.uint8))
                return made
            r = nh.HttpClient(attempts=1).fetch([f"http://127.0.0.1:{ls.getsockname()[1]}/x"], _reqs([(0, -1)]),
                                                nh.Landing([len(body)], make), 1)
            assert int(r["status"][0]) == 200 and int(r["got"][0]) == len(body) and bytes(made[0]) == body
    finally:
        ls.close()


def test_a_landing_that_fails_or_is_too_small_stops_the_fetch(root):
    """What a landing's ``make`` raises is raised by the fetch, and destinations smaller than
    the capacities given are refused: nothing is written anywhere."""
    with RangeServer(root) as srv:
        url = f"{srv.url}/obj3"

        def boom():
            raise MemoryError("no room for the answers")
        with pytest.raises(MemoryError, match="no room"):
            nh.HttpClient().fetch([url], _reqs([(0, 100)]), nh.Landing([100], boom), 1)
        small = np.zeros(50, np.uint8)
        with pytest.raises(ValueError, match="hold \\[50\\] bytes; the requests need \\[100\\]"):
            nh.HttpClient().fetch([url], _reqs([(0, 100)]), nh.Landing([100], lambda: [small]), 1)
        assert not small.any()
    with pytest.raises(ValueError, match="2 requests need 2 capacities"):
        nh.HttpClient().fetch(["http://127.0.0.1:9/x"] * 2, _reqs([(0, 1)] * 2), nh.Landing([1], lambda: []), 1)
    with pytest.raises(ValueError, match="request table"):
        nh.HttpClient().fetch(["http://127.0.0.1:9/x"] * 2, _reqs([(0, 1)]), [np.zeros(1, np.uint8)] * 2, 1)


def test_a_url_with_a_nul_character_is_refused():
    """The URLs go to the native call as one buffer of NUL-terminated strings: one holding a NUL
    would shift every request after it, so the call refuses them all."""
    with pytest.raises(ValueError, match="holds a NUL character"):
        nh.HttpClient().fetch(["http://127.0.0.1:9/a\0b", "http://127.0.0.1:9/c"], _reqs([(0, 1)] * 2),
                              [np.zeros(1, np.uint8)] * 2, 1)


def test_a_request_table_sets_its_ranges_without_numpy():
    r = nh.new_requests(3, [1, 2, 3], [4, 5, -1])
    assert r.dtype == nh.REQ and r.flags.writeable and r["start"].tolist() == [1, 2, 3]
    assert r["end"].tolist() == [4, 5, -1] and not r["cap"].any() and not r["dest"].any()
    assert len(nh.new_requests(0)) == 0


def test_a_carved_destination_outside_its_block_is_refused(root):
    block = np.zeros(1000, np.uint8)
    with pytest.raises(ValueError, match="inside the block of 1000 bytes"):
        nh.HttpClient().fetch(["http://127.0.0.1:9/x"], _reqs([(0, 100)]), nh.Carved(block, [950], [100]), 1)
    with pytest.raises(ValueError, match="writable contiguous"):
        nh.HttpClient().fetch(["http://127.0.0.1:9/x"], _reqs([(0, 100)]), nh.Carved(block[::2], [0], [10]), 1)


@pytest.mark.parametrize("fault", [None, "fail_truncate", "fail_503"])
def test_complete_bodies_are_handed_to_the_decode_set_as_they_arrive(tmp_path, fault):
    """With a sink, each complete whole body goes to its chunk of a native decode set the moment
    it is in (``added`` 1, decoded and placed before its report comes); a body cut short is
    retried and only its complete answer is handed; a 404, a request with no chunk (-1) and
    every answer before the set's handle is in the cell are only reported; a garbage body is
    handed and fails to decode, never placed; the destinations stay alive with the hand-off."""
    import numcodecs

    from gpu_zarr.engine import native

    rng = np.random.default_rng(7)
    n, shape = 8, (40, 48)
    raw = [rng.integers(0, 200, shape).astype("<u2") for _ in range(n)]
    for k in range(n):
        body = numcodecs.Zstd(3).encode(raw[k].tobytes()) if k != 6 else rng.integers(0, 256, 700, np.uint8).tobytes()
        if k != 5:  # chunk 5 does not exist (404)
            (tmp_path / f"c{k}").write_bytes(bytes(body))
    table = np.zeros((n, 2, 4), np.int64)
    for k in range(n):
        table[k, 0] = (shape[0], 0, shape[0], k * shape[0])
        table[k, 1] = (shape[1], 0, shape[1], 0)
    nb = raw[0].nbytes
    chunk = np.array([0, 1, 2, -1, 4, 5, 6, 7], np.int64)  # request 3 has no chunk in the set
    kw = {fault: 0.4} if fault else {}
    with RangeServer(tmp_path, seed=5, **kw) as srv:
        urls = [f"{srv.url}/c{k}" for k in range(n)]
        # the set not open yet (cell 0): every answer is only reported
        off = nh.Handoff()
        dests = [np.zeros(nb + 4096, np.uint8) for _ in range(n)]
        r = nh.HttpClient(backoff_s=0.001).fetch(urls, _reqs([(0, -1)] * n), dests, 8, None,
                                                 sink=nh.Sink(off, chunk))
        assert not r["added"].any() and off.alive == [dests]
        out = np.full((n * 40, 48), 99, np.uint16)
        with native.Arrivals("zstd", n, nb, table, out, np.dtype("<u2"), None, 3, np.empty(3 * nb, np.uint8)) as arr:
            off = nh.Handoff()
            off.cell[0] = arr.handle
            dests = [np.zeros(nb + 4096, np.uint8) for _ in range(n)]
            seen = {}

            def done(i):
                seen[i] = int(arr.status[chunk[i]]) if chunk[i] >= 0 else None

            r = nh.HttpClient(backoff_s=0.001).fetch(urls, _reqs([(0, -1)] * n), dests, 8, done,
                                                     sink=nh.Sink(off, chunk))
            del dests  # (the hand-off keeps them until the set is closed)
        st, _ = arr.close()
    assert sorted(seen) == list(range(n))
    handed = [0, 1, 2, 4, 6, 7]
    assert [int(r["added"][i]) for i in range(n)] == [int(i in handed) for i in range(n)]
    for i in handed:  # queued (or decoded) before it was reported
        assert seen[i] != native.Arrivals.NOT_ADDED
    assert int(r["status"][5]) == 404 and st[5] == native.Arrivals.NOT_ADDED and st[3] == native.Arrivals.NOT_ADDED
    assert st[6] != native.OK and (out[240:280] == 99).all()  # garbage: handed, failed, never placed
    for k in (0, 1, 2, 4, 7):
        assert st[k] == native.OK and np.array_equal(out[k * 40:(k + 1) * 40], raw[k])
    assert (out[120:160] == 99).all() and (out[200:240] == 99).all()
    if fault:
        assert r["attempts"].max() > 1  # the faults happened; only complete answers were handed


def test_a_sink_table_shorter_than_the_requests_is_refused(root):
    with pytest.raises(ValueError, match="one int64 per request"):
        nh.HttpClient().fetch([f"http://127.0.0.1:9/obj{k}" for k in range(3)], _reqs([(0, -1)] * 3),
                              [np.zeros(10, np.uint8) for _ in range(3)], 1, None,
                              sink=nh.Sink(nh.Handoff(), np.zeros(2, np.int64)))


@pytest.mark.parametrize("warm", [True, False], ids=["kept-connections", "new-connections"])
def test_on_sent_runs_once_while_the_requests_travel(root, warm):
    """``on_sent`` runs once, before any answer is taken: on kept connections the requests are
    already at the server while it runs (the caller's setup overlaps their round trip)."""
    import time

    with RangeServer(root, latency=0.005) as srv:
        urls = [f"{srv.url}/obj{k}" for k in range(8)]
        client = nh.HttpClient()
        if warm:  # connections kept from an earlier fetch
            client.fetch(urls, _reqs([(0, 10)] * 8), [np.zeros(10, np.uint8) for _ in range(8)], 8)
        srv.reset_counters()
        events: list[tuple[str, float]] = []

        def sent():
            events.append(("sent", time.monotonic()))
            time.sleep(0.1)  # (the interpreter's lock is free: the server logs what reaches it)
            events.append(("setup done", time.monotonic()))
        r = client.fetch(urls, _reqs([(0, 100)] * 8), [np.zeros(100, np.uint8) for _ in range(8)], 8,
                         lambda i: events.append((f"done {i}", time.monotonic())), on_sent=sent)
        assert (r["status"] == 206).all() and (r["got"] == 100).all()
        names = [e for e, _ in events]
        assert names[:2] == ["sent", "setup done"] and names.count("sent") == 1
        assert sorted(names[2:]) == sorted(f"done {i}" for i in range(8))
        if warm:
            setup_done = events[1][1]
            assert len(srv.log) == 8 and all(e["time"] < setup_done for e in srv.log), (srv.log, events)


def test_an_error_in_on_sent_stops_the_fetch(root):
    with RangeServer(root, latency=0.05) as srv:
        urls = [f"{srv.url}/obj{k}" for k in range(40)]
        seen: list[int] = []

        def sent():
            raise RuntimeError("setup failed")
        with pytest.raises(RuntimeError, match="setup failed"):
            nh.HttpClient().fetch(urls, _reqs([(0, 100)] * 40), [np.zeros(100, np.uint8) for _ in range(40)], 4,
                                  seen.append, on_sent=sent)
        assert seen == [] and len(srv.log) <= 4  # no answer reported, the rest never asked for


def _shard_like(tmp_path, name, rng, k, shape):
    """An object of ``k`` zstd chunks back to back and a tail (as a shard and its index): the
    chunks, and each one's (offset, size)."""
    import numcodecs

    raw = [rng.integers(0, 200, shape).astype("<u2") for _ in range(k)]
    enc = [bytes(numcodecs.Zstd(1).encode(r.tobytes())) for r in raw]
    offs = np.cumsum([0] + [len(e) for e in enc])[:-1]
    (tmp_path / name).write_bytes(b"".join(enc) + bytes(64))
    return raw, [(int(o), len(e)) for o, e in zip(offs, enc)]


def _placed(n, shape):
    table = np.zeros((n, 2, 4), np.int64)
    for c in range(n):
        table[c, 0] = (shape[0], 0, shape[0], c * shape[0])
        table[c, 1] = (shape[1], 0, shape[1], 0)
    return table


@pytest.mark.parametrize("fault", [None, "fail_truncate", "fail_503", "fail_reset"])
def test_parts_of_a_whole_answer_are_handed_as_its_bytes_arrive(tmp_path, fault):
    """Parts (a whole shard's inner chunks, its index known) go to the decode set as the body's
    bytes pass each one's end -- each decoded and placed before the answer is reported -- when
    the answer is the object they were cut from (size and Last-Modified as expected; an ETag the
    server does not send is not compared). An answer of another size or Last-Modified hands
    nothing; its body still lands whole for the caller. Cut-short answers and 503s are retried
    and the parts handed once."""
    import os

    from gpu_zarr.engine import native

    rng = np.random.default_rng(3)
    k, shape = 12, (32, 64)
    raw_a, at_a = _shard_like(tmp_path, "a", rng, k, shape)
    raw_b, at_b = _shard_like(tmp_path, "b", rng, k, shape)
    size_a, size_b = (tmp_path / "a").stat().st_size, (tmp_path / "b").stat().st_size
    mtime = int(os.stat(tmp_path / "a").st_mtime)
    n = 2 * k
    nb = raw_a[0].nbytes
    out = np.full((n * shape[0], shape[1]), 99, np.uint16)
    kw = {fault: 0.5} if fault else {}
    with RangeServer(tmp_path, seed=2, **kw) as srv:
        urls = [f"{srv.url}/a", f"{srv.url}/b", f"{srv.url}/a", f"{srv.url}/a"]
        parts = nh.Parts(4)
        parts.set(0, range(k), [o for o, _ in at_a], [z for _, z in at_a], size_a, mtime, '"no-etag-sent"')
        parts.set(1, range(k, n), [o for o, _ in at_b], [z for _, z in at_b], size_b + 1, mtime)  # another size
        parts.set(3, [0], [at_a[0][0]], [at_a[0][1]], size_a, mtime + 5)  # another Last-Modified
        seen = {}
        with native.Arrivals("zstd", n, nb, _placed(n, shape), out, np.dtype("<u2"), None, 4,
                             np.empty(4 * nb, np.uint8)) as arr:
            off = nh.Handoff()
            off.cell[0] = arr.handle

            def done(i):
                seen[i] = [int(arr.status[c]) for c in range(n)]
            dests = [np.zeros(size_b + size_a, np.uint8) for _ in range(4)]
            r = nh.HttpClient(backoff_s=0.001).fetch(urls, _reqs([(0, -1)] * 4), dests, 4, done,
                                                     sink=nh.Sink(off, np.full(4, -1, np.int64)), parts=parts)
        st, _ = arr.close()
    assert [int(x) for x in r["status"]] == [200] * 4 and [int(x) for x in r["added"]] == [k, 0, 0, 0]
    assert all(s != native.Arrivals.NOT_ADDED for s in seen[0][:k])  # handed before the answer was reported
    for c in range(k):
        assert st[c] == native.OK and np.array_equal(out[c * shape[0]:(c + 1) * shape[0]], raw_a[c])
    assert (st[k:] == native.Arrivals.NOT_ADDED).all() and (out[k * shape[0]:] == 99).all()
    assert bytes(dests[1][:int(r["got"][1])]) == (tmp_path / "b").read_bytes()  # the caller's, whole
    if fault:
        assert r["attempts"].max() > 1


def test_a_retry_that_brings_another_object_after_parts_were_handed_stops(tmp_path):
    """The first answer is cut short after some parts were handed; the object is rewritten
    (another size) before the retry: the request ends with status CHANGED, the parts handed
    are decoded from the first object's bytes, and nothing of the second is written over them."""
    import os
    import time

    from gpu_zarr.engine import native

    rng = np.random.default_rng(4)
    k, shape = 16, (64, 64)
    raw, at = _shard_like(tmp_path, "s", rng, k, shape)
    size, mtime = (tmp_path / "s").stat().st_size, int(os.stat(tmp_path / "s").st_mtime)
    first = (tmp_path / "s").read_bytes()
    nb = raw[0].nbytes
    out = np.full((k * shape[0], shape[1]), 99, np.uint16)
    with RangeServer(tmp_path, fail_truncate=1.0) as srv:
        def rewrite():  # once the first answer was served, before its retry
            while not any("end" in e for e in list(srv.log)):
                time.sleep(0.005)
            (tmp_path / "s").write_bytes(b"x" * (size + 100))
        t = threading.Thread(target=rewrite)
        t.start()
        parts = nh.Parts(1)
        parts.set(0, range(k), [o for o, _ in at], [z for _, z in at], size, mtime)
        with native.Arrivals("zstd", k, nb, _placed(k, shape), out, np.dtype("<u2"), None, 2,
                             np.empty(2 * nb, np.uint8)) as arr:
            off = nh.Handoff()
            off.cell[0] = arr.handle
            dest = np.zeros(size + 200, np.uint8)
            r = nh.HttpClient(backoff_s=0.3).fetch([f"{srv.url}/s"], _reqs([(0, -1)]), [dest], 1, None,
                                                   sink=nh.Sink(off, np.full(1, -1, np.int64)), parts=parts)
        st, _ = arr.close()
        t.join()
    handed = int(r["added"][0])
    assert int(r["status"][0]) == nh.CHANGED and int(r["attempts"][0]) == 2
    assert 0 < handed < k  # half of the first body came: the parts inside it
    for c in range(handed):
        assert st[c] == native.OK and np.array_equal(out[c * shape[0]:(c + 1) * shape[0]], raw[c])
    assert (st[handed:] == native.Arrivals.NOT_ADDED).all()
    end = at[handed - 1][0] + at[handed - 1][1]
    assert bytes(dest[:end]) == first[:end]


def test_parts_are_checked_when_set():
    p = nh.Parts(3)
    with pytest.raises(ValueError, match="order of their ends"):
        p.set(0, [0, 1], [100, 0], [10, 10], 200, -1)
    with pytest.raises(ValueError, match="inside the object"):
        p.set(0, [0], [0], [300], 200, -1)
    p.set(1, [0], [0], [10], 200, -1)
    with pytest.raises(ValueError, match="once per request, in order"):
        p.set(0, [1], [0], [10], 200, -1)
    with pytest.raises(ValueError, match="give the sink too"):
        nh.HttpClient().fetch(["http://127.0.0.1:9/x"] * 3, _reqs([(0, -1)] * 3), [np.zeros(10, np.uint8)] * 3, 1,
                              parts=p)


@pytest.mark.parametrize("fault", [None, "fail_reset"])
def test_parts_published_while_the_fetch_runs_are_handed_from_then_on(tmp_path, fault):
    """A whole object and its tail (a shard and its index) in one fetch: once the tail is in,
    the parts are published for the whole request from its ``on_done``, and the bytes that
    arrive after (and those already in) hand them -- the body comes slowly here, so most are
    handed before it is complete; every part handed once and decoded right."""
    import os

    from gpu_zarr.engine import native

    rng = np.random.default_rng(5)
    k, shape = 24, (32, 64)
    raw, at = _shard_like(tmp_path, "s", rng, k, shape)
    size, mtime = (tmp_path / "s").stat().st_size, int(os.stat(tmp_path / "s").st_mtime)
    nb = raw[0].nbytes
    out = np.full((k * shape[0], shape[1]), 99, np.uint16)
    kw = {fault: 0.3} if fault else {}
    with RangeServer(tmp_path, trickle=(2048, 0.002), seed=4, **kw) as srv:
        parts = nh.Parts(2, late=True)
        with native.Arrivals("zstd", k, nb, _placed(k, shape), out, np.dtype("<u2"), None, 2,
                             np.empty(2 * nb, np.uint8)) as arr:
            off = nh.Handoff()
            off.cell[0] = arr.handle
            reqs = _reqs([(0, -1), (-64, 0)])

            def done(i):
                if i == 1:  # the tail: the parts of request 0 are known now
                    parts.publish(0, range(k), [o for o, _ in at], [z for _, z in at], size, mtime)
                    with pytest.raises(ValueError, match="published once"):
                        parts.publish(0, [0], [0], [1], size, mtime)
            dests = [np.zeros(size + 64, np.uint8), np.zeros(64, np.uint8)]
            nh.HttpClient(backoff_s=0.001).fetch([f"{srv.url}/s"] * 2, reqs, dests, 2, done,
                                                 sink=nh.Sink(off, np.full(2, -1, np.int64)), parts=parts, agents=1)
        st, _ = arr.close()
    assert [int(x) for x in reqs["status"]] == [200, 206]
    assert 0 < int(reqs["added"][0]) <= k and int(reqs["added"][1]) == 0
    handed = int(reqs["added"][0])
    for c in range(handed):
        assert st[c] == native.OK and np.array_equal(out[c * shape[0]:(c + 1) * shape[0]], raw[c])
    assert (st[handed:] == native.Arrivals.NOT_ADDED).all()
    with pytest.raises(ValueError, match="late=True"):
        nh.Parts(1).publish(0, [0], [0], [1], 10, -1)
