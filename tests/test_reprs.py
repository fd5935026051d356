"""Notebook reprs: cheap, no I/O, escaped, and saying what the issue asks for."""

from __future__ import annotations

import builtins
import html.parser

import numpy as np
import pytest
import zarr

from gpu_zarr import reprs
from gpu_zarr.capabilities import Capabilities, probe
from gpu_zarr.controller import RunRecord
from gpu_zarr.omezarr import open_ome
from gpu_zarr.sample import write_sample_omezarr
from gpu_zarr.zarr_io import ReadResult, read_zarr
from stores import write


class _Checker(html.parser.HTMLParser):
    """Well-formed enough: every opened non-void tag is closed, in order."""

    VOID = frozenset({"br", "img", "hr", "meta", "input", "line", "rect"})

    def __init__(self):
        super().__init__()
        self.stack = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        assert self.stack and self.stack[-1] == tag, (tag, self.stack)
        self.stack.pop()


def _well_formed(text: str) -> None:
    c = _Checker()
    c.feed(text)
    c.close()
    assert c.stack == [], c.stack


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    return write_sample_omezarr(tmp_path_factory.mktemp("r") / "cells<&>.ome.zarr", shape=(2, 4, 32, 32),
                                levels=2, chunks=(1, 2, 16, 16), seed=1)


def test_read_result_repr(image, monkeypatch):
    arr = zarr.open_array(str(image / "0"), mode="r")
    r = read_zarr(arr, prefer="cpu", progress=False)
    monkeypatch.setattr(builtins, "open", lambda *a, **k: (_ for _ in ()).throw(AssertionError("I/O")))
    b = r._repr_mimebundle_()
    assert set(b) == {"text/plain", "text/html"} and r._repr_html_() == b["text/html"]
    for key in ("backend", "why", "throughput", "GPU memory", "data in"):
        assert key in b["text/plain"] and key in b["text/html"]
    assert "cpu" in b["text/plain"] and f"{r.gib_per_s:.2f} GiB/s" in b["text/html"]
    assert "2×4×32×32 uint16" in b["text/plain"] and "host memory (numpy)" in b["text/plain"]
    assert "16.0 KiB" in b["text/plain"]  # 2*4*32*32*2 bytes
    _well_formed(b["text/html"])


def test_read_result_never_touches_data():
    class Device:
        id = 3

    class FakeCupy:
        __cuda_array_interface__ = {}  # noqa: RUF012 - only its presence matters
        shape = (4, 5)
        dtype = np.dtype("float32")
        device = Device()

        def __array__(self, *a, **k):
            raise AssertionError("copied to host")

        def __repr__(self):
            raise AssertionError("repr of the data")

        def get(self):
            raise AssertionError("copied to host")

    r = ReadResult(FakeCupy(), "kvikio", "fastest path: <zstd>", 80, 0.01, 1.5, 80)
    b = r._repr_mimebundle_()
    assert "GPU memory (cupy, device 3)" in b["text/html"] and "4×5 float32" in b["text/plain"]
    assert "&lt;zstd&gt;" in b["text/html"] and "<zstd>" not in b["text/html"]
    dropped = ReadResult(None, "cpu", "x", 0, 0.0, 0.0, 0)
    assert "not kept" in dropped._repr_mimebundle_()["text/plain"]


def test_capabilities_repr():
    caps = Capabilities(notes=["cupy is <missing>"])
    b = caps._repr_mimebundle_()
    assert b["text/plain"].endswith(caps.report())
    h = b["text/html"]
    for name in ("auto", "kvikio", "zarr-gpu", "cpu"):
        assert f"<code>{name}</code>" in h
        assert reprs._e(caps.backend_status(name)[1]) in h
    assert "none usable (cupy not installed)" in h and "cupy is &lt;missing&gt;" in h
    gpu = Capabilities(cupy=True, gpu=True, device_name="NVIDIA H200", free_bytes=100 * 2**30,
                       total_bytes=140 * 2**30, kvikio=True, kvikio_compat=True, nvcomp=True)
    h = gpu._repr_html_()
    assert "NVIDIA H200, 100.0 of 140.0 GiB free" in h and "compat (POSIX) mode" in h
    assert "installed (GPU zstd decode)" in h
    _well_formed(h)
    _well_formed(probe()._repr_html_())


def test_ome_image_repr(image, monkeypatch):
    img = open_ome(image)
    monkeypatch.setattr(builtins, "open", lambda *a, **k: (_ for _ in ()).throw(AssertionError("I/O")))
    b = img._repr_mimebundle_()
    t, h = b["text/plain"], b["text/html"]
    assert "cells&lt;&amp;&gt;" in h and "cells<&>" not in h  # the name is escaped
    assert "0.5" in t and "z (micrometer)" in t
    assert "micrometer" in h and "channel" in h
    assert "2×4×32×32" in h and "2×4×16×16" in h  # level shapes
    assert "1×2×16×16" in h  # chunks
    assert "zstd(level=3)" in h and "zstd(level=3)" in t  # codecs
    assert "#FF00FF" in h and "background:#FF00FF" in h and "nuclei" in h and "membranes" in h
    assert "blobs" in h  # label image
    assert "z 2, y 0.5, x 0.5" in h and "y 1, x 1" in h  # pixel sizes per level
    _well_formed(h)


def test_level_codecs_and_shards(tmp_path):
    from zarr.codecs import BloscCodec

    assert reprs.codec_names(write(tmp_path / "r2", fmt=2)[0]) == ("raw",)
    assert reprs.codec_names(write(tmp_path / "r3", fmt=3)[0]) == ("raw",)
    a = write(tmp_path / "z2", fmt=2, codec="zstd")[0]
    assert reprs.codec_names(a) == ("zstd(level=1)",)
    b = zarr.create_array(str(tmp_path / "b"), shape=(8, 8), chunks=(4, 4), shards=(8, 8), dtype="u2",
                          compressors=BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle"))
    assert reprs.codec_names(b) == ("blosc(cname=zstd, clevel=3, shuffle=bitshuffle)",)


def test_history_and_chart():
    recs = [RunRecord("img", 1, "auto", "cpu", "no <GPU>", 2**21, 0.25, 0.0078, 0, False, "ok"),
            RunRecord("img", 0, "cpu", "", "cancelled", 0, 0.0, 0.0, 0, False, "cancelled")]
    h = reprs.history_html(recs)
    assert h.count("class='gpu-zarr-run'") == 2 and "title='no &lt;GPU&gt;'" in h
    assert "<td style" in h and ">2.0<" in h and ">cancelled<" in h
    _well_formed(h)
    t = reprs.history_text(recs)
    assert t.splitlines()[0].split()[:3] == ["Image", "Level", "Asked"] and len(t.splitlines()) == 3
    assert "no load yet" in reprs.history_html([])
    svg = reprs.best_chart_svg({"kvikio": 30.0, "cpu": 0.5})
    assert svg.count("class='gpu-zarr-bar'") == 2 and "data-backend='kvikio'" in svg and ">30.00<" in svg
    assert "load a level" in reprs.best_chart_svg({})
    _well_formed(svg)


def test_format_bytes():
    assert reprs.format_bytes(512) == "512 B"
    assert reprs.format_bytes(1536) == "1.5 KiB"
    assert reprs.format_bytes(3 * 2**30) == "3.0 GiB"
    assert reprs.format_bytes(None) == "?"
