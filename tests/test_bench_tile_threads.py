"""benchmarks/tile_threads.py at a tiny size: every thread count gets a row with the read and its stages."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import zarr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import tile_threads  # noqa: E402


def test_tiles_stay_inside_and_every_thread_count_is_timed(tmp_path, capsys):
    for sel in tile_threads.tiles((5, 300, 200), 50, 128, 1):
        assert 0 <= sel[0] < 5 and sel[1].stop <= 300 and sel[2].stop <= 200
        assert sel[1].stop - sel[1].start == 128 and sel[2].stop - sel[2].start == 128
    path = tmp_path / "v.zarr"
    z = zarr.create_array(str(path), shape=(4, 256, 256), chunks=(1, 64, 64), shards=(2, 128, 128), dtype="u2")
    z[...] = np.arange(4 * 256 * 256, dtype="u2").reshape(z.shape)
    assert tile_threads.main([str(path), "--threads", "1,2", "--tiles", "6", "--turns", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(rows) == 2 and all("fused" not in r for r in rows)
    from gpu_zarr.engine import native

    res = tile_threads.sweep(str(path), [1], 4, 1)
    assert res[1]["total"] > 0 and "locate" in res[1] and ("fused" in res[1]) == native.available()
