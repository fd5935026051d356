"""The GUI-free loader controller: choices, loads in a thread, cancel, history, best speeds."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import zarr

from gpu_zarr.capabilities import Capabilities, probe
from gpu_zarr.controller import LoaderController, RunRecord
from gpu_zarr.lazy import BACKENDS, GpuLazyArray
from gpu_zarr.sample import write_sample_omezarr


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    return write_sample_omezarr(tmp_path_factory.mktemp("c") / "img.ome.zarr", shape=(2, 8, 64, 48),
                                levels=3, chunks=(1, 2, 32, 32), seed=3)


NO_GPU = Capabilities(notes=["cupy is not installed"])
FAKE_GPU = Capabilities(cupy=True, gpu=True, device_name="Fake GPU", free_bytes=2**34, total_bytes=2**35,
                        kvikio=True, kvikio_compat=True, nvcomp=True)


def test_backend_options_follow_capabilities():
    for caps in (NO_GPU, FAKE_GPU, probe()):
        ctl = LoaderController(caps)
        opts = ctl.backend_options()
        assert [o.name for o in opts] == list(BACKENDS)
        for o in opts:
            assert (o.available, o.reason) == caps.backend_status(o.name)
            assert o.label == (o.name if o.available else f"{o.name} (unavailable)")
    ctl = LoaderController(NO_GPU)
    with pytest.raises(ValueError, match="unavailable here: cupy is not installed"):
        ctl.set_backend("kvikio")
    with pytest.raises(ValueError, match="unknown backend"):
        ctl.set_backend("fast")
    assert ctl.backend == "auto"
    assert ctl.resident_status()[0] is False and "needs a CUDA GPU" in ctl.resident_status()[1]
    assert ctl.device_text().startswith("No usable GPU")
    gpu = LoaderController(FAKE_GPU)
    gpu.set_backend("kvikio")
    assert gpu.backend == "kvikio" and gpu.resident_status()[0] and gpu.device_text().startswith("GPU: Fake GPU")


def test_levels_from_an_ome_image_and_a_plain_array(image):
    ctl = LoaderController(NO_GPU)
    assert ctl.level_options() == [] and ctl.prepare() is None
    with pytest.raises(ValueError, match="no source"):
        ctl.set_level(0)
    ctl.open(image)
    assert ctl.name == "img"
    labels = [o.label for o in ctl.level_options()]
    assert labels[0].startswith("0: 2×8×64×48 uint16") and labels[2].startswith("2: 2×8×16×12 uint16")
    assert [o.nbytes for o in ctl.level_options()] == [zarr.open_array(str(image / str(i))).nbytes for i in range(3)]
    ctl.set_level(2)
    with pytest.raises(IndexError, match="levels 0..2"):
        ctl.set_level(3)
    ctl.open(zarr.open_array(str(image / "1"), mode="r"), name="one")
    assert ctl.name == "one" and len(ctl.levels) == 1 and ctl.level == 0
    ctl.open(str(image / "2"))
    assert ctl.name == "2" and ctl.levels[0].shape == (2, 8, 16, 12)
    with pytest.raises(TypeError, match="expected a path"):
        ctl.open(42)


def test_choice_text(image):
    ctl = LoaderController(NO_GPU)
    assert ctl.choice_text() == NO_GPU.backend_status("auto")[1]  # nothing opened yet
    ctl.open(image)
    ctl.set_backend("cpu")
    from gpu_zarr.engine import native

    if native.available():  # the image's levels are zstd zarr v3: the native host path reads them
        assert ctl.choice_text().startswith("→ cpu: forced: native host path (zstd zarr v3")
    else:
        assert ctl.choice_text().startswith("→ cpu: forced: numpy via zarr-python")


def test_load_in_a_thread_records_history_and_best(image):
    ctl = LoaderController(keep_data=True)
    ctl.open(image)
    ctl.set_backend("cpu")
    ctl.set_level(1)
    progress, finished = [], []
    job = ctl.prepare(on_progress=lambda d, t: progress.append((d, t)), on_finish=finished.append)
    assert ctl.busy and ctl.prepare() is None  # one load at a time
    assert all(lv.backend == "cpu" for lv in ctl.levels)  # browsing follows the choice
    main = threading.current_thread()
    seen_threads = []
    job.on_finish = lambda j: (seen_threads.append(threading.current_thread()), finished.append(j))
    rec = job.start().wait(30)
    assert job.finished and not ctl.busy and finished == [job] and seen_threads[0] is not main
    level1 = zarr.open_array(str(image / "1"), mode="r")
    assert isinstance(rec, RunRecord) and rec.ok
    assert (rec.layer, rec.level, rec.requested, rec.backend, rec.nbytes, rec.gpu_bytes) == \
        ("img", 1, "cpu", "cpu", level1.nbytes, 0)
    assert rec.seconds > 0 and rec.gib_per_s > 0 and not rec.resident
    assert progress and progress[-1] == (level1.nbytes, level1.nbytes)
    np.testing.assert_array_equal(ctl.last_result.data, level1[...])  # keep_data
    assert ctl.history == [rec]
    # a second, slower-or-faster run: best keeps the max per backend
    ctl.set_level(2)
    rec2 = ctl.load().wait(30)
    assert rec2.ok and len(ctl.history) == 2
    assert ctl.best_gib_per_s() == {"cpu": max(rec.gib_per_s, rec2.gib_per_s)}


def test_best_ignores_failures_and_orders_backends():
    ctl = LoaderController(NO_GPU)
    mk = lambda b, g, s="ok": RunRecord("x", 0, b, b, "", 1, 1.0, g, 0, False, s)
    ctl.history += [mk("cpu", 1.0), mk("kvikio", 9.0), mk("cpu", 2.0), mk("zarr-gpu", 3.0),
                    mk("kvikio", 99.0, "cancelled")]
    assert list(ctl.best_gib_per_s().items()) == [("kvikio", 9.0), ("zarr-gpu", 3.0), ("cpu", 2.0)]


def test_cancel_before_and_during_a_load(image):
    ctl = LoaderController()
    ctl.open(image)
    ctl.set_backend("cpu")
    job = ctl.prepare()
    ctl.cancel()
    rec = job.start().wait(30)
    assert rec.status == "cancelled" and not rec.ok and ctl.history[-1] is rec and not ctl.busy
    # during: cancel from the progress callback (as a Cancel click between two reports)
    job = ctl.prepare(on_progress=lambda d, t: ctl.cancel())
    job._last_report = -1e9
    rec = job.start().wait(30)
    assert rec.status == "cancelled" and ctl.last_result is None
    assert ctl.best_gib_per_s() == {}


def test_errors_become_records(image):
    ctl = LoaderController()
    ctl.open(image)
    ctl.set_backend("cpu")
    rec = ctl.prepare(resident=True).run()  # inline, without a thread
    if probe().gpu:
        pytest.skip("has a GPU: resident mode works")
    assert rec.status.startswith("error: GPU-resident mode needs a GPU backend") and rec.resident
    assert ctl.history == [rec] and not ctl.busy


def test_source_backend_is_followed_when_available(image):
    ctl = LoaderController(NO_GPU)
    lv = GpuLazyArray(zarr.open_array(str(image / "0"), mode="r"), backend="cpu")
    ctl.set_source("layer", [lv])
    assert ctl.backend == "cpu" and ctl.name == "layer"
    lv2 = GpuLazyArray(zarr.open_array(str(image / "0"), mode="r"), backend="kvikio")
    ctl.set_source("other", [lv2])
    assert ctl.backend == "cpu"  # kvikio unavailable here: the choice stays
    ctl.set_source(None, None)
    assert ctl.name is None and ctl.levels == []


def test_release_resident_counts_bytes(image):
    ctl = LoaderController()
    ctl.open(image)
    assert ctl.release_resident() == 0


def test_record_is_frozen_and_displays():
    rec = RunRecord("a<b>", 0, "cpu", "cpu", "why & how", 2**20, 0.5, 0.002, 0, False, "ok")
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.status = "x"  # type: ignore[misc]
    b = rec._repr_mimebundle_()
    assert "a&lt;b&gt;" in b["text/html"] and "why &amp; how" in b["text/html"]
    assert "1.0 MiB in 0.500 s" in b["text/plain"]
