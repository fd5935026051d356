rm -f /tmp/go
PYTHONPATH=src python benchmarks/results/2026-12-02-cpu-c/scripts/oursonly.py $1 $2 > /tmp/perfit.out 2>&1 &
P=$!
while [ ! -f /tmp/go ]; do sleep 0.05; done
perf stat -e page-faults,context-switches,task-clock -p $P -- sleep 1 2>&1 | grep -E "page-faults|context|task-clock"
wait $P; tail -1 /tmp/perfit.out
