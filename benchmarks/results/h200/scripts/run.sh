#!/usr/bin/env bash
# What made this folder, on the H200 machine (repo root; wheels: .whl and .whl-ts in one device call, .whl-zarrs in
# the next while the machine is warm: together they exceed the 64 MiB a call carries). Results go to $OUT.
set -uo pipefail
OUT=${OUT:-gpu-results}
bash benchmarks/on_gpu_machine.sh tests      # gpu-tests/
bash benchmarks/on_gpu_machine.sh fuzz       # gpu-tests/tests-fuzz-summary.txt
PYTHONPATH=/tmp/site:src python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl-zarrs/*.whl
bash benchmarks/on_gpu_machine.sh chains     # chains/
PYTHONPATH=/tmp/site:src python3 -m gpu_zarr.bench --mode write --size-mib 2048 --chunks 1,512,1024 --shard-mib 64 \
  --repeat 3 --workdir /tmp/gzw --out "$OUT/write-bench.json" > "$OUT/write.log" 2>&1   # write/
