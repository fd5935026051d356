"""Compare two trees' throughput runs taken in turns (``on_gpu_machine.sh ab``).

Usage: ``python3 benchmarks/ab.py OUT`` where OUT holds ``ab-old-1/``, ``ab-new-1/``,
``ab-old-2/``, ... each with one ``throughput-*.json`` of ``gpu-zarr bench``. Prints, per
layout and reader, the median GiB/s of each side over its turns, new / old, and each turn's
figure (old turns / new turns: how far one tree's turns differ shows the noise): a ratio inside
the machine's run-to-run noise (20-30 %) is no result.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main(out: Path) -> int:
    rates: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: {"old": [], "new": []})
    wrong: list[str] = []
    for side in ("old", "new"):
        for path in sorted(out.glob(f"ab-{side}-*/throughput-*.json")):
            doc = json.loads(path.read_text())
            for lay in doc["layouts"]:
                for reader, rec in lay.get("readers", {}).items():
                    if rec.get("gib_per_s"):
                        rates[(lay["name"], reader)][side].append(float(rec["gib_per_s"]))
                    if rec.get("correct") is False:
                        wrong.append(f"{side} {path.parent.name} {lay['name']} {reader}: {rec.get('correct_detail')}")
    if not rates:
        print(f"no throughput-*.json under {out}/ab-*-*/")
        return 1
    print("| layout | reader | old GiB/s | new GiB/s | new / old | turns, old / new |")
    print("|---|---|---|---|---|---|")
    for (layout, reader), sides in sorted(rates.items()):
        old = statistics.median(sides["old"]) if sides["old"] else float("nan")
        new = statistics.median(sides["new"]) if sides["new"] else float("nan")
        print(f"| {layout} | {reader} | {old:.2f} | {new:.2f} | {new / old:.2f} | "
              f"{', '.join(f'{v:.2f}' for v in sides['old'])} / {', '.join(f'{v:.2f}' for v in sides['new'])} |")
    for w in wrong:
        print("NOT EQUAL TO ZARR:", w)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-results")))
