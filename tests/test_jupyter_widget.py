"""The notebook loader widget without a browser (the browser test is tests/test_jupyter_browser.py)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from gpu_zarr.capabilities import Capabilities
from gpu_zarr.controller import LoaderController
from gpu_zarr.sample import write_sample_omezarr

pytest.importorskip("ipywidgets")
from gpu_zarr.jupyter import LoaderWidget


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    return write_sample_omezarr(tmp_path_factory.mktemp("j") / "nb.ome.zarr", shape=(2, 8, 64, 64),
                                levels=2, chunks=(1, 4, 32, 32), seed=2)


def test_choices_mirror_the_controller(image):
    caps = Capabilities(notes=["cupy is not installed"])
    w = LoaderWidget(image, controller=LoaderController(caps, keep_data=True), level=1)
    assert [v for _, v in w.backend_select.options] == ["auto", "cpu"]  # only usable ones
    assert "<code>kvikio</code> unavailable here: cupy is not installed" in w.unavailable.value
    assert "<code>zarr-gpu</code> unavailable here" in w.unavailable.value
    assert [v for _, v in w.level_select.options] == [0, 1] and w.level_select.value == 1
    assert w.resident.disabled and "needs a CUDA GPU" in w.resident.tooltip
    w.backend_select.value = "cpu"
    assert w.controller.backend == "cpu" and "cpu: forced: " in w.reason.value
    w.level_select.value = 0
    assert w.controller.level == 0
    assert "no load yet" in w.history_html.value and "load a level" in w.chart.value


def test_click_load_then_result_history_chart(image):
    w = LoaderWidget(image, backend="cpu", level=1)
    w.load_button.click()
    rec = w.wait(60)
    assert rec is not None and rec.ok and rec.backend == "cpu"
    level1 = zarr.open_array(str(image / "1"), mode="r")
    np.testing.assert_array_equal(w.result.data, level1[...])
    assert "GiB/s" in w.result_html.value and "cpu" in w.result_html.value
    assert w.history_html.value.count("class='gpu-zarr-run'") == 1
    assert "data-backend='cpu'" in w.chart.value
    assert w.progress.value == 1.0 and w.progress.bar_style == "success"
    assert not w.load_button.disabled and w.cancel_button.disabled
    w.load()
    w.wait(60)
    assert w.history_html.value.count("class='gpu-zarr-run'") == 2 and len(w.history) == 2


def test_cancel_marks_the_run(image):
    w = LoaderWidget(image, backend="cpu")
    job = w.controller.prepare(on_progress=w._on_progress, on_finish=w._on_finish)
    w._job = job
    w.cancel()
    job.start().wait(60)
    assert w.history[-1].status == "cancelled" and "Cancelled." in w.result_html.value
    assert w.progress.bar_style == "warning"


def test_empty_widget_cannot_load():
    w = LoaderWidget()
    assert w.load_button.disabled and w.load() is None and w.wait() is None
