#!/usr/bin/env bash
# What ran on the H200 machine for the figures in README.md and benchmarks/README.md.
# Usage (repo root; wheels from ../shared/gpu/fetch-wheels.sh in .whl, optional .whl-ts with
# tensorstore and ml_dtypes, and .whl-dask for `scale`):
#   bash benchmarks/on_gpu_machine.sh setup    # only the wheels installed and the native library built (then run anything)
#   bash benchmarks/on_gpu_machine.sh tests    # every GPU test but the fuzz suite
#   bash benchmarks/on_gpu_machine.sh verify   # tests, then fuzz, in one call (~350 s: one call's overhead saved)
#   bash benchmarks/on_gpu_machine.sh chains   # codec chains beyond one core codec and 64 KiB inner chunks, with peers
#   bash benchmarks/on_gpu_machine.sh tiles    # the sharded chains' planes and tiles against TensorStore, 100 reads a pattern, 2 turns
#   bash benchmarks/on_gpu_machine.sh nocache  # the chains step's tiles with the chunk cache off; fused tiles per thread count
#   bash benchmarks/on_gpu_machine.sh fuzz     # the fuzz suite's GPU entries (a call of its own: ~560 s)
#   bash benchmarks/on_gpu_machine.sh browse   # browsing 1 GiB volumes with the CPU peers; per-stage plane reads
#   bash benchmarks/on_gpu_machine.sh readers  # the two staging readers on 4 GiB volumes
#   bash benchmarks/on_gpu_machine.sh speed    # 4 GiB throughput with peers and cold reads; budget curve
#   bash benchmarks/on_gpu_machine.sh scale    # dask on every GPU (kind nvidia-h200-x2), notebooks
#   bash benchmarks/on_gpu_machine.sh native   # the native host library: file-read floor, small reads vs peers, readers on 4 GiB
#   bash benchmarks/on_gpu_machine.sh remote   # remote tests and `bench --remote` (GPU and CPU decode) with TensorStore
#   bash benchmarks/on_gpu_machine.sh dask1    # dask on one GPU: one worker against the plain read, 16 GiB volumes
#   bash benchmarks/on_gpu_machine.sh ab       # today's tree against .ab-old/src on the README's 4 GiB layouts, in turns
#   bash benchmarks/on_gpu_machine.sh write    # the writer: 4 GiB write bench, every layout, peers beside (one call, < 560 s)
#   bash benchmarks/on_gpu_machine.sh write-ab # ours' sharded and plain writes, today's tree against .ab-old/src, in turns
#   bash benchmarks/on_gpu_machine.sh nvcomp-size  # nvCOMP's sizes of the same chunks in plain and sharded batches (seconds)
#   bash benchmarks/on_gpu_machine.sh pack     # everything in $OUT into $OUT/results.tgz (the device tool returns 8 files)
# Results go to $OUT (default ./gpu-results).
#
# `write` needs the pyramid peers, ome-zarr-py and ngff-zarr, and dask (for them and for our convert of a big source):
# .whl-ome (git-ignored, 39.6 MiB; what they need beyond the machine's image, which already has scipy, scikit-image,
# tensorstore, rich, psutil...; see benchmarks/README.md, the writer). With .whl (39 MiB) it is over the 64 MiB a call
# may carry, so two calls on one warm machine:
#   1. carry .whl-ome:       python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#                              --target /tmp/site .whl-ome/*.whl
#   2. carry .whl (.whl-ts): bash benchmarks/on_gpu_machine.sh write
# /tmp/site then has no zarr yet, so this script's install line below adds .whl (and .whl-ts) to it; pip's --target
# --upgrade replaces only the packages it installs, so the first call's stay.
set -uo pipefail
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
# wheels: .whl (fetch-wheels.sh), optional .whl-dask, .whl-ts (tensorstore, ml_dtypes), .whl-zarrs (zarrs-python,
# the Rust codec pipeline peer) and .whl-remote (obstore: without it the remote GPU test,
# test_remote.py::test_gpu_direct_engine_reads_remote, skips);
# once per machine. The carried paths must stay under 64 MiB per call: install the optional ones in a
# call of their own first (pip install --target /tmp/site ...), then carry .whl
[ -d /tmp/site/zarr ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl $(ls .whl-dask/*.whl .whl-ts/*.whl .whl-remote/*.whl .whl-zarrs/*.whl .whl-ome/*.whl 2>/dev/null) \
  || exit 1
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$OUT/gpus.txt"
# the native host library (git-ignored build output): built here with the flags of hatch_build.py
# (again whenever a source is newer than the library: a machine keeps the build of an earlier call)
N=src/gpu_zarr/engine/native
if [ ! -f $N/libgz_native.so ] || [ -n "$(find $N -name '*.c' -newer $N/libgz_native.so)" ]; then
  gcc -O3 -shared -fPIC -pthread -fvisibility=hidden $N/gz_native.c $N/gz_http.c $N/gz_write.c -o $N/libgz_native.so -ldl \
    || echo "native library not built"
fi
WORK=/tmp/gzb
# the older tree of `ab` and `write-ab` (.ab-old/src, carried), its native library built once
old_tree() {
  [ -d .ab-old/src ] || { echo "no .ab-old/src: git archive OLD src | tar -x -C .ab-old, and carry it"; exit 1; }
  local O=.ab-old/src/gpu_zarr/engine/native
  if [ -d $O ] && [ ! -f $O/libgz_native.so ]; then
    gcc -O3 -shared -fPIC -pthread -fvisibility=hidden $O/*.c -o $O/libgz_native.so -ldl || echo "old native library not built"
  fi
}
bench() { timeout "$1" python3 -m gpu_zarr.bench --device gpu --workdir $WORK --out "$OUT" --no-progress "${@:2}"; }

case "${1:-tests}" in
setup)
  ;;
verify)
  bash "$0" tests
  bash "$0" fuzz
  ;;
chains)
  # chains beyond one core codec (crc32c in shards, numcodecs.zstd, a v2 Delta filter, Shuffle + numcodecs' LZ4, big-endian
  # Blosc) and shards
  # of 64 KiB inner chunks, with sharded zstd as today's reference layout: whole reads against TensorStore, zarrs and
  # zarr's FusedCodecPipeline (each then cupy.asarray), then planes and 1024^2 tiles against their CPU reads.
  # Peers: tensorstore and ml_dtypes (.whl-ts), zarrs (.whl-zarrs); carried in two calls when .whl and both exceed 64 MiB.
  L=sharded-zstd-crc32c-v3,numcodecs-zstd-v3-1MiB,delta-zstd-v2,shuffle-lz4-v2,blosc-lz4-shuffle-big-endian-v2,sharded-zstd-64KiB-v3
  bench 320 --mode throughput --size 128,2048,2048 --layouts $L,sharded-zstd-v3-64MiB-1MiB --repeat 5 \
    --readers zarr-cpu+cupy,ours-kvikio,ours-auto,tensorstore+cupy,zarrs+cupy,zarr-fused+cupy > "$OUT/chains-throughput.log" 2>&1
  tail -40 "$OUT/chains-throughput.log"
  bench 220 --mode browse --size 64,2048,2048 --layouts $L,sharded-zstd-64MiB-1MiB --planes 20 --patterns random,tile \
    --readers zarr-cpu,ours-lazy-auto,tensorstore,zarrs,zarr-fused > "$OUT/chains-browse.log" 2>&1
  tail -40 "$OUT/chains-browse.log"
  ;;
tiles)
  # the chains step's 20 reads a pattern leave a p50 within the noise: 100 here, in two turns (separate processes)
  for turn in 1 2; do
    T="$OUT/tiles-$turn"; mkdir -p "$T"
    OUT="$T" bench 240 --mode browse --size 64,2048,2048 --planes 100 --patterns random,tile \
      --layouts sharded-zstd-64MiB-1MiB,sharded-zstd-crc32c-v3,sharded-zstd-64KiB-v3 \
      --readers ours-lazy-auto,tensorstore > "$T/tiles.log" 2>&1
    grep -A12 "^Browsing" "$T/tiles.log" | head -12
  done
  ;;
nocache)
  # the chains step's tiles again with the chunk cache off: what filling it costs a tile (fresh host memory for its
  # partial chunks); a call of its own (the chains step takes most of the 600 s a call may run)
  NC="$OUT/nocache"; mkdir -p "$NC"
  GPU_ZARR_CACHE_MIB=0 OUT="$NC" bench 90 --mode browse --size 64,2048,2048 \
    --layouts sharded-zstd-64MiB-1MiB,sharded-zstd-64KiB-v3 --planes 20 --patterns tile \
    --readers ours-lazy-auto,tensorstore > "$NC/chains-tiles-nocache.log" 2>&1
  tail -12 "$NC/chains-tiles-nocache.log"
  # the fused executor's tile against its threads (1.1 ms on 16 cores, 1.7 on 2): does it scale?
  for v in sharded-zstd-64KiB-v3 sharded-zstd-64MiB-1MiB; do
    timeout 60 python3 benchmarks/tile_threads.py $WORK/browse/64x2048x2048/$v.zarr --threads 1,2,4,8,16 \
      | tee "$NC/tile-threads-$v.md"
  done
  ;;
tests)
  # every GPU test: the engine-level ones in their own process (a GPU fault there cannot hide the rest)
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_nvcomp_batch.py tests/test_deflate.py \
    tests/test_blosc_gpu.py tests/test_zarr_v2_gpu.py > "$OUT/tests-codecs.txt" 2>&1
  tail -2 "$OUT/tests-codecs.txt"
  timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests --ignore=tests/test_nvcomp_batch.py \
    --ignore=tests/test_deflate.py --ignore=tests/test_blosc_gpu.py --ignore=tests/test_zarr_v2_gpu.py \
    --ignore=tests/test_dask_gpu.py --ignore=tests/test_fuzz.py > "$OUT/tests-rest.txt" 2>&1
  tail -2 "$OUT/tests-rest.txt"
  grep -hE "^(FAILED|ERROR)" "$OUT/tests-codecs.txt" "$OUT/tests-rest.txt" | head -30 || true
  ;;
fuzz)
  # the seeded fuzz suite on the GPU backends (~10800 GPU-marked cases, dask's with .whl-dask; hostile shapes in bounded
  # child processes), a call of its own: with the other GPU tests it ran past the 600 s a call
  # may take and left no summary line. -rfE: the failures' one-liners, then the summary.
  # pytest-xdist (carried in .whl) spreads it over 8 processes: ~280 s instead of past 560 s
  XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
  timeout 560 python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $XDIST tests/test_fuzz.py > "$OUT/tests-fuzz.txt" 2>&1
  echo "exit $?" >> "$OUT/tests-fuzz.txt"
  grep -E "passed|failed|^exit" "$OUT/tests-fuzz.txt" | tail -3 | tee "$OUT/tests-fuzz-summary.txt"
  ;;
browse)
  # browsing a 1 GiB volume, every layout, with the CPU peers; then what a first touch of thick chunks costs
  bench 240 --mode browse --size 128,2048,2048 --planes 20 \
    --readers zarr-cpu,ours-lazy-auto,tensorstore,zarrs > "$OUT/browse.log" 2>&1
  tail -c 3000 "$OUT/browse.log"
  # per-stage stats of single plane reads: thick chunks (first touch, then cached) and thin chunks
  V=$(ls -d $WORK/*/128x2048x2048/zstd-32x256x256.zarr 2>/dev/null | head -1)
  T=$(ls -d $WORK/*/128x2048x2048/zstd-1x512x1024.zarr 2>/dev/null | head -1)
  [ -n "$V" ] && timeout 60 python3 - "$V" "$T" <<'PY' 2>&1 | tee "$OUT/first-touch.txt"
import sys, time, json
from concurrent.futures import ThreadPoolExecutor
import numpy as np, zarr
from numcodecs import Zstd
from gpu_zarr.lazy import GpuLazyArray
from gpu_zarr.engine import EngineOptions
for path, planes in ((sys.argv[1], (0, 40, 1, 80, 41, 120)), (sys.argv[2], (3, 50, 90, 4, 51, 91))):
    prep = GpuLazyArray(zarr.open_array(path, mode="r"))._src.prepared()
    print(path)
    for z in planes:
        t = time.perf_counter()
        res = prep.read((z,), where="host", options=EngineOptions(cache=True))
        ms = (time.perf_counter() - t) * 1e3
        st = {k: (round(v * 1e3, 2) if isinstance(v, float) else v) for k, v in res.stats.items()
              if k.endswith("_s") or k in ("cache_hits", "pieces", "batches")}
        print(f"  plane {z}: {ms:.2f} ms", json.dumps(st))
# the floor for a thin plane: 8 chunk files read and decoded by 8 threads, no framework
import glob, os
files = sorted(glob.glob(os.path.join(sys.argv[2], "c", "7", "*", "*")))[:8]
pool, codec = ThreadPoolExecutor(8), Zstd()
def one(f):
    with open(f, "rb") as fh:
        return codec.decode(fh.read())
for rep in range(3):
    t = time.perf_counter(); list(pool.map(one, files)); a = (time.perf_counter() - t) * 1e3
    t = time.perf_counter(); out = np.empty((2048, 2048), np.uint16); out[:] = 1; b = (time.perf_counter() - t) * 1e3
    print(f"floor: 8 files read+decoded on 8 threads {a:.2f} ms; a fresh 8 MiB plane filled {b:.2f} ms")
PY
  ;;
readers)
  # the two staging readers on the 4 GiB zstd volumes (written here by one read of ours)
  bench 200 --repeat 1 --layouts zstd-v3-4MiB,zstd-v3-1MiB,sharded-zstd-v3-64MiB-1MiB,blosc-lz4-shuffle-v2 \
    --readers ours-kvikio > "$OUT/throughput.log" 2>&1
  tail -c 1500 "$OUT/throughput.log"
  V1=$(ls -d $WORK/*/512x2048x2048/zstd-v3-1MiB.zarr 2>/dev/null | head -1)
  V4=$(ls -d $WORK/*/512x2048x2048/zstd-v3-4MiB.zarr 2>/dev/null | head -1)
  VB=$(ls -d $WORK/*/512x2048x2048/blosc-lz4-shuffle-v2.zarr 2>/dev/null | head -1)
  timeout 150 python3 benchmarks/sweep_engine.py "$V1" "$V4" "$VB" --repeat 2 \
    --configs "${SWEEP:-192x3,192x3:threads,256x4:threads:lanes=4,192x3:threads:nthreads=24}" > "$OUT/sweep.txt" 2>&1
  tail -14 "$OUT/sweep.txt"
  ;;
speed)
  # whole 4 GiB arrays with the peers and a cold read per layout; then the engine's knobs and the budget curve
  bench 520 --repeat 3 --peer-repeat 1 --cold \
    --layouts raw-v3-32MiB,zstd-v3-4MiB,zstd-v3-1MiB,sharded-zstd-v3-64MiB-1MiB,blosc-lz4-shuffle-v2,blosc-zstd-bitshuffle-v2,sharded-blosc-zstd-v3 \
    --readers ours-kvikio,zarr-gpu,tensorstore+cupy,zarrs+cupy > "$OUT/throughput.log" 2>&1
  tail -c 4000 "$OUT/throughput.log"
  V1=$(ls -d $WORK/*/512x2048x2048/zstd-v3-1MiB.zarr 2>/dev/null | head -1)
  V4=$(ls -d $WORK/*/512x2048x2048/zstd-v3-4MiB.zarr 2>/dev/null | head -1)
  if [ -n "$V1" ] && [ -n "$V4" ] && [ -z "${NOSWEEP:-}" ]; then  # NOSWEEP=1: the peers' table only
    timeout 60 python3 benchmarks/sweep_engine.py "$V1" "$V4" --repeat 2 --configs "192x3,192x3:compat" \
      > "$OUT/sweep.txt" 2>&1
    tail -6 "$OUT/sweep.txt"
    C=""; for b in 512 1024 2048 3072 4096; do C="$C,4096x4:budget=$b:lanes=4"; done
    timeout 120 python3 benchmarks/sweep_engine.py "$V1" "$V4" --repeat 2 --png "$OUT/budget.png" \
      --configs "${C#,}" > "$OUT/budget.txt" 2>&1
    tail -12 "$OUT/budget.txt"
  fi
  ;;
