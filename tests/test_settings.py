"""gpu_zarr.settings: every process switch read there, from its GPU_ZARR_* variable, and obeyed
where it acts (the native library, the native HTTP client, nvCOMP's library, progress bars,
the sample cache)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_zarr import settings
from gpu_zarr.engine import native
from gpu_zarr.engine.sources import http

SRC = str(Path(__file__).resolve().parents[1] / "src")
SWITCHES = {  # setting -> its environment variable
    "native": "GPU_ZARR_NATIVE", "native_library": "GPU_ZARR_NATIVE_LIB", "native_http": "GPU_ZARR_NATIVE_HTTP",
    "nvcomp_library": "GPU_ZARR_NVCOMP_LIBRARY", "progress": "GPU_ZARR_PROGRESS", "cache_dir": "GPU_ZARR_CACHE",
}


def _child(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter on this tree's ``src``, our variables cleared, then ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPU_ZARR_")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**base, "PYTHONPATH": SRC, **env})


def _settings_in_child(env: dict[str, str]) -> dict:
    out = _child("import json; from gpu_zarr import settings; print(json.dumps(settings.snapshot()))", env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_environment_sets_each_switch(tmp_path):
    got = _settings_in_child({"GPU_ZARR_NATIVE": "0", "GPU_ZARR_NATIVE_LIB": "/x/libgz.so",
                              "GPU_ZARR_NATIVE_HTTP": " Off ", "GPU_ZARR_NVCOMP_LIBRARY": "/y/libnvcomp.so.6",
                              "GPU_ZARR_PROGRESS": "0", "GPU_ZARR_CACHE": str(tmp_path)})
    assert {k: got[k] for k in SWITCHES} == {
        "native": False, "native_library": "/x/libgz.so", "native_http": False,
        "nvcomp_library": "/y/libnvcomp.so.6", "progress": "off", "cache_dir": str(tmp_path)}
    assert {k: _settings_in_child({})[k] for k in SWITCHES} == {
        "native": True, "native_library": "", "native_http": True, "nvcomp_library": "", "progress": "auto",
        "cache_dir": ""}


@pytest.mark.parametrize(("raw", "switch", "progress"), [
    ("0", False, "off"), ("off", False, "off"), ("FALSE", False, "off"), (" no ", False, "off"),
    ("1", True, "on"), ("on", True, "on"), ("True", True, "on"), ("yes", True, "on"),
    ("", True, "auto"),
])
def test_the_words_a_switch_accepts(raw, switch, progress):
    got = _settings_in_child({"GPU_ZARR_NATIVE": raw, "GPU_ZARR_NATIVE_HTTP": raw, "GPU_ZARR_PROGRESS": raw})
    assert (got["native"], got["native_http"], got["progress"]) == (switch, switch, progress)
    if raw == "":
        assert _settings_in_child({"GPU_ZARR_PROGRESS": "auto"})["progress"] == "auto"


@pytest.mark.parametrize(("var", "raw"), [("GPU_ZARR_NATIVE", "of"), ("GPU_ZARR_NATIVE_HTTP", "2"),
                                          ("GPU_ZARR_PROGRESS", "sometimes")])
def test_an_invalid_switch_is_refused_by_name(var, raw):
    out = _child("import gpu_zarr.settings", {var: raw})
    assert out.returncode != 0
    assert "ValueError" in out.stderr and f"{var}={raw!r}" in out.stderr, out.stderr


def test_set_checks_each_switch():
    for bad in ({"native": "0"}, {"native_http": 1}, {"progress": "yes"}, {"progress": True},
                {"native_library": None}, {"nvcomp_library": Path("/x")}, {"cache_dir": Path("/x")}):
        with pytest.raises(ValueError, match="out of range"):
            settings.set(**bad)
    with settings.set(progress="on", cache_dir="/c", native_library="/n", nvcomp_library="/v"):
        assert settings.get("progress") == "on" and settings.get("cache_dir") == "/c"


def test_every_setting_has_a_row_in_the_table():
    """The module docstring's table names each setting with the variable ``_defaults`` reads."""
    doc = settings.__doc__ or ""
    source = Path(settings.__file__).read_text()
    for name in settings.names():
        row = re.search(rf"^{name} +``(GPU_ZARR_[A-Z0-9_]+)``", doc, re.M)
        assert row, f"no row for {name!r} in the settings table"
        assert re.search(rf'"{name}": .*"{row[1]}"', source), f"{name}: {row[1]} is not what is read"
    for name, var in SWITCHES.items():
        assert re.search(rf"^{name} +``{var}``", doc, re.M), name


