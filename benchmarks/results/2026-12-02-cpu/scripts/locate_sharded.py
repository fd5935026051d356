"""locate of a sharded plane with the shard indexes kept across reads ("kept") and cleared
before each read ("cold"), 2-core machine (run from the repository root with PYTHONPATH=src).
Before the cache (commit 95b3bd1 and earlier) run it with the two clearing lines removed."""

import os

import numpy as np
import zarr

from gpu_zarr.engine import EngineOptions, read
from gpu_zarr.engine.runtime import get_runtime

p = "/tmp/rp/sh.zarr"
if not os.path.exists(p):
    a = zarr.create_array(p, shape=(32, 2048, 2048), chunks=(1, 512, 1024), shards=(16, 1024, 2048), dtype="u2",
                          compressors=zarr.codecs.ZstdCodec(level=1))
    a[:] = np.random.default_rng(0).integers(0, 4000, (32, 2048, 2048), dtype="u2")
arr = zarr.open_array(p, mode="r")
for mode in ("cold", "kept"):
    loc, tot = [], []
    for k in range(30):
        if mode == "cold":
            get_runtime().shard_indexes().clear()
        r = read(arr, ((7 * k) % 32,), device="cpu", options=EngineOptions(cache=False))
        loc.append(r.stats["locate_s"] * 1e3)
        tot.append(r.stats["total_s"] * 1e3)
    print(mode, f"locate p50 {np.median(loc):.3f} ms, total p50 {np.median(tot):.2f} ms")
