#!/usr/bin/env bash
# What made this folder, on the H200 machine (repo root; wheels: .whl and .whl-ts carried). Results go to $OUT.
set -uo pipefail
OUT=${OUT:-gpu-results}
bash benchmarks/on_gpu_machine.sh tests      # gpu-tests/
bash benchmarks/on_gpu_machine.sh fuzz       # gpu-tests/tests-fuzz-summary.txt
bash benchmarks/on_gpu_machine.sh chains     # chains/
export PYTHONPATH=/tmp/site:src
python3 -m gpu_zarr.bench --mode write --size-mib 4096 --chunks 1,512,1024 --shard-mib 64 --repeat 2 \
  --layouts sharded,plain,pyramid,convert --writers ours-gpu,tensorstore --workdir /tmp/gzw \
  --out "$OUT/write-bench.json" > "$OUT/write.log" 2>&1                                 # write/
python3 -m gpu_zarr.bench --mode write --size-mib 4096 --chunks 1,512,1024 --shard-mib 64 --repeat 2 \
  --layouts convert --writers ours-gpu,tensorstore --workdir /tmp/gzw --out "$OUT/convert-bench.json" \
  > "$OUT/convert.log" 2>&1                                                              # write/convert-*
python3 - <<'PY' > "$OUT/batches.txt"                                                     # write/batches.txt
import shutil, cupy as cp, gpu_zarr
from gpu_zarr import settings
from gpu_zarr.bench.write import _volume
v = cp.asarray(_volume(4096, (1, 512, 1024), 0))
for lanes, mib in ((3, 192), (6, 192), (8, 64), (3, 512), (3, 1024), (2, 2048)):
    with settings.set(lanes=lanes, batch_bytes=mib << 20):
        for k in range(2):
            p = f"/tmp/gzw/l-{lanes}-{k}.zarr"; shutil.rmtree(p, ignore_errors=True)
            r = gpu_zarr.write_zarr(v, p, chunks=(1, 512, 1024), shards=(64, 512, 1024))
        print(lanes, mib, f"{r.seconds:.2f} s {r.gib_per_s:.2f} GiB/s", {a: round(b, 2) for a, b in r.stages.items()})
PY
