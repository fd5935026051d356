#!/usr/bin/env bash
# The second device call (ninth session as in the eighth; after plane_ab.sh installed the optional wheels into /tmp/site): the
# GPU wheels (.whl, from ../shared/gpu/fetch-wheels.sh), then the sixth session's device_run.sh
# with the GPU tests, the four remote suites once and `bench --remote --device gpu`.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  2>&1 | grep -v WARNING | tail -2
NO_FLOOR=1 NO_FEED=1 SEGV_RUNS=1 DEVS=gpu bash benchmarks/results/2026-12-02-gpu-f/scripts/device_run.sh