# --- each switch obeyed where it acts ----------------------------------------------------------

def test_native_off_is_asked_at_each_decision():
    from gpu_zarr.engine.ops import CpuOps
    from gpu_zarr.engine.sources.files import make_reader

    with settings.set(native=False, native_http=True):
        assert not native.available() and native.library() is None
        assert "native setting" in native.status().reason and "GPU_ZARR_NATIVE=0" in native.status().reason
        assert not native.codec_available("raw")
        assert make_reader("cpu-auto", 2).name == "threads" and CpuOps().native is False
        assert not http.available() and "native library is not loaded" in http.status()


@pytest.mark.skipif(not native.available(), reason=f"native library: {native.status().reason}")
def test_native_on_again_after_off():
    with settings.set(native=False):
        assert not native.available()
    assert native.available() and native.library() is not None


def test_native_off_in_a_child_loads_nothing():
    code = ("from gpu_zarr.engine import native; assert not native.available(); "
            "assert native._load.cache_info().currsize == 0, 'loaded while off'\n"
            "try:\n    native.loaded()\nexcept RuntimeError as e:\n    print(e)\nelse:\n    raise SystemExit('no error')")
    out = _child(code, {"GPU_ZARR_NATIVE": "0"})
    assert out.returncode == 0, out.stderr
    assert "GPU_ZARR_NATIVE=0" in out.stdout


@pytest.mark.skipif(not native.available(), reason=f"native library: {native.status().reason}")
def test_native_library_names_the_library_loaded(tmp_path):
    copy = tmp_path / "libgz_copy.so"
    shutil.copyfile(native.status().path, copy)
    out = _child("from gpu_zarr.engine import native; print(native.status().path)", {"GPU_ZARR_NATIVE_LIB": str(copy)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(copy)


def test_native_http_off_turns_the_client_off():
    with settings.set(native_http=False):
        assert not http.available()
        assert "turned off by the native_http setting" in http.status() and "obstore" in http.status()
        assert http.client_for("https", {}) is None
    with settings.set(native_http=True):  # (on again, where libcurl loads: the client serves)
        if native.available() and http._lib(native.library())[0] is not None:
            assert http.available() and http.client_for("https", {}) is not None


def test_native_http_off_in_a_child():
    out = _child("from gpu_zarr.engine.sources import http; print(http.status())", {"GPU_ZARR_NATIVE_HTTP": "0"})
    assert out.returncode == 0, out.stderr
    assert "GPU_ZARR_NATIVE_HTTP=0" in out.stdout and out.stdout.startswith("obstore")


def test_nvcomp_library_is_tried_first():
    from gpu_zarr.engine import nvcomp_batch

    with settings.set(nvcomp_library="/nowhere/libnvcomp.so.6"):
        assert nvcomp_batch._candidates()[0] == "/nowhere/libnvcomp.so.6"
    with settings.set(nvcomp_library=""):
        assert "/nowhere/libnvcomp.so.6" not in nvcomp_batch._candidates()


def test_progress_setting_decides_auto(monkeypatch):
    from gpu_zarr import progress as gp

    monkeypatch.setattr(gp, "_stderr_is_terminal", lambda: True)
    with settings.set(progress="off"), gp.progress_callback("auto") as got:
        assert got is None
    with settings.set(progress="auto"), gp.progress_callback("auto") as got:
        assert isinstance(got, gp.TqdmProgress)
    with settings.set(progress="off"), gp.progress_callback(True) as got:  # True: always a bar
        assert isinstance(got, gp.TqdmProgress)


def test_cache_dir_setting(tmp_path, monkeypatch):
    from gpu_zarr.sample import default_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with settings.set(cache_dir=str(tmp_path / "c")):
        assert default_cache_dir() == tmp_path / "c"
    with settings.set(cache_dir=""):
        assert default_cache_dir() == tmp_path / "xdg" / "napari-gpu-zarr"
    out = _child("from gpu_zarr.sample import default_cache_dir; print(default_cache_dir())",
                 {"GPU_ZARR_CACHE": str(tmp_path / "e")})
    assert out.returncode == 0 and out.stdout.strip() == str(tmp_path / "e"), out.stderr
