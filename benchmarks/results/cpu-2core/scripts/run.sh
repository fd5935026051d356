#!/usr/bin/env bash
# What made this folder on the 2-core machine (repo root, the package installed): the remote benchmark over
# loopback HTTP at 20 ms a request, every reader once, then ours against TensorStore three times.
set -euo pipefail
R=benchmarks/results/cpu-2core
gpu-zarr bench --remote --size full --latency 20 --repeat 3 --planes 15 --device cpu --workdir /tmp/gzr \
  --out "$R/all-readers" > "$R/all-readers.log" 2>&1
for k in 1 2 3; do
  gpu-zarr bench --remote --size full --latency 20 --repeat 3 --planes 15 --device cpu --workdir /tmp/gzr \
    --readers ours,tensorstore --out "$R/turns-$k" > "$R/turns-$k.log" 2>&1
done
