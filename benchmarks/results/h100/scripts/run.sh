#!/usr/bin/env bash
# The H100 run of 2026-12-05 (second session), in order; OUT is the device's result folder.
#   bash run.sh write    # carrying .whl, after a call carrying .whl-ome and .whl-zarrs installed them into /tmp/site
#   bash run.sh chains   # carrying .whl (the same warm machine)
#   bash run.sh lz4      # carrying .whl and .ab-old (git archive 6c45236 src): the LZ4 walk before/after, then the GPU tests
set -uo pipefail
OUT=${OUT:-gpu-results}; mkdir -p "$OUT"
case "${1:-}" in
write|chains)
  bash benchmarks/on_gpu_machine.sh "$1"
  ;;
lz4)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
  for N in src/gpu_zarr/engine/native .ab-old/src/gpu_zarr/engine/native; do
    gcc -O3 -shared -fPIC -pthread -fvisibility=hidden $N/*.c -o $N/libgz_native.so -ldl
  done
  nvidia-smi -L | tee "$OUT/gpus.txt"
  # the LZ4 layouts read by the tree before the host walk (old) and after (new), in turns, each in its own process
  L=shuffle-lz4-v2,blosc-lz4-shuffle-v2,blosc-lz4-shuffle-big-endian-v2
  for turn in 1 2; do for side in old new; do
    S=$([ $side = old ] && echo .ab-old/src || echo src)
    PYTHONPATH=/tmp/site:$S timeout 80 python3 -m gpu_zarr.bench --device gpu --workdir /tmp/gzb --no-progress \
      --size 128,2048,2048 --repeat 5 --layouts $L --readers ours-kvikio --out "$OUT/ab-$side-$turn" \
      > "$OUT/ab-$side-$turn.log" 2>&1
    echo "$side $turn: exit $?"
  done; done
  python3 benchmarks/ab.py "$OUT" | tee "$OUT/ab.md"
  bash benchmarks/on_gpu_machine.sh tests
  # the fuzz suite in what is left of the call's 600 s (on_gpu_machine.sh fuzz, with that limit)
  timeout $((585 - SECONDS)) python3 -m pytest -m gpu -q -rfE -p no:cacheprovider -n 8 tests/test_fuzz.py \
    > "$OUT/tests-fuzz.txt" 2>&1
  echo "exit $?" >> "$OUT/tests-fuzz.txt"
  grep -E "passed|failed|^exit" "$OUT/tests-fuzz.txt" | tail -3 | tee "$OUT/tests-fuzz-summary.txt"
  ;;
*) echo "usage: run.sh write|chains|lz4"; exit 2 ;;
esac
