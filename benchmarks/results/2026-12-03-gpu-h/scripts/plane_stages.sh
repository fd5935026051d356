python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $(ls .whl-min/*.whl .whl-ts/*.whl .whl-remote/*.whl 2>/dev/null) 2>&1 | tail -2
export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1
gcc -O3 -shared -fPIC -pthread -fvisibility=hidden src/gpu_zarr/engine/_native/gz_native.c src/gpu_zarr/engine/_native/gz_http.c -o src/gpu_zarr/engine/_native/libgz_native.so -ldl || exit 1
S=benchmarks/results/2026-12-03-gpu-h/scripts
python3 $S/write_volumes.py /tmp/gzr
for v in remote-full-0 remote-full-2-v2 remote-full-1; do timeout 60 python3 $S/plane_stages.py /tmp/gzr $v 20 30; done 2>&1 | grep -v Warn | tee $OUT/plane_stages.txt
timeout 60 python3 $S/plane_stages.py /tmp/gzr remote-full-0 0 30 2>&1 | grep -v Warn | tee -a $OUT/plane_stages.txt
