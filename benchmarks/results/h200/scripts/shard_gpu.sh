#!/usr/bin/env bash
# One device call (fourteenth session): the GPU path's whole sharded read, before (the code of
# $BASE, default .ab-head/src = c4358d6: shard_whole.py's gpu reader) and now (shard_gpu.py: inner
# chunks taken as the shards' bytes arrive, decode groups of 8/16/32/128 MiB), TensorStore's in
# turns, at 20 and 0 ms a request. Results in $OUT.
TREES="${BASE:-.ab-head/src} src" source benchmarks/results/h200/scripts/setup.sh
for lat in 20 0; do
  for round in 1 2; do
    echo "== ${BASE:-.ab-head/src} $lat ms (round $round)"
    PYTHONPATH=/tmp/site:${BASE:-.ab-head/src} timeout 120 python3 $D/shard_whole.py /tmp/gzr remote-full-1 $lat 7 gpu,tensorstore 2>&1 | grep -v Warn
    echo "== src $lat ms (round $round)"
    PYTHONPATH=/tmp/site:src timeout 120 python3 $D/shard_gpu.py /tmp/gzr remote-full-1 $lat 7 ${GROUPS_MIB:-8,16,32,128} 2>&1 | grep -v Warn
  done
done 2>&1 | tee $OUT/shard_gpu.txt
