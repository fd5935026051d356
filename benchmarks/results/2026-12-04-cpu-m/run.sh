cd /work/main
S=benchmarks/results/2026-12-03-gpu-i/scripts
for round in 1 2 3; do for src in ${BASE:-.ab-prev/src} src; do echo "== $src (round $round)"
  for v in remote-full-0 remote-full-2-v2; do PYTHONPATH=$src:tests timeout 300 /work/ci5/.ci/venv/bin/python $S/plane_stages.py /tmp/gzr $v 20 30; done
done; done
