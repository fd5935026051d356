#!/usr/bin/env bash
# One device call (fourteenth session): first ("cold", a new open array: no shard index known)
# and later ("warm") whole reads of the sharded volume with CPU decode, ours before ($BASE,
# default .ab-head/src = c4358d6) and now (shard_cold.py), TensorStore's in turns, at 20 and
# 0 ms a request. Results in $OUT.
TREES="${BASE:-.ab-head/src} src" source benchmarks/results/h200/scripts/setup.sh
for lat in 20 0; do
  for round in 1 2; do
    echo "== ${BASE:-.ab-head/src} $lat ms (round $round)"
    PYTHONPATH=/tmp/site:${BASE:-.ab-head/src} timeout 120 python3 $D/shard_cold.py /tmp/gzr remote-full-1 $lat 5 2>&1 | grep -v Warn
    echo "== src $lat ms (round $round)"
    PYTHONPATH=/tmp/site:src timeout 120 python3 $D/shard_cold.py /tmp/gzr remote-full-1 $lat 5 2>&1 | grep -v Warn
  done
done 2>&1 | tee $OUT/shard_cold.txt
