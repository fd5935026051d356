"""benchmarks/bench_plate.py end to end at a tiny size (its results are checked against napari-ome-zarr)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("napari_ome_zarr")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_plate_benchmark_row(tmp_path):
    import bench_plate

    assert bench_plate.main(["--field", "32", "--repeat", "1", "--backend", "cpu", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "plate96.md").read_text()
    assert "| open |" in md and "| level 0 (256, 384) |" in md and "| level 2 (64, 96) |" in md
