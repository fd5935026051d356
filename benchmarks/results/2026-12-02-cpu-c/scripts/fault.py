import sys
import threading
import time

import numpy as np

np._core.multiarray._set_madvise_hugepage(sys.argv[1] == "1")
n = 128 << 20
for rep in range(4):
    a = np.empty(n, np.uint8)
    t = time.perf_counter()
    c = time.process_time()
    k = int(sys.argv[2])
    parts = np.array_split(np.arange(0, n, 1 << 20), k)

    def fill(p, a=a):
        for s in p:
            a[s : s + (1 << 20)] = 1

    ts = [threading.Thread(target=fill, args=(p,)) for p in parts]
    [x.start() for x in ts]
    [x.join() for x in ts]
    print(
        f"huge={sys.argv[1]} threads={k}: {1e3 * (time.perf_counter() - t):.0f} ms wall {1e3 * (time.process_time() - c):.0f} cpu"
    )
    del a
