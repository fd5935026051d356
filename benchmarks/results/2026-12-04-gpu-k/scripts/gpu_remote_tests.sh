#!/usr/bin/env bash
# A device call (eleventh session, after plane_ab.sh on the same machine): the GPU wheels (.whl)
# and obstore (.whl-remote), then the GPU tests of the remote suites and gpu_copy_stages.py
# (the copy to the GPU set up while the requests travel). Results in $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl .whl-remote/*.whl 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:src
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_remote.py tests/test_remote_groups.py \
  tests/test_remote_open.py tests/test_remote_options.py tests/test_remote_perf.py tests/test_lazy.py tests/test_zarr_io.py \
  > $OUT/tests-remote-gpu.txt 2>&1
tail -3 $OUT/tests-remote-gpu.txt
for v in remote-full-0 remote-full-2-v2; do
  timeout 60 python3 benchmarks/results/2026-12-04-gpu-k/scripts/gpu_copy_stages.py /tmp/gzr $v 40 2>&1 | grep -v Warn
done 2>&1 | tee $OUT/gpu_copy_stages.txt
