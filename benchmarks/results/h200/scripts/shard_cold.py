"""First and later whole reads of the sharded bench volume, ours (CPU decode, engine read) and
TensorStore's, in turns (fourteenth session). Each round opens the array anew in both readers
(no shard index known: the first read is "cold"), then reads it whole again ("warm", the
indexes known). Prints min/median ms and, for ours, the inner chunks handed to the decode set
as their bytes arrived (of 256).

    python shard_cold.py WORKDIR VOLUME LATENCY_MS ROUNDS
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from gpu_zarr.bench.remote import _clear, _ours, _tensorstore, _warm
from gpu_zarr.bench.remote_server import ServerProcess


def main() -> None:
    from gpu_zarr.engine.pipeline import _last

    wd, rel, lat, rounds = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    with ServerProcess(wd, latency=lat / 1000) as srv:
        url = f"{srv.url}/{rel}"
        _warm(srv.url, wd, rel)
        times: dict[str, list[float]] = {k: [] for k in ("ours cold", "ours warm", "ts cold", "ts warm")}
        handed: dict[str, list[int]] = {"ours cold": [], "ours warm": []}
        for _ in range(rounds):
            for name, make in (("ours", _ours("cpu")), ("ts", _tensorstore)):
                _clear()
                read = make(url)
                for when in ("cold", "warm"):
                    _clear()
                    t = time.perf_counter()
                    read(Ellipsis)
                    times[f"{name} {when}"].append(time.perf_counter() - t)
                    if name == "ours":
                        handed[f"ours {when}"].append(int(_last.stats.get("handed_natively", 0)))
        for name, tt in times.items():
            h = f" handed {statistics.median(handed[name]):4.0f}" if name in handed else ""
            print(f"{rel} {lat:.0f} ms {name:10s} min {min(tt) * 1e3:6.1f} med {statistics.median(tt) * 1e3:6.1f}{h}  "
                  + " ".join(f"{x * 1e3:.1f}" for x in tt))


if __name__ == "__main__":
    main()
