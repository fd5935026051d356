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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """GPU skips carry one location (this file), so ``pytest -ra`` folds them into one line
    ("SKIPPED [N] tests/conftest.py: no usable CUDA GPU: ...") instead of one per test file."""
    outcome = yield
    rep = outcome.get_result()
    reason = _gpu_reason() if "gpu" in item.keywords else None
    if rep.skipped and reason and isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3 \
            and reason in str(rep.longrepr[2]):
        rep.longrepr = (str(Path(__file__).relative_to(Path(__file__).parents[1])), None, rep.longrepr[2])
