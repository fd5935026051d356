#!/usr/bin/env bash
# The last device call (thirteenth session, at the final code), carrying .whl (the GPU wheels)
# and .whl-remote (obstore): every GPU test (`on_gpu_machine.sh tests`) and the fuzz suite's GPU
# entries (`on_gpu_machine.sh fuzz`). Results in $OUT/tests and $OUT/fuzz.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl .whl-remote/*.whl 2>&1 | grep -v WARNING | tail -2
mkdir -p $OUT/tests $OUT/fuzz
OUT=$OUT/tests bash benchmarks/on_gpu_machine.sh tests
OUT=$OUT/fuzz bash benchmarks/on_gpu_machine.sh fuzz
