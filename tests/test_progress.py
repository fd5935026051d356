"""progress= values, the bars, and interrupted reads (CPU path and the engine's CPU twin)."""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc

import numpy as np
import pytest
import zarr

from gpu_zarr import progress as gp
from gpu_zarr import settings
from gpu_zarr.errors import ReadCancelled
from gpu_zarr.zarr_io import read_zarr
from stores import write


@pytest.fixture(scope="module")
def arr(tmp_path_factory):
    a, _ = write(tmp_path_factory.mktemp("p") / "a.zarr", fmt=3, codec="zstd", shape=(64, 128, 128),
                 chunks=(4, 64, 64), partial=False)
    return a


def test_callable_none_false_and_bad_values():
    calls = []
    cb = lambda d, t: calls.append((d, t))
    with gp.progress_callback(cb) as got:
        assert got is cb
    for off in (None, False):
        with gp.progress_callback(off) as got:
            assert got is None
    with pytest.raises(ValueError, match="progress must be"), gp.progress_callback("yes"):
        pass


def test_auto_is_off_by_setting_and_without_a_terminal(monkeypatch):
    with settings.set(progress="off"), gp.progress_callback("auto") as got:  # GPU_ZARR_PROGRESS=0
        assert got is None
    monkeypatch.setattr(gp, "_stderr_is_terminal", lambda: False)
    with settings.set(progress="auto"), gp.progress_callback("auto") as got:  # not a terminal
        assert got is None
    with settings.set(progress="on"), gp.progress_callback("auto") as got:  # GPU_ZARR_PROGRESS=1
        assert isinstance(got, gp.TqdmProgress) and got.delay == gp.AUTO_DELAY_S and not got.notebook


def test_auto_in_a_notebook_uses_the_notebook_bar(monkeypatch):
    monkeypatch.setattr(gp, "in_notebook", lambda: True)
    with gp.progress_callback("auto") as got:
        assert isinstance(got, gp.TqdmProgress) and got.notebook and got.delay == gp.AUTO_DELAY_S


def test_in_notebook_is_false_here():
    assert gp.in_notebook() is False


def test_text_bar_shows_bytes_and_rate(arr, capsys):
    r = read_zarr(arr, prefer="cpu", progress=True)
    err = capsys.readouterr().err
    assert r.nbytes == arr.nbytes
    assert "gpu_zarr read" in err and "100%" in err
    assert "MiB" in err and "iB/s" in err  # binary units: ... MiB/s or GiB/s


def test_auto_bar_waits_a_second(arr, capsys):
    with settings.set(progress="on"):
        read_zarr(arr, prefer="cpu")  # default "auto": a fast read shows nothing
    assert "gpu_zarr read" not in capsys.readouterr().err

    def slow(done, total):
        time.sleep(0.08)

    bar = gp.TqdmProgress(delay=0.5)
    for k in range(1, 11):
        bar(k * 100, 1000)
        slow(k, 10)
    bar.close()
    assert "gpu_zarr read" in capsys.readouterr().err


def _interrupting(after: int):
    seen = []

    def cb(done, total):
        seen.append(done)
        if len(seen) >= after:
            raise KeyboardInterrupt

    return cb, seen


def test_keyboard_interrupt_cancels_a_cpu_read_and_frees_it(arr):
    read_zarr(arr, prefer="cpu", progress=False)  # warm-up: zarr's event-loop thread exists now
    gc.collect()
    threads_before = set(threading.enumerate())
    cb, seen = _interrupting(after=3)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with pytest.raises(KeyboardInterrupt) as excinfo:
            read_zarr(arr, prefer="cpu", progress=cb)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(seen) == 3  # stopped at the third slab, did not read on
    # the traceback is still alive (as in IPython's sys.last_traceback), the 2 MiB
    # partial output is not
    assert excinfo.value.__traceback__ is not None
    assert held < arr.nbytes // 4, held
    time.sleep(0.1)
    new = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    assert not new, new
    np.testing.assert_array_equal(read_zarr(arr, prefer="cpu", progress=False).data, arr[...])


def test_keyboard_interrupt_in_the_engine_waits_for_reads_in_flight(arr, monkeypatch):
    from gpu_zarr.engine import EngineOptions, read
    from gpu_zarr.engine.sources import files as fetch

    active = [0, 0]  # reads running now, reads done in all
    lock = threading.Lock()
    real = fetch._read_task

    def counted(*a, **k):
        with lock:
            active[0] += 1
        try:
            time.sleep(0.002)  # keep reads in flight when the interrupt comes
            return real(*a, **k)
        finally:
            with lock:
                active[0] -= 1
                active[1] += 1

    monkeypatch.setattr(fetch, "_read_task", counted)
    threads_before = set(threading.enumerate())
    cb, seen = _interrupting(after=2)
    opts = EngineOptions(batch_bytes=64 * 1024, slots=3, threads=4, progress=cb)
    with pytest.raises(KeyboardInterrupt):
        read(arr, device="cpu", options=opts)
    assert len(seen) == 2
    with lock:
        running, done = active
    assert running == 0  # every read in flight finished before the interrupt went on
    time.sleep(0.3)
    assert active[1] == done  # and no queued read started afterwards
    # the only threads added are the engine's idle, reused pool workers
    new = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
    assert all(t.name.startswith("gpu-zarr-") for t in new), new
    monkeypatch.undo()
    np.testing.assert_array_equal(read(arr, device="cpu").data, arr[...])


def test_cancel_event_also_releases(arr):
    ev = threading.Event()

    def cb(done, total):
        ev.set()

    with pytest.raises(ReadCancelled):
        read_zarr(arr, prefer="cpu", progress=cb, cancel=ev)


def test_zarr_reference_is_untouched(arr):
    # reads never write: the store's metadata is as written
    assert zarr.open_array(arr.store_path.store.root / arr.path, mode="r").shape == arr.shape
