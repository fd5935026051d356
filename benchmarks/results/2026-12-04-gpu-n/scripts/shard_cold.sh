#!/usr/bin/env bash
# One device call (fourteenth session): first ("cold", a new open array: no shard index known)
# and later ("warm") whole reads of the sharded volume with CPU decode, ours before ($BASE,
# default .ab-head/src = c4358d6) and now (shard_cold.py), TensorStore's in turns, at 20 and
# 0 ms a request. Results in $OUT.
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
for lat in 20 0; do
  for round in 1 2; do
    echo "== ${BASE:-.ab-head/src} $lat ms (round $round)"
    PYTHONPATH=/tmp/site:${BASE:-.ab-head/src} timeout 120 python3 $D/shard_cold.py /tmp/gzr remote-full-1 $lat 5 2>&1 | grep -v Warn
    echo "== src $lat ms (round $round)"
    PYTHONPATH=/tmp/site:src timeout 120 python3 $D/shard_cold.py /tmp/gzr remote-full-1 $lat 5 2>&1 | grep -v Warn
  done
done 2>&1 | tee $OUT/shard_cold.txt
