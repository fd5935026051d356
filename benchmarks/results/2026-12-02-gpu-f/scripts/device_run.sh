#!/usr/bin/env bash
# One device call of the sixth session (after the two wheel installs): GPU tests, the remote
# suites twice in one process each with a native backtrace on a crash, the transfer floor,
# the feed probe and `bench --remote` (GPU and CPU decode) with TensorStore. Results in $OUT.
S=benchmarks/results/2026-12-02-gpu-f/scripts
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
gcc -O3 -shared -fPIC -pthread -fvisibility=hidden src/gpu_zarr/engine/_native/gz_native.c \
  src/gpu_zarr/engine/_native/gz_http.c -o src/gpu_zarr/engine/_native/libgz_native.so -ldl || exit 1
[ -n "$NO_TESTS" ] || bash benchmarks/on_gpu_machine.sh tests
bash $S/segv_repro.sh "${SEGV_RUNS:-2}"
[ -n "$NO_FLOOR" ] || timeout 90 python3 $S/fetch_floor.py /tmp/gzr 20 > "$OUT/fetch_floor.txt" 2>&1; [ -n "$NO_FLOOR" ] || tail -16 "$OUT/fetch_floor.txt"
[ -n "$NO_FEED" ] || { timeout 100 python3 $S/feed_probe.py /tmp/gzr 1 2>&1 | grep -v Warn > "$OUT/feed_probe.txt"; cat "$OUT/feed_probe.txt"; }
for dev in ${DEVS:-gpu cpu}; do
  mkdir -p "$OUT/remote-$dev"
  timeout 150 python3 -m gpu_zarr.bench --remote --device $dev --readers ours,tensorstore --planes 15 --repeat 3 \
    --workdir /tmp/gzr --out "$OUT/remote-$dev" > "$OUT/remote-$dev/log.txt" 2>&1
  grep -v "^|---" "$OUT/remote-$dev/remote.md" | cut -c1-160
done
