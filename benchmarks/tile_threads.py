"""Random 1024² tiles of a store through the engine's small-read path (the fused executor on
native threads), for several thread counts, in turns: where the tile's time goes and whether
the fused stage scales with cores.

On the 2-core machine a 64 KiB-inner tile's fused stage takes ~1.7 ms whatever the threads;
on the 16-core H200 it took 1.1 ms (`chains`, 2026-12-05), which is less than the cores
promise. Prints one Markdown row per thread count: p50 ms of the read and of its stages.

    python benchmarks/tile_threads.py STORE.zarr [--threads 1,2,4,8,16] [--tiles 200] [--turns 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def tiles(shape: tuple[int, ...], n: int, side: int, seed: int) -> list[tuple[object, ...]]:
    """``n`` random ``side``² tiles of random planes (the last two axes; leading axes random)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        lead = tuple(int(rng.integers(0, s)) for s in shape[:-2])
        yx = [(int(rng.integers(0, max(1, s - side + 1))), min(side, s)) for s in shape[-2:]]
        out.append((*lead, *(slice(a, a + w) for a, w in yx)))
    return out


def sweep(path: str, threads: list[int], n: int, turns: int, side: int = 1024) -> dict[int, dict[str, float]]:
    """p50 ms per thread count of the read (``total``) and of each stage, over ``turns`` passes."""
    import zarr

    from gpu_zarr.engine import EngineOptions, read

    arr = zarr.open_array(path, mode="r")
    sel = tiles(tuple(arr.shape), n, side, 0)
    got: dict[int, dict[str, list[float]]] = {t: {} for t in threads}
    for _ in range(turns):
        for t in threads:
            opts = EngineOptions(cache=False, threads=t)
            for s in sel[: max(1, n // 10)]:  # warm: shard indexes cached, threads started
                read(arr, s, device="cpu", options=opts)
            for s in sel:
                t0 = time.perf_counter()
                stats = read(arr, s, device="cpu", options=opts).stats
                rec = got[t]
                rec.setdefault("total", []).append(time.perf_counter() - t0)
                for k, v in stats.items():
                    if k.endswith("_s") and k != "total_s" and isinstance(v, float):
                        rec.setdefault(k[:-2], []).append(v)
    return {t: {k: statistics.median(v) * 1e3 for k, v in rec.items()} for t, rec in got.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--tiles", type=int, default=200)
    ap.add_argument("--turns", type=int, default=2)
    a = ap.parse_args(argv)
    res = sweep(a.store, [int(t) for t in a.threads.split(",")], a.tiles, a.turns)
    stages = sorted({k for r in res.values() for k in r if k != "total"})
    print(f"{a.store}: random 1024² tiles, ms p50 over {a.tiles} x {a.turns}, chunk cache off")
    print("| threads | read | " + " | ".join(stages) + " |")
    print("|---" * (len(stages) + 2) + "|")
    for t, r in res.items():
        print(f"| {t} | {r['total']:.2f} | " + " | ".join(f"{r.get(k, 0):.2f}" for k in stages) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
