#!/usr/bin/env bash
# One device call (fourteenth session): shard_threads.py (the decode set's cores varied) at 0
# and 20 ms a request, 7 rounds, on the working tree's code. Results in $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  $(ls .whl-slim/*.whl .whl-ts/*.whl .whl-remote/*.whl 2>/dev/null) 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1
D=benchmarks/results/2026-12-04-gpu-n/scripts
H=benchmarks/results/2026-12-03-gpu-h/scripts
gcc -O3 -shared -fPIC -pthread -fvisibility=hidden src/gpu_zarr/engine/_native/gz_native.c \
  src/gpu_zarr/engine/_native/gz_http.c -o src/gpu_zarr/engine/_native/libgz_native.so -ldl || exit 1
[ -d /tmp/gzr/remote-full-1 ] || PYTHONPATH=/tmp/site:src python3 $H/write_volumes.py /tmp/gzr
for lat in 20 0 20; do
  PYTHONPATH=/tmp/site:src timeout 120 python3 $D/shard_threads.py /tmp/gzr remote-full-1 $lat 7 ${CORES:-16,12,10,8,6} 2>&1 | grep -v Warn
done 2>&1 | tee $OUT/shard_threads.txt
