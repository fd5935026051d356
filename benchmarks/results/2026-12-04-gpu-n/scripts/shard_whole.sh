#!/usr/bin/env bash
# One device call (fourteenth session): wheels (.whl-slim, .whl-ts, .whl-remote) into /tmp/site,
# the bench volumes, then shard_whole.py on the sharded volume with the code before this
# session ($BASE, default .ab-head/src = `git archive c4358d6 src`) and the working tree's,
# alternating, at 20 ms a request (and 0 and 50 ms with the working tree's). Results in $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  $(ls .whl-slim/*.whl .whl-ts/*.whl .whl-remote/*.whl 2>/dev/null) 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1
D=benchmarks/results/2026-12-04-gpu-n/scripts
H=benchmarks/results/2026-12-03-gpu-h/scripts
for src in ${BASE:-.ab-head/src} src; do
  gcc -O3 -shared -fPIC -pthread -fvisibility=hidden $src/gpu_zarr/engine/_native/gz_native.c \
    $src/gpu_zarr/engine/_native/gz_http.c -o $src/gpu_zarr/engine/_native/libgz_native.so -ldl || exit 1
done
[ -d /tmp/gzr/remote-full-1 ] || PYTHONPATH=/tmp/site:src python3 $H/write_volumes.py /tmp/gzr
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
