"""Whole reads of the sharded bench volume with CPU decode, the decode set's cores varied
(``remote_read.CORES``, patched in this probe only), TensorStore's in turns (fourteenth session).
Prints per reader min/median ms and, for ours, the median fetch time (the last answer in).

    python shard_threads.py WORKDIR VOLUME LATENCY_MS ROUNDS CORES,CORES,...
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from gpu_zarr.bench.remote import _clear, _ours, _tensorstore, _warm
from gpu_zarr.bench.remote_server import ServerProcess


def main() -> None:
    import gpu_zarr.engine.remote_read as rr

    wd, rel, lat, rounds = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    cores = [int(c) for c in sys.argv[5].split(",")]
    with ServerProcess(wd, latency=lat / 1000) as srv:
        url = f"{srv.url}/{rel}"
        _warm(srv.url, wd, rel)
        ours = _ours("cpu")(url)
        ts = _tensorstore(url)
        ours((0,))
        ts((0,))
        times: dict[str, list[float]] = {f"cores={c}": [] for c in cores}
        times["tensorstore"] = []
        fetch: dict[str, list[float]] = {k: [] for k in times}
        for _ in range(rounds):
            for c in cores:
                rr.CORES = c
                _clear()
                t = time.perf_counter()
                res = ours(Ellipsis)
                times[f"cores={c}"].append(time.perf_counter() - t)
                del res
                from gpu_zarr.engine.pipeline import _last
                fetch[f"cores={c}"].append(_last.stats.get("fetch_s", 0.0))
            _clear()
            t = time.perf_counter()
            ts(Ellipsis)
            times["tensorstore"].append(time.perf_counter() - t)
        for name, tt in times.items():
            f = f" fetch med {statistics.median(fetch[name]) * 1e3:5.1f}" if fetch[name] else ""
            print(f"{rel} {lat:.0f} ms {name:12s} min {min(tt) * 1e3:6.1f} med {statistics.median(tt) * 1e3:6.1f}{f}  "
                  + " ".join(f"{x * 1e3:.1f}" for x in tt))


if __name__ == "__main__":
    main()
