"""A RangeServer in a process of its own whose request log (monotonic times, which compare
across processes) is written to a file when stdin says 'dump PATH'."""
import json
import sys

from gpu_zarr.bench.remote_server import RangeServer

root, lat = sys.argv[1], float(sys.argv[2])
with RangeServer(root, latency=lat) as srv:
    print("PORT", srv.url.rsplit(":", 1)[1], flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd and cmd[0] == "dump":
            with srv.lock:
                log = [dict(path=e["path"], range=e["headers"].get("range", ""), time=e["time"], end=e.get("end"))
                       for e in srv.log]
                srv.log.clear()
            with open(cmd[1], "w") as f:
                f.write(json.dumps(log))
            print("OK", flush=True)
