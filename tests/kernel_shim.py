"""Build the decode stage's CUDA kernels as plain C++ so that CI (no GPU) can run their logic.

Each kernel is called once per (block, thread) in sequence; thread 0 runs last so that a
block's shared-memory combine sees every thread's part. Used by the frame-check and
checksum kernel tests.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

_PRELUDE = """
#define __global__
#define __device__
#define __shared__ static
#define __syncthreads()
struct D3 { long long x; };
static D3 blockIdx, threadIdx, blockDim = {1}, gridDim = {1};
#include "k.cu"
"""


def build(tmp_path: Path, body: str) -> ctypes.CDLL:
    """Compile ``gpu_zarr.engine.nvcomp_batch._KERNELS`` plus ``body`` (extern "C" drivers)."""
    from gpu_zarr.engine.nvcomp_batch import _KERNELS

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the kernels' host shim")
    (tmp_path / "k.cu").write_text(_KERNELS)
    (tmp_path / "shim.cpp").write_text(_PRELUDE + body)
    subprocess.run([cxx, "-shared", "-fPIC", "-O1", "-o", str(tmp_path / "k.so"), str(tmp_path / "shim.cpp")],
                   check=True, cwd=tmp_path)
    return ctypes.CDLL(str(tmp_path / "k.so"))
