#!/usr/bin/env bash
# A device call (eleventh session): the GPU wheels (.whl) and obstore (.whl-remote) into /tmp/site, the `bench --remote`
# volumes, then gpu_copy_stages.py on the two unsharded volumes. Results in $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl .whl-remote/*.whl \
  2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:src
gcc -O3 -shared -fPIC -pthread -fvisibility=hidden src/gpu_zarr/engine/_native/gz_native.c \
  src/gpu_zarr/engine/_native/gz_http.c -o src/gpu_zarr/engine/_native/libgz_native.so -ldl || exit 1
[ -d /tmp/gzr/remote-full-1 ] || python3 benchmarks/results/2026-12-03-gpu-h/scripts/write_volumes.py /tmp/gzr
for v in remote-full-0 remote-full-2-v2; do
  timeout 60 python3 benchmarks/results/2026-12-04-gpu-k/scripts/gpu_copy_stages.py /tmp/gzr $v 40 2>&1 | grep -v Warn
done 2>&1 | tee $OUT/gpu_copy_stages.txt
