"""How a GPU-decoded whole read of a remote sharded array (answers arriving together at the
end of the transfer) depends on how the last group is cut into batches: FEED_BATCH_BYTES
(encoded bytes per batch) and the lanes/slots, with TensorStore beside. 20 ms a request.
Usage: python feed_probe.py WORKDIR [VOLUME_INDEX]"""
import contextlib
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from gpu_zarr import settings
from gpu_zarr.bench.remote import _clear, _host, _ours, _tensorstore, _volumes, _write
from gpu_zarr.bench.remote_server import ServerProcess
from gpu_zarr.engine import remote_read
from gpu_zarr.engine.pipeline import last_read_stats

MiB = 1 << 20
wd = Path(sys.argv[1])
i = int(sys.argv[2]) if len(sys.argv) > 2 else 1
vname, spec = list(_volumes("full").items())[i]
rel = f"remote-full-{i}" + ("-v2" if spec["fmt"] == 2 else "")
_write(wd / rel, spec)
variants = [("default", {}, None), ("feed48", {}, 48), ("feed64", {}, 64), ("feed128", {}, 128),
            ("slots6-lanes6", {"slots": 6, "lanes": 6}, None), ("default", {}, None)]
with ServerProcess(wd, latency=0.02) as srv:
    url = f"{srv.url}/{rel}"
    ts = _tensorstore(url)
    _host(ts((0,)))
    for label, sets, feed in variants:
        old = remote_read.FEED_BATCH_BYTES
        if feed:
            remote_read.FEED_BATCH_BYTES = feed * MiB
        try:
            with settings.set(**sets) if sets else contextlib.nullcontext():
                r = _ours("gpu")(url)
                _host(r((0,)))
                ms, st = [], {}
                for rep in range(7):
                    _clear()
                    t = time.perf_counter()
                    out = r(Ellipsis)
                    import cupy
                    cupy.cuda.Device().synchronize()
                    ms.append(1e3 * (time.perf_counter() - t))
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        st = last_read_stats() or {}
        finally:
            remote_read.FEED_BATCH_BYTES = old
        tms = []
        for rep in range(5):
            _clear()
            t = time.perf_counter()
            ts(Ellipsis)
            tms.append(1e3 * (time.perf_counter() - t))
        print(f"{vname} {label}: ours " + " ".join(f"{m:.0f}" for m in ms) + f" median {np.median(ms):.1f} | ts median "
              f"{np.median(tms):.1f}", flush=True)
        print("   ", json.dumps({k: (round(v * 1e3, 1) if isinstance(v, float) else v) for k, v in st.items()
                                 if k in ("fetch_s", "final_sync_s", "batches", "groups", "slots", "lanes", "batch_bytes",
                                          "in_place_batches", "decode_s", "wait_read_s", "total_s")}), flush=True)
