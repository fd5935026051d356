import time
from pathlib import Path

import numcodecs
import numpy as np

from gpu_zarr.engine import native

p = Path("/tmp/gzr/remote-full-2-v2")
bufs = [np.frombuffer((p / k).read_bytes(), np.uint8) for k in ("0.0.0", "0.0.1", "0.1.0", "0.1.1")]
src = np.concatenate(bufs)
so = np.cumsum([0] + [len(b) for b in bufs[:-1]])
ss = [len(b) for b in bufs]
cn = 512 * 512 * 2
dst = np.empty(4 * cn, np.uint8)
do = np.arange(4) * cn
for th in (1, 2):
    for _ in range(50):
        native.decode("blosc", src, so, ss, dst, do, cn, th)
    c = time.process_time()
    t = time.perf_counter()
    for _ in range(500):
        native.decode("blosc", src, so, ss, dst, do, cn, th)
    print(th, "threads: cpu ms/plane", (time.process_time() - c) * 2, "wall", (time.perf_counter() - t) * 2)
b = numcodecs.Blosc()
c = time.process_time()
for _ in range(200):
    for x in bufs:
        b.decode(x, out=dst[:cn])
print("numcodecs blosc cpu ms/plane", (time.process_time() - c) * 5)
