#!/usr/bin/env bash
# The H100 run of 2026-12-05 at 1fa490d, in order (one warm machine; OUT is the device's result folder).
set -uo pipefail
# 1. carrying .whl: every GPU test, then the fuzz suite
bash benchmarks/on_gpu_machine.sh verify
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
# 2. the writer, sharded and plain, against TensorStore
python3 -m gpu_zarr.bench --mode write --size-mib 4096 --chunks 1,512,1024 --shard-mib 64 --repeat 2 --peer-repeat 1 \
  --layouts sharded,plain --writers ours-gpu,tensorstore --workdir /tmp/gzw --out "$OUT/write/write-bench.json"
# 3. fused tiles per thread count (the 64 KiB-inner store written by a browse of that layout first)
S=/tmp/gzb/browse/64x2048x2048/sharded-zstd-64KiB-v3.zarr
python3 -m gpu_zarr.bench --device gpu --workdir /tmp/gzb --out "$OUT/diag" --no-progress --mode browse --size 64,2048,2048 \
  --layouts sharded-zstd-64KiB-v3 --planes 20 --patterns tile --readers ours-lazy-auto,tensorstore
python3 benchmarks/tile_threads.py $S --threads 1,4,16 --tiles 40 --turns 1
# 4. browsing three sharded layouts against TensorStore
python3 -m gpu_zarr.bench --device gpu --workdir /tmp/gzb --out "$OUT/browse" --no-progress --mode browse \
  --size 64,2048,2048 --layouts sharded-zstd-64MiB-1MiB,sharded-zstd-crc32c-v3,sharded-zstd-64KiB-v3 --planes 20 \
  --patterns random,tile --readers ours-lazy-auto,tensorstore
