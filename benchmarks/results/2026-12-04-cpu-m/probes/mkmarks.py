import os
import re
import shutil

shutil.rmtree("/work/probe/srcm", ignore_errors=True)
shutil.copytree("/work/main/src", "/work/probe/srcm")
os.chdir("/work/probe/srcm/gpu_zarr/engine")


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


ins(
    "pipeline.py",
    [
        ('    opts = options or EngineOptions()\n    if device == "gpu":', "read"),
        ("    stage = stage_for(lay)\n    region", "_read"),
        ("    box_shape = region.box_shape", "normalized"),
        ("    budget = _budget(opts, device, out_nbytes)", "streams"),
        ("    check_fits(out_nbytes, scratch if device", "budget"),
        ("    if given is not None and (tuple(given.shape)", "fits"),
        ("    stats.update(budget_bytes=budget", "given"),
        ("    own_ops = ops is None\n    ops = ops or", "own_ops"),
        ("    pieces = plan_pieces(lay, region.start", "ops"),
        ('    stats["plan_s"] = time.perf_counter() - t0\n', "planned"),
        (
            '        cache = rt.chunk_cache(device) if opts.cache and stage.decodes and settings.get("cache_bytes") else None\n        out, keep',  # noqa: E501
            "cache",
        ),
        ("        out, keep = run_remote_stream(", "cache got"),
    ],
)
ins(
    "remote_read.py",
    [
        ("    cores = CORES\n    drains", "rrs"),
        ("    lock = threading.Lock()\n    queue: list[Arrived]", "handoff"),
        ("    def ops_for(share: int)", "vars"),
        ("    t = time.perf_counter()\n    # a big read's answers land", "closures"),
        ("            counts = stream_remote(lay, pieces, lay.source, arrived, arena, handoff, ready)", "arena"),
    ],
)
ins(
    "remote_fetch.py",
    [
        ('    counts = {"requests": 0, "index_requests": 0, "whole_shards": 0}', "stream_remote"),
        ("    keys = [layout.chunk_key(c) for c in pieces.cells]", "sc"),
        ("    def hand(i: int, got: Any, queued: bool = False)", "keys"),
        ("    todo = []\n    miss = object()", "hand def"),
        ("    def done(j: int, got: Got | None) -> None:\n        i = todo[j]", "fetched looked"),
        ("    sink = Sink(handoff, ", "done def"),
        ("    source.stream([(keys[i], None) for i in todo], done, whole_cap(layout), arena, sink, on_sent)", "sink"),
    ],
)
ins(
    "remote.py",
    [
        ("        told = [on_sent is None]\n", "stream"),
        ("        left = list(range(len(jobs)))\n        if self.http", "sent def"),
        ("        http = self.http\n        assert http is not None", "_native"),
        ("        starts, ends, sizes = [0] * n, [0] * n, [0] * n", "reqs"),
        ('        reqs["start"], reqs["end"] = starts, ends', "loop"),
        ("        block: Any = None\n", "table made"),
        ("        left: list[int] = []\n        why: list[str] = []", "land def"),
        ('        http.fetch([f"{self.http_url}/{r}" for r, _ in jobs]', "done def"),
    ],
)
ins(
    "native_http.py",
    [
        (
            '        lib = _lib()[0]\n        if lib is None:\n            raise RuntimeError("the native HTTP client is not available")',  # noqa: E501
            "fetch",
        ),
        ("        landing = dests if isinstance(dests, Landing)", "lib"),
        ("        raw = _raw(reqs)", "caps"),
        ("        if landing is None:\n            _set(raw", "raw"),
        ("        table = raw.buffer_info()[0]", "cap set"),
        ("        c_urls = (ctypes.c_char_p * n)", "table"),
        ("        c_hdr, nhdr = _headers(self.headers)", "c_urls"),
        ("        sink_at: tuple[int | None, int | None] = (None, None)", "headers"),
        ("        cancel = ctypes.c_int32(0)", "sink"),
        ("        if sending is not None:\n            sending.set()", "done def"),
        ("        calls = _calls()\n        calls.append(done)", "agents"),
        ("            rc = lib.gz_http_fetch(c_urls", "calls"),
    ],
)
