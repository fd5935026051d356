"""Within-round differences of plane_stages.py A/B files: ours minus TensorStore's host read
(ms), TensorStore copied to the GPU minus ours on the GPU, and when the requests reach the
server and the native call starts (ms from the call), per volume, before / after.
Usage: python3 pairs.py plane_ab*/plane_ab.txt"""
import collections
import re
import sys

res = collections.defaultdict(list)
for path in sys.argv[1:]:
    src = vol = None
    cur: dict[str, list[float]] = {}
    with open(path) as fh:
        for line in fh:
            m = re.match(r"== (\S+) \(round (\d)", line)
            if m:
                src = "before" if "ab-prev" in m.group(1) else "after"
                continue
            m = re.match(r"(\S+) at (\d+) ms", line)
            if m:
                vol = ("zstd" if m.group(1) == "remote-full-0" else "blosc") + "@" + m.group(2)
                cur = {}
                continue
            m = re.match(r"\s+(ts-gpu|ts|ours-host|ours-gpu)\s+(.*)", line)
            if not (m and src):
                continue
            who = m.group(1)
            cur[who] = [float(x) for x in m.group(2).split("|")]
            if who == "ts":
                res[(vol, src, "ts: first request at the server")].append(cur["ts"][1])
            elif who == "ts-gpu":
                res[(vol, src, "ts copied to the GPU - ours on the GPU")].append(cur["ts-gpu"][-1] - cur["ours-gpu"][-1])
            else:  # ours-host, ours-gpu (the machine without a GPU has no GPU rows)
                where = "host" if who == "ours-host" else "GPU"
                res[(vol, src, f"ours on the {where} - ts")].append(cur[who][-1] - cur["ts"][-1])
                res[(vol, src, "ours: first request at the server")].append(cur[who][1])
                res[(vol, src, "ours: native call")].append(cur[who][0])
for k in sorted(res):
    v = res[k]
    print(f"{k[0]:9s} {k[1]:6s} {k[2]:40s} {min(v):+.2f} .. {max(v):+.2f}  mean {sum(v) / len(v):+.2f}  (n={len(v)})")