ab)
  # no-regression check: the README's 4 GiB layouts read by today's tree and by an older one, in turns (old, new,
  # old, new: the machine's drift falls on both), each in a process of its own on the same volumes. The old tree:
  #   mkdir -p .ab-old && git archive OLD src | tar -x -C .ab-old      (carried: run's carry=[".ab-old"])
  old_tree
  L=${AB_LAYOUTS:-raw-v3-32MiB,zstd-v3-4MiB,zstd-v3-1MiB,sharded-zstd-v3-64MiB-1MiB,blosc-lz4-shuffle-v2,blosc-zstd-bitshuffle-v2,sharded-blosc-zstd-v3}
  for turn in 1 2; do
    for side in old new; do
      S=$([ $side = old ] && echo .ab-old/src || echo src)
      PYTHONPATH=/tmp/site:$S timeout 130 python3 -m gpu_zarr.bench --device gpu --workdir $WORK --no-progress \
        --repeat 3 --layouts $L --readers ours-kvikio --out "$OUT/ab-$side-$turn" > "$OUT/ab-$side-$turn.log" 2>&1
      echo "$side turn $turn: exit $?"
    done
  done
  python3 benchmarks/ab.py "$OUT" | tee "$OUT/ab.md"
  ;;
scale)
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_dask_gpu.py > "$OUT/tests-dask.txt" 2>&1
  tail -3 "$OUT/tests-dask.txt"
  timeout 200 python3 benchmarks/bench_dask.py --size-gib 4 --layouts zstd-1MiB,blosc-lz4 --workers 1,2 \
    --deadline-s 140 --out "$OUT" > "$OUT/dask.log" 2>&1
  tail -c 2500 "$OUT/dask.log"
  timeout 120 python3 examples/run_notebooks.py > "$OUT/notebooks.txt" 2>&1
  tail -12 "$OUT/notebooks.txt"
  ;;
