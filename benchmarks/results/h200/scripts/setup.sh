# Sourced by this folder's device scripts (fourteenth session): the wheels (.whl-slim, .whl-ts,
# .whl-remote) into /tmp/site, the native library built in each source tree named in $TREES
# (default: src), and the `bench --remote --size full` volumes in /tmp/gzr. Sets D (this folder).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  $(ls .whl-slim/*.whl .whl-ts/*.whl .whl-remote/*.whl 2>/dev/null) 2>&1 | grep -v WARNING | tail -2
export PYTHONUNBUFFERED=1
D=benchmarks/results/h200/scripts
for src in ${TREES:-src}; do
  gcc -O3 -shared -fPIC -pthread -fvisibility=hidden $src/gpu_zarr/engine/_native/gz_native.c \
    $src/gpu_zarr/engine/_native/gz_http.c -o $src/gpu_zarr/engine/_native/libgz_native.so -ldl || exit 1
done
[ -d /tmp/gzr/remote-full-1 ] || PYTHONPATH=/tmp/site:src python3 benchmarks/results/h200/scripts/write_volumes.py /tmp/gzr
