"""Shared fixtures; `gpu` tests skip cleanly where cupy or a CUDA device is missing."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@functools.lru_cache(maxsize=1)
def _gpu_reason() -> str | None:
    from gpu_zarr.capabilities import probe

    caps = probe()
    if caps.gpu:
        return None
    return "no usable CUDA GPU: " + (caps.notes[0] if caps.notes else "cupy sees no device")


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or _gpu_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
