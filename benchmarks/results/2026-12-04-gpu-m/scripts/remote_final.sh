#!/usr/bin/env bash
# One device call (thirteenth session, at the final code), carrying .whl-slim (zarr, numcodecs,
# donfig, google-crc32c, msgspec and nvCOMP's two wheels without nvlzcat, headers and other
# Pythons' modules: with TensorStore's 22 MiB the carry must stay under 64 MiB), .whl-ts,
# .whl-remote and .ab-prev (`git archive 50863e4 src`):
# 1. the plane A/B of scripts/plane_ab.sh (three rounds alternating, 20 and 0 ms a request);
# 2. `bench --remote` with the engine decoding on the GPU and on the CPU, TensorStore beside
#    (the readers now take turns, after a plain client warmed the server).
# Results in $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl-slim/*.whl .whl-ts/*.whl .whl-remote/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-03-gpu-i/scripts
H=benchmarks/results/2026-12-03-gpu-h/scripts
for src in .ab-prev/src src; do
  gcc -O3 -shared -fPIC -pthread -fvisibility=hidden $src/gpu_zarr/engine/_native/gz_native.c \
    $src/gpu_zarr/engine/_native/gz_http.c -o $src/gpu_zarr/engine/_native/libgz_native.so -ldl || exit 1
done
[ -d /tmp/gzr/remote-full-1 ] || PYTHONPATH=/tmp/site:src python3 $H/write_volumes.py /tmp/gzr
for round in 1 2 3; do
  for src in .ab-prev/src src; do
    echo "== $src (round $round)"
    for v in remote-full-0 remote-full-2-v2; do
      PYTHONPATH=/tmp/site:$src timeout 60 python3 $S/plane_stages.py /tmp/gzr $v 20 ${N:-30} 2>&1 | grep -v "Warn\|2 MiB"
    done
    PYTHONPATH=/tmp/site:$src timeout 60 python3 $S/plane_stages.py /tmp/gzr remote-full-0 0 ${N:-30} 2>&1 | grep -v "Warn\|2 MiB"
  done
done > $OUT/plane_ab.txt 2>&1
for dev in gpu cpu; do
  mkdir -p $OUT/remote-$dev
  PYTHONPATH=/tmp/site:src timeout 200 python3 -m gpu_zarr.bench --remote --device $dev --readers ours,tensorstore \
    --planes 15 --repeat 3 --workdir /tmp/gzr --out $OUT/remote-$dev > $OUT/remote-$dev/log.txt 2>&1
  tail -3 $OUT/remote-$dev/log.txt
done
cat $OUT/remote-gpu/remote.md $OUT/remote-cpu/remote.md 2>/dev/null | grep -v "^|---" | cut -c1-150