native)
  python3 -c "from gpu_zarr.engine import native; print(native.status())"
  timeout 120 python3 benchmarks/native_floor.py --dir /tmp/gz-floor --json "$OUT/native_floor.json" > "$OUT/native_floor.txt" 2>&1
  tail -30 "$OUT/native_floor.txt"
  bench 200 --repeat 1 --layouts zstd-v3-1MiB,zstd-v3-4MiB,blosc-lz4-shuffle-v2,raw-v3-32MiB --readers ours-kvikio > "$OUT/tp.log" 2>&1
  V1=$(ls -d $WORK/*/512x2048x2048/zstd-v3-1MiB.zarr | head -1); V4=$(ls -d $WORK/*/512x2048x2048/zstd-v3-4MiB.zarr | head -1)
  VB=$(ls -d $WORK/*/512x2048x2048/blosc-lz4-shuffle-v2.zarr | head -1); VR=$(ls -d $WORK/*/512x2048x2048/raw-v3-32MiB.zarr | head -1)
  timeout 150 python3 benchmarks/sweep_engine.py "$V1" "$V4" "$VB" "$VR" --repeat 2 \
    --configs "192x3:kvikio,192x3:native,192x3:native:nthreads=32" > "$OUT/sweep-readers.txt" 2>&1
  tail -16 "$OUT/sweep-readers.txt"
  ;;
