#!/usr/bin/env bash
# The H100 runs of 2026-12-05 behind this folder; OUT is the device's result folder.
#   (first, carrying .whl: bash benchmarks/on_gpu_machine.sh nocache, at 5f8a040: nocache/)
#   bash run.sh ab       # carrying .whl and .ab-old (git archive e44555b src): the README's layouts, old and new in turns
#   bash run.sh verify   # carrying .whl: every GPU test, then the fuzz suite in what is left of the call's 600 s
#   bash run.sh tiles    # carrying .whl, the same warm machine: the sharded chains browsed, 100 reads a pattern
#   bash run.sh remote   # carrying .whl and .whl-remote (obstore): the remote GPU tests, which skip without obstore
#   (ab/ is the second ab call, at 5968ee9, after tiles; the first, at 5f8a040, gave 0.95-1.10 on every layout)
# write/, chains/ and lz4-walk/ are the previous session's (git log of this file has its run.sh).
set -uo pipefail
OUT=${OUT:-gpu-results}; mkdir -p "$OUT"
case "${1:-}" in
ab|tiles)
  bash benchmarks/on_gpu_machine.sh "$1"
  ;;
verify)
  bash benchmarks/on_gpu_machine.sh tests
  export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
  timeout $((585 - SECONDS)) python3 -m pytest -m gpu -q -rfE -p no:cacheprovider -n 8 tests/test_fuzz.py \
    > "$OUT/tests-fuzz.txt" 2>&1
  echo "exit $?" >> "$OUT/tests-fuzz.txt"
  grep -E "passed|failed|^exit" "$OUT/tests-fuzz.txt" | tail -3 | tee "$OUT/tests-fuzz-summary.txt"
  ;;
remote)
  bash benchmarks/on_gpu_machine.sh setup > /dev/null
  export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
  timeout 200 python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_remote.py tests/test_remote_chains.py \
    tests/test_remote_groups.py tests/test_hostile.py 2>&1 | tail -8 | tee "$OUT/tests-remote-gpu.txt"
  ;;
*) echo "usage: run.sh ab|verify|tiles|remote"; exit 2 ;;
esac
