#!/usr/bin/env bash
# The second device call (eleventh session): the GPU wheels (.whl, from
# ../shared/gpu/fetch-wheels.sh .whl pytest-xdist execnet) and obstore (.whl-remote), then the
# sixth session's device_run.sh (the GPU tests, the four remote suites in one process,
# `bench --remote --device gpu`), then the fuzz suite's GPU entries. Results in $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl .whl-remote/*.whl 2>&1 | grep -v WARNING | tail -2
NO_FLOOR=1 NO_FEED=1 SEGV_RUNS=1 DEVS=gpu bash benchmarks/results/2026-12-02-gpu-f/scripts/device_run.sh
mkdir -p $OUT/fuzz
OUT=$OUT/fuzz timeout 280 bash benchmarks/on_gpu_machine.sh fuzz
