#!/usr/bin/env bash
# The remote benchmark alone at the final code (thirteenth session), carrying .whl-slim, .whl-ts and
# .whl-remote (see remote_final.sh): `bench --remote` with the engine decoding on the GPU and on
# the CPU, TensorStore beside, the readers in turns. Results in $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl-slim/*.whl .whl-ts/*.whl .whl-remote/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1
gcc -O3 -shared -fPIC -pthread -fvisibility=hidden src/gpu_zarr/engine/_native/gz_native.c \
  src/gpu_zarr/engine/_native/gz_http.c -o src/gpu_zarr/engine/_native/libgz_native.so -ldl || exit 1
for dev in gpu cpu; do
  mkdir -p $OUT/remote-$dev
  PYTHONPATH=/tmp/site:src timeout 200 python3 -m gpu_zarr.bench --remote --device $dev --readers ours,tensorstore \
    --planes 15 --repeat 3 --workdir /tmp/gzr --out $OUT/remote-$dev > $OUT/remote-$dev/log.txt 2>&1
  tail -2 $OUT/remote-$dev/log.txt
done
cat $OUT/remote-gpu/remote.md $OUT/remote-cpu/remote.md 2>/dev/null | grep -v "^|---" | cut -c1-150
