"""``pytest -ra`` prints the GPU skip once (tests/conftest.py folds them), not once per file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_zarr.capabilities import probe

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(probe().gpu, reason="a GPU is here: nothing is skipped")
def test_gpu_skips_fold_into_one_line():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-ra", "-q", "-p", "no:cacheprovider", "-W", "ignore",
                           "tests/test_blosc_gpu.py", "tests/test_cache.py"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)
    skipped = [ln for ln in proc.stdout.splitlines() if ln.startswith("SKIPPED")]
    assert len(skipped) == 1, skipped
    assert skipped[0].startswith("SKIPPED [") and "tests/conftest.py: no usable CUDA GPU" in skipped[0]
