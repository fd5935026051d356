"""A copy of src with a mark (builtins.M) before chosen lines of a remote plane's tail, for tail.py."""

import os
import re
import shutil

shutil.rmtree("/work/probe/srct", ignore_errors=True)
shutil.copytree("/work/main/src", "/work/probe/srct")
os.chdir("/work/probe/srct/gpu_zarr/engine")


def ins(path, pats):
    src = open(path).read()
    for pat, label in pats:
        idx = src.find(pat)
        if idx < 0:
            print("MISSING", path, pat[:50])
            continue
        line_start = src.rfind("\n", 0, idx) + 1
        indent = re.match(r"\s*", src[line_start:]).group(0)
        src = src[:line_start] + f"{indent}M({label!r})\n" + src[line_start:]
    open(path, "w").write(src)


ins("remote_read.py", [
    ('            stats["fetch_s"] = time.perf_counter() - t\n            ready()', "fetched"),
    ("            if native:\n                left = _arrivals_done(", "ready"),
    ('                stats["decoded_on_arrival"] = len(added) - len(left)', "arrivals done"),
    ("            errors = [f.exception() for f in futures]", "closed"),
    ("    for e in errors:\n        if e is not None:", "errors"),
    ("    stats.update(drain_copy_s=spent[0]", "cancel"),
    ("    return out, keep\n\n\nGROUP_BYTES", "stats"),
    ("    keep_bufs = arrivals.keep\n    st, det = arrivals.close()", "ad: start"),
    ("    left = []\n    for p, (a, j) in sorted(added.items()):", "ad: closed"),
])
ins("pipeline.py", [
    ("        result = ops.finish(out, None if region.is_box else region.post)\n        if keep is not None", "rrs returned"),
    ("        if keep is not None and cache is not None:\n            for key, chunk in keep.chunks:", "finished"),
    ('        stats["stream_s"] = time.perf_counter() - t\n        stats["total_s"]', "cached"),
    ("        return EngineResult(result, stats)\n\n    if lay.source is not None:", "result"),
])
