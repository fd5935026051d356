"""The gpu-zarr command on a machine as CI has it (no GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stores import write


def _run(*args, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "gpu_zarr.cli", *args], capture_output=True, text=True,
                          timeout=600, env=e)


def test_info():
    out = _run("info")
    assert out.returncode == 0 and "backends:" in out.stdout


def test_demo_writes_sample_and_reports(tmp_path):
    out = _run("demo", env={"GPU_ZARR_CACHE": str(tmp_path), "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "Backend used:" in out.stdout and "GiB/s" in out.stdout
    assert any(tmp_path.iterdir())


def test_read_plain_array_and_errors(tmp_path):
    write(tmp_path / "a.zarr", codec="zstd")
    out = _run("read", str(tmp_path / "a.zarr"), "--backend", "cpu", "--repeat", "1", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "cpu" in out.stdout and "GiB/s" in out.stdout
    (tmp_path / "nope").mkdir()
    out = _run("read", str(tmp_path / "nope"))
    assert out.returncode == 2 and "found a folder without any of them" in out.stderr


def test_version():
    from gpu_zarr import __version__

    out = _run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"gpu-zarr {__version__} (napari-gpu-zarr)"


def test_info_path_plain_array_ome_and_plate(tmp_path):
    pytest.importorskip("ome_zarr")  # the plate writer (the oldest stack does not install it)
    from plates import write_plate

    write(tmp_path / "a.zarr", codec="zstd")
    out = _run("info", str(tmp_path / "a.zarr"))
    assert out.returncode == 0, out.stderr
    assert "array" in out.stdout and "shape" in out.stdout and "chunks" in out.stdout and "zstd" in out.stdout
    assert "backend: cpu (--backend auto):" in out.stdout  # CI has no GPU: the reason says why
    plate = write_plate(tmp_path / "plate.zarr", version="0.5")
    out = _run("info", str(plate))
    assert out.returncode == 0, out.stderr
    assert "OME-NGFF 0.5 HCS plate" in out.stdout
    assert "2 rows (A B) x 3 columns (1 2 3), 4 wells: A1 A3 B2 B3" in out.stdout
    assert "level 2 (s2): shape (2, 1, 16, 12)" in out.stdout and "channels: DAPI #0000FF, GFP #00FF00" in out.stdout
    out = _run("info", str(plate / "A" / "1"))
    assert out.returncode == 0 and "HCS well, 2 fields (0 1), shown as a 1 x 2 grid" in out.stdout


def test_read_levels_flags_and_median(tmp_path):
    pytest.importorskip("ome_zarr")  # the plate writer (the oldest stack does not install it)
    from plates import write_plate

    plate = write_plate(tmp_path / "plate.zarr", version="0.4")
    image = str(plate / "A" / "1" / "0")
    out = _run("read", image, "--level", "9")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip() == f"gpu-zarr: --level 9: {image} has 3 level(s) (0..2, or -3..-1)"
    out = _run("read", image + "/s0", "--level", "1")
    assert out.returncode == 2 and "plain zarr array" in out.stderr and "Traceback" not in out.stderr
    out = _run("read", image, "--backend", "kvikio")  # no GPU in CI: the message names the flag
    assert out.returncode == 2 and "--backend cpu" in out.stderr and "prefer=" not in out.stderr
    assert out.stderr.count("pip install") == 1
    out = _run("read", image, "--backend", "cpu", "--repeat", "3", "--level", "1", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "(median of 3 reads)" in out.stdout and "; median " in out.stdout


def test_flags_translation_and_hint_once():
    from gpu_zarr.cli import _flags
    from gpu_zarr.errors import INSTALL_HINT

    msg = f"no GPU: cupy is not installed: {INSTALL_HINT}. Use prefer='cpu', or {INSTALL_HINT}."
    assert _flags(msg) == f"no GPU: cupy is not installed: {INSTALL_HINT}. Use --backend cpu."


def test_hint_unwrapped_on_narrow_terminal(tmp_path):
    from gpu_zarr.errors import INSTALL_HINT

    out = _run("demo", env={"GPU_ZARR_CACHE": str(tmp_path), "COLUMNS": "40"})
    assert out.returncode == 0, out.stderr
    if "No usable NVIDIA GPU" in out.stdout:
        # the hint is printed whole (on one line) in the machine report and named, not repeated, later
        assert any(INSTALL_HINT in line for line in out.stdout.splitlines())
        assert out.stdout.count("No usable NVIDIA GPU here") == 1
        assert "see the note above" in out.stdout


def test_install_hint_matches_the_install():
    from gpu_zarr.errors import install_hint

    # the tests run from a checkout (src/ with pyproject.toml above it, or an editable install)
    assert install_hint().startswith('pip install -e ".[cuda13]"')
    assert "[cuda12]" in install_hint() and "[cuda12]" not in install_hint("dask")


def test_every_install_hint_is_the_install_aware_one(monkeypatch):
    """dask, remote, jupyter and the nvCOMP decoder name their extra through install_hint (a checkout
    gets ``pip install -e ".[extra]"``, never a package name it cannot install)."""
    import sys as _sys

    import pytest

    from gpu_zarr.errors import GPUUnavailable, install_hint

    assert install_hint("remote").startswith('pip install -e ".[remote]"')
    for extra in ("dask", "remote", "jupyter"):
        assert f'"napari-gpu-zarr[{extra}]"' not in install_hint(extra)

    from gpu_zarr.dask_array import to_dask

    monkeypatch.setitem(_sys.modules, "dask.array", None)
    with pytest.raises(ImportError) as exc:
        to_dask("/nowhere.zarr")
    assert install_hint("dask") in str(exc.value) and "napari-gpu-zarr[dask]" not in str(exc.value)

    from gpu_zarr.location import RemoteUnavailable
    from gpu_zarr.store import open_node

    monkeypatch.setitem(_sys.modules, "obstore.store", None)
    with pytest.raises(RemoteUnavailable) as exc2:
        open_node("http://127.0.0.1:9/none.zarr")
    assert install_hint("remote") in str(exc2.value) and "napari-gpu-zarr[remote]" not in str(exc2.value)

    import gpu_zarr.jupyter

    monkeypatch.setitem(_sys.modules, "ipywidgets", None)
    monkeypatch.delitem(gpu_zarr.jupyter.__dict__, "LoaderWidget", raising=False)
    with pytest.raises(ImportError) as exc3:
        gpu_zarr.jupyter.LoaderWidget  # noqa: B018 - the lazy attribute's import is the test
    assert install_hint("jupyter") in str(exc3.value) and "napari-gpu-zarr[jupyter]" not in str(exc3.value)

    from gpu_zarr.engine import nvcomp_batch

    monkeypatch.setitem(_sys.modules, "cupy", None)
    with pytest.raises(GPUUnavailable) as exc4:
        nvcomp_batch.BatchedDecoder("zstd")
    assert install_hint("cuda13") in str(exc4.value) and "napari-gpu-zarr[cuda13]" not in str(exc4.value)
