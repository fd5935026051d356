#!/usr/bin/env bash
# As plane_ab.sh, the code before taken from $BASE (default .ab-prev/src). One device call (thirteenth session): the wheels (.whl-min: zarr, numcodecs, donfig, google-crc32c,
# msgspec, typing_extensions, packaging; .whl-ts; .whl-remote) into /tmp/site, the three
# `bench --remote --size full` volumes, then the ninth session's plane_stages.py on the
# unsharded volumes (20 ms and 0 ms a request) with the code before this session
# (.ab-prev/src = `git archive 50863e4 src`) and the working tree's (the requests leave before
# their landing block is carved; a request table with no numpy call), three rounds, alternating. Results in $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  $(ls .whl-min/*.whl .whl-ts/*.whl .whl-remote/*.whl 2>/dev/null) 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1
S=benchmarks/results/2026-12-03-gpu-i/scripts
H=benchmarks/results/2026-12-03-gpu-h/scripts
for src in ${BASE:-.ab-prev/src} src; do
  gcc -O3 -shared -fPIC -pthread -fvisibility=hidden $src/gpu_zarr/engine/_native/gz_native.c \
    $src/gpu_zarr/engine/_native/gz_http.c -o $src/gpu_zarr/engine/_native/libgz_native.so -ldl || exit 1
done
[ -d /tmp/gzr/remote-full-1 ] || PYTHONPATH=/tmp/site:src python3 $H/write_volumes.py /tmp/gzr
for round in 1 2 3; do
  for src in ${BASE:-.ab-prev/src} src; do
    echo "== $src (round $round)"
    for v in remote-full-0 remote-full-2-v2; do
      PYTHONPATH=/tmp/site:$src timeout 60 python3 $S/plane_stages.py /tmp/gzr $v 20 ${N:-30} 2>&1 | grep -v "Warn\|2 MiB"
    done
    PYTHONPATH=/tmp/site:$src timeout 60 python3 $S/plane_stages.py /tmp/gzr remote-full-0 0 ${N:-30} 2>&1 | grep -v "Warn\|2 MiB"
  done
done 2>&1 | tee $OUT/plane_ab.txt
