"""HCS plates written by ome-zarr-py (the reference writer), for the plate tests: the writer
lives with the 96-well benchmark (benchmarks/bench_plate.py), which CI runs too."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_plate import CHANNELS, write_plate  # noqa: E402

__all__ = ["CHANNELS", "write_plate"]