remote)
  # remote stores on the GPU machine: the remote tests (GPU decode of a remote store among them), then
  # `bench --remote` with the engine decoding on the GPU and on the CPU, TensorStore's http kvstore beside
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_remote.py tests/test_remote_groups.py \
    tests/test_remote_open.py tests/test_remote_perf.py > "$OUT/tests-remote.txt" 2>&1
  tail -2 "$OUT/tests-remote.txt"
  mkdir -p "$OUT/remote-gpu" "$OUT/remote-cpu"
  timeout 150 python3 -m gpu_zarr.bench --remote --device gpu --readers ours,tensorstore --planes 15 --repeat 3 \
    --workdir /tmp/gzr --out "$OUT/remote-gpu" > "$OUT/remote-gpu/log.txt" 2>&1
  timeout 150 python3 -m gpu_zarr.bench --remote --device cpu --readers ours,tensorstore --planes 15 --repeat 3 \
    --workdir /tmp/gzr --out "$OUT/remote-cpu" > "$OUT/remote-cpu/log.txt" 2>&1
  cat "$OUT/remote-gpu/remote.md" "$OUT/remote-cpu/remote.md" 2>/dev/null | grep -v "^|---" | cut -c1-150
  ;;
dask1)
  # dask on the one-GPU machine: one worker against the plain read of the same 16 GiB volumes
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_dask_gpu.py > "$OUT/tests-dask.txt" 2>&1
  tail -3 "$OUT/tests-dask.txt"
  timeout 400 python3 benchmarks/bench_dask.py --size-gib ${DASK_GIB:-16} --layouts zstd-1MiB,blosc-lz4,zstd-256KiB \
    --workers 1 --deadline-s 360 --workdir /tmp/gzd --out "$OUT" > "$OUT/dask.log" 2>&1
  tail -c 2500 "$OUT/dask.log"
  ;;
