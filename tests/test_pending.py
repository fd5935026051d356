"""Requests left running in the background end before the interpreter does (gpu_zarr.pending).

obstore delivers a request's end from a Rust thread that calls into Python; a metadata
prefetch still under way when the interpreter was torn down crashed the process at exit
(a segmentation fault on the GPU machine, 3 runs in 5 of the remote suites).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from gpu_zarr import pending


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def _start(loop, seconds: float):
    async def start():
        return pending.track(asyncio.ensure_future(asyncio.sleep(seconds, "slept")))
    return asyncio.run_coroutine_threadsafe(start(), loop).result()


def test_drain_waits_for_what_ends_and_cancels_what_does_not(loop):
    pending.drain(wait_s=10)  # (anything another test left under way)
    quick, stuck = _start(loop, 0.3), _start(loop, 60)
    assert pending.under_way() == 2
    t = time.monotonic()
    assert pending.drain(wait_s=0.8, grace_s=0.1) == 1
    took = time.monotonic() - t
    assert 0.8 <= took < 5
    assert quick.done() and not quick.cancelled() and quick.result() == "slept"
    assert stuck.cancelled()
    assert pending.under_way() == 0


def test_drain_with_nothing_under_way_does_not_wait():
    pending.drain(wait_s=10)
    t = time.monotonic()
    assert pending.drain() == 0
    assert time.monotonic() - t < 0.1


def test_exit_waits_for_metadata_fetched_ahead(tmp_path):
    """A process that opens a remote OME-Zarr's root and exits at once: its levels' metadata,
    asked for ahead (by obstore here), are answered before the interpreter goes, and the
    process exits cleanly."""
    pytest.importorskip("obstore")
    pytest.importorskip("zarr")
    from gpu_zarr.bench.remote_server import RangeServer
    from gpu_zarr.sample import write_sample_omezarr

    write_sample_omezarr(tmp_path / "a.ome.zarr", version="0.5", shape=(2, 4, 64, 64), levels=3, labels=False,
                         compressor="zstd", chunks=(1, 4, 32, 32))
    code = textwrap.dedent("""
        import atexit, sys, time
        atexit.register(lambda: print("exited after", round(time.monotonic() - sys.modules["__main__"].T, 3)))
        from gpu_zarr import pending
        from gpu_zarr.store import open_node
        open_node(sys.argv[1])
        print("under way", pending.under_way(), flush=True)
        T = time.monotonic()
    """)
    with RangeServer(tmp_path, latency=0.5) as srv:
        env = {**os.environ, "GPU_ZARR_NATIVE_HTTP": "0"}
        out = subprocess.run([sys.executable, "-c", code, f"{srv.url}/a.ome.zarr"], capture_output=True, text=True,
                             timeout=120, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        lines = dict(line.rsplit(" ", 1) for line in out.stdout.splitlines())
        assert int(lines["under way"]) >= 1, out.stdout
        # the levels' documents (0.5 s a request) were waited for, within drain's bound
        assert 0.2 <= float(lines["exited after"]) <= pending.WAIT_S + pending.GRACE_S + 1, out.stdout
        levels = {e["path"] for e in srv.log if e["path"].endswith("/0/zarr.json")}
        assert levels, [e["path"] for e in srv.log]
