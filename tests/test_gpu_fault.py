"""A GPU fault during a read (an illegal address in a decoder, as nvCOMP gives on some corrupt
input) becomes a GPUFault naming the store and the chunks in flight; afterwards GPU reads are
refused at once with GPUUnavailable and ``auto`` reads on the CPU.

The fault is raised by the twin's ops (an exception of cupy's class name and CUDA's message),
so the batch pipeline, its cleanup and the refusal run here without a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import gpu_zarr.engine.runtime as runtime_mod
from gpu_zarr import capabilities
from gpu_zarr.engine import EngineOptions, decode_chunks
from gpu_zarr.engine import read as engine_read
from gpu_zarr.engine.layout import chunk_layout
from gpu_zarr.engine.ops import CpuOps
from gpu_zarr.engine.runtime import gpu_fault, is_gpu_fault
from gpu_zarr.errors import GPUFault, GPUUnavailable

#: cupy's class name: what cupy raises after a kernel read an illegal address
CUDARuntimeError = type("CUDARuntimeError", (RuntimeError,), {})


FAULT = "cudaErrorIllegalAddress: an illegal memory access was encountered"


class FaultingOps(CpuOps):
    def place(self, *args: Any, **kwargs: Any) -> None:
        raise CUDARuntimeError(FAULT)


@pytest.fixture
def no_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    # the fault is process-wide by design: each test starts and ends without one
    monkeypatch.setattr(runtime_mod, "_fault", [])


def _store(tmp_path: Path) -> Path:
    path = tmp_path / "faulty.zarr"
    a = zarr.create_array(str(path), shape=(64, 64), chunks=(16, 16), dtype="u2")
    a[:] = np.arange(64 * 64, dtype="u2").reshape(64, 64)
    return path


def test_is_gpu_fault_tells_sticky_errors_from_others() -> None:
    assert is_gpu_fault(CUDARuntimeError(FAULT))
    assert is_gpu_fault(CUDARuntimeError("cudaErrorLaunchFailure: unspecified launch failure"))
    assert not is_gpu_fault(CUDARuntimeError("cudaErrorMemoryAllocation: out of memory"))
    assert not is_gpu_fault(RuntimeError(FAULT))  # not cupy's


def test_fault_in_a_batch_becomes_gpufault_then_gpu_reads_are_refused(tmp_path: Path, no_fault: None) -> None:
    path = _store(tmp_path)
    with pytest.raises(GPUFault) as info:
        engine_read(str(path), (slice(0, 32), slice(0, 32)), device="cpu",
                    options=EngineOptions(reader="threads"), ops=FaultingOps())
    msg = str(info.value)
    assert str(path) in msg and "c/0/0" in msg, msg  # the store and the chunks in flight
    assert "backend='cpu'" in msg and "restart" in msg.lower(), msg  # what to do
    chain, e = [], info.value
    while e is not None:
        chain.append(e)
        e = e.__cause__
    assert any(isinstance(e, CUDARuntimeError) for e in chain)
    assert gpu_fault() is not None and "c/0/0" in gpu_fault()
    # later GPU reads: refused at once, saying why (before any CUDA call)
    with pytest.raises(GPUUnavailable, match="faulted earlier"):
        engine_read(str(path), device="gpu")
    lay = chunk_layout((4,), np.dtype("u1"), "raw", {})
    with pytest.raises(GPUUnavailable, match="faulted earlier"):
        decode_chunks(lay, [np.zeros(4, np.uint8)], device="gpu")
    # the CPU still reads, and equals zarr
    got = engine_read(str(path), device="cpu").data
    np.testing.assert_array_equal(got, zarr.open_array(str(path), mode="r")[:])


def test_probe_reports_no_gpu_after_a_fault(no_fault: None, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime_mod.record_gpu_fault("decoding chunks c/0/0")
    caps = capabilities.probe()
    assert not caps.gpu
    ok, why = caps.backend_status("kvikio")
    assert not ok
    assert caps.backend_status("auto")[0]  # auto reads on the CPU
    if capabilities._probe().gpu:  # on the GPU machine: the note says what happened
        assert "faulted earlier" in caps.notes[0] and "faulted earlier" in why