write)
  # the writer (issue 38): 4 GiB uint16 to the page cache, every layout, ours on the GPU with the automatic encode batch
  # (write_batch_bytes 0: up to 2 GiB), the peers in the same process: TensorStore (sharded, plain, convert),
  # ome-zarr-py and ngff-zarr (pyramid, from .whl-ome: see the header). Each writer's peak extra host and GPU memory
  # are columns of the table. Peers are timed once after their warm-up (the pyramid peers take tens of seconds a
  # write); the JSON and table are saved after each layout, so a run cut short keeps what it finished.
  python3 -c "import dask, ome_zarr, ngff_zarr; print('pyramid peers:', ome_zarr.__version__, ngff_zarr.__version__)" \
    2>&1 | tail -1
  timeout 540 python3 -m gpu_zarr.bench --mode write --size-mib 4096 --chunks 1,512,1024 --shard-mib 64 --repeat 2 \
    --peer-repeat 1 --layouts sharded,plain,pyramid,convert --writers ours-gpu,tensorstore,ome-zarr-py,ngff-zarr \
    --workdir /tmp/gzw --out "$OUT/write-bench.json" > "$OUT/write.log" 2>&1
  echo "exit $?" >> "$OUT/write.log"
  rm -rf /tmp/gzw
  cat "$OUT/write-bench.md" 2>/dev/null; tail -3 "$OUT/write.log"
  ;;
