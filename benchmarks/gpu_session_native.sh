set -u
gcc -O3 -shared -fPIC -pthread -fvisibility=hidden src/gpu_zarr/engine/_native/gz_native.c -o src/gpu_zarr/engine/_native/libgz_native.so -ldl || echo "NATIVE BUILD FAILED"
export OUT
bash benchmarks/on_gpu_machine.sh tests 2>&1 | tail -25
export PYTHONPATH=/tmp/site:src
python3 -c "from gpu_zarr.engine import native; print(native.status())"
timeout 120 python3 benchmarks/native_floor.py --dir /tmp/gz-floor --json $OUT/native_floor.json > $OUT/native_floor.txt 2>&1; tail -30 $OUT/native_floor.txt
# 4 GiB volumes for the reader sweep (written by one read of ours)
timeout 200 python3 -m gpu_zarr.bench --device gpu --workdir /tmp/gzb --out $OUT --no-progress --repeat 1 --layouts zstd-v3-1MiB,zstd-v3-4MiB,blosc-lz4-shuffle-v2,raw-v3-32MiB --readers ours-kvikio > $OUT/tp.log 2>&1; tail -c 1200 $OUT/tp.log
V1=$(ls -d /tmp/gzb/*/512x2048x2048/zstd-v3-1MiB.zarr | head -1); V4=$(ls -d /tmp/gzb/*/512x2048x2048/zstd-v3-4MiB.zarr | head -1); VB=$(ls -d /tmp/gzb/*/512x2048x2048/blosc-lz4-shuffle-v2.zarr | head -1); VR=$(ls -d /tmp/gzb/*/512x2048x2048/raw-v3-32MiB.zarr | head -1)
timeout 150 python3 benchmarks/sweep_engine.py "$V1" "$V4" "$VB" "$VR" --repeat 2 --configs "192x3:kvikio,192x3:native,192x3:native:nthreads=32" > $OUT/sweep.txt 2>&1; tail -16 $OUT/sweep.txt
