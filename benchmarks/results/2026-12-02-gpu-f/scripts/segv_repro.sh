#!/usr/bin/env bash
# The four remote suites in one process, N times, with a native backtrace on a crash
# (segv_bt.so preloaded) and the threads still alive at exit listed. Run from the repo root
# with PYTHONPATH set; results to $OUT/segv-K.txt.
N=${1:-3}
D=benchmarks/results/2026-12-02-gpu-f/scripts
gcc -O0 -g -shared -fPIC $D/segv_bt.c -o /tmp/segv_bt.so -ldl || exit 1
for k in $(seq 1 "$N"); do
  LD_PRELOAD=/tmp/segv_bt.so timeout 170 python3 - > "$OUT/segv-$k.txt" 2>&1 <<'PY'
import atexit, sys, threading
def alive():
    print("threads alive at exit:", [(t.name, t.daemon) for t in threading.enumerate()], file=sys.stderr, flush=True)
atexit.register(alive)
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-k", "not dask", "tests/test_remote.py",
                      "tests/test_remote_groups.py", "tests/test_remote_open.py", "tests/test_remote_perf.py"]))
PY
  echo "rc=$?" >> "$OUT/segv-$k.txt"
  echo "run $k: $(grep -E 'passed|failed' "$OUT/segv-$k.txt" | tail -1) $(tail -1 "$OUT/segv-$k.txt")"
  grep -A40 "segv_bt" "$OUT/segv-$k.txt" | head -45
  grep "threads alive" "$OUT/segv-$k.txt"
done
