#!/usr/bin/env bash
# One device call (fourteenth session): setup.sh, then
# shard_whole.py on the sharded volume with the code before this
# session ($BASE, default .ab-head/src = `git archive c4358d6 src`) and the working tree's,
# alternating, at 20 ms a request (and 0 and 50 ms with the working tree's). Results in $OUT.
TREES="${BASE:-.ab-head/src} src" source benchmarks/results/h200/scripts/setup.sh
nproc
for round in 1 2; do
  for src in ${BASE:-.ab-head/src} src; do
    echo "== $src (round $round)"
    PYTHONPATH=/tmp/site:$src timeout 120 python3 $D/shard_whole.py /tmp/gzr remote-full-1 20 7 2>&1 | grep -v Warn
  done
done 2>&1 | tee $OUT/shard_whole.txt
for lat in 0 50; do
  PYTHONPATH=/tmp/site:src timeout 120 python3 $D/shard_whole.py /tmp/gzr remote-full-1 $lat 5 2>&1 | grep -v Warn
done 2>&1 | tee -a $OUT/shard_whole.txt
