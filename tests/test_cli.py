"""The gpu-zarr command on a machine as CI has it (no GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

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
    assert out.returncode == 2 and "not a zarr" in out.stderr
