#!/usr/bin/env bash
# One device call (fourteenth session): shard_threads.py (the decode set's cores varied) at 0
# and 20 ms a request, 7 rounds, on the working tree's code. Results in $OUT.
source benchmarks/results/h200/scripts/setup.sh
for lat in 20 0 20; do
  PYTHONPATH=/tmp/site:src timeout 120 python3 $D/shard_threads.py /tmp/gzr remote-full-1 $lat 7 ${CORES:-16,12,10,8,6} 2>&1 | grep -v Warn
done 2>&1 | tee $OUT/shard_threads.txt
