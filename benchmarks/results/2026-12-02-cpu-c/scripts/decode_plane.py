"""The native decode of one plane's four 512 KiB chunks of the remote benchmark's volumes on 1
and 2 threads, against numcodecs. Argument: blosc (the Blosc lz4 + shuffle v2 volume) or zstd."""

import sys
import time
from pathlib import Path

import numcodecs
import numpy as np

from gpu_zarr.engine import native

codec = sys.argv[1]
if codec == "blosc":
    p, keys, ref = Path("/tmp/gzr/remote-full-2-v2"), ("0.0.0", "0.0.1", "0.1.0", "0.1.1"), numcodecs.Blosc()
else:
    p, keys, ref = Path("/tmp/gzr/remote-full-0/c/0"), ("0/0", "0/1", "1/0", "1/1"), numcodecs.Zstd()
bufs = [np.frombuffer((p / k).read_bytes(), np.uint8) for k in keys]
src = np.concatenate(bufs)
so = np.cumsum([0] + [len(b) for b in bufs[:-1]])
ss = [len(b) for b in bufs]
cn = 512 * 512 * 2
dst = np.empty(4 * cn, np.uint8)
do = np.arange(4) * cn
for th in (1, 2):
    for _ in range(20):
        native.decode(codec, src, so, ss, dst, do, cn, th)
    c, t = time.process_time(), time.perf_counter()
    for _ in range(200):
        native.decode(codec, src, so, ss, dst, do, cn, th)
    print(f"{th} threads: CPU {(time.process_time() - c) * 5:.2f} ms a plane, wall {(time.perf_counter() - t) * 5:.2f}")
c = time.process_time()
for _ in range(100):
    for x in bufs:
        ref.decode(x, out=dst[:cn])
print(f"numcodecs: CPU {(time.process_time() - c) * 10:.2f} ms a plane")
