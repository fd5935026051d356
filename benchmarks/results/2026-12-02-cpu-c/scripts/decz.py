import time
from pathlib import Path

import numcodecs
import numpy as np

from gpu_zarr.engine import native

p = Path("/tmp/gzr/remote-full-0")
bufs = [np.frombuffer((p / "c/0" / k).read_bytes(), np.uint8) for k in ("0/0", "0/1", "1/0", "1/1")]
print([len(b) for b in bufs])
src = np.concatenate(bufs)
so = np.cumsum([0] + [len(b) for b in bufs[:-1]])
ss = [len(b) for b in bufs]
cn = 512 * 512 * 2
dst = np.empty(4 * cn, np.uint8)
do = np.arange(4) * cn
for th in (1, 2):
    for _ in range(20):
        native.decode("zstd", src, so, ss, dst, do, cn, th)
    c = time.process_time()
    t = time.perf_counter()
    for _ in range(200):
        native.decode("zstd", src, so, ss, dst, do, cn, th)
    print(th, "threads: cpu ms/plane", (time.process_time() - c) * 5, "wall", (time.perf_counter() - t) * 5)
b = numcodecs.Zstd()
c = time.process_time()
for _ in range(100):
    for x in bufs:
        b.decode(x, out=dst[:cn])
print("numcodecs zstd cpu ms/plane", (time.process_time() - c) * 10)