write-ab)
  # ours-gpu only, sharded and plain 4 GiB writes (the write step's settings), today's tree against an older one
  # (.ab-old/src, made and carried as for `ab`), in turns, each side in a process of its own: old, new, old, new
  old_tree
  for turn in 1 2; do
    for side in old new; do
      S=$([ $side = old ] && echo .ab-old/src || echo src)
      PYTHONPATH=/tmp/site:$S timeout 130 python3 -m gpu_zarr.bench --mode write --size-mib 4096 --chunks 1,512,1024 \
        --shard-mib 64 --repeat 2 --layouts sharded,plain --writers ours-gpu --workdir /tmp/gzw-$side \
        --out "$OUT/write-ab-$side-$turn.json" > "$OUT/write-ab-$side-$turn.log" 2>&1
      echo "$side turn $turn: exit $?"; grep -h "| ours-gpu |" "$OUT/write-ab-$side-$turn.md" 2>/dev/null
      rm -rf /tmp/gzw-$side
    done
  done
  ;;
nvcomp-size)
  # plain vs sharded stored bytes (ours-gpu 2.005 against 2.138 in results/h200/write): nvCOMP's sizes of the same
  # chunks in each layout's batch, on fresh and kept codecs, alone and together, with libzstd beside; then the two
  # writes in both orders with 3 lanes and 1, read back by zarr-python
  timeout 300 python3 benchmarks/nvcomp_write_sizes.py --size-mib 512 > "$OUT/nvcomp-sizes.txt" 2>&1
  echo "exit $?" >> "$OUT/nvcomp-sizes.txt"
  cat "$OUT/nvcomp-sizes.txt"
  ;;
pack)
  tar czf /tmp/results.tgz -C "$OUT" . && find "$OUT" -type f -delete && mv /tmp/results.tgz "$OUT/"
  ;;
*)
  echo "unknown step ${1}: setup, tests, verify, chains, tiles, nocache, fuzz, browse, readers, speed, scale, native, remote, dask1, ab, write, nvcomp-size or pack" >&2
  exit 2
  ;;
esac
