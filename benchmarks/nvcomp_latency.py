"""nvCOMP batched decode on the GPU: exactness, latency per call, and what corrupt input does.

Run on a GPU machine::

    python benchmarks/nvcomp_latency.py --out results/nvcomp_latency.json

Measures, for zstd, LZ4 and Deflate, 1 MiB uint16 chunks (smooth data plus noise) already
on the GPU: ms per call (median of 5, synchronised, statuses read back) for 1, 16, 256
and 1024 chunks through :class:`gpu_zarr.engine.nvcomp_batch.BatchedDecoder` and through
nvCOMP's Python API (``Codec.decode``); 4 streams at once; the host-side zstd frame check
(:mod:`gpu_zarr.engine.codecs.zstd_frames`) per GiB; and, in child processes, how corrupt input
(truncated, flipped bytes, wrong expected sizes) is reported by nvCOMP's statuses, by the
frame check and by numcodecs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

CHUNK_SHAPE = (512, 1024)  # uint16: 1 MiB
UNIQUE = 128


def _chunks(n: int, shape=CHUNK_SHAPE, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:shape[0], 0:shape[1]]
    out = []
    for k in range(n):
        base = 2000 + 1000 * np.sin((x + 37 * k) / 50.0) * np.cos((y + 11 * k) / 70.0)
        out.append((base + rng.normal(0, 20, shape)).astype(np.uint16))
    return out


def encode(algo: str, raw: bytes, level: int | None = None) -> bytes:
    if algo == "zstd":
        from numcodecs import Zstd
        return bytes(Zstd(level=1 if level is None else level).encode(raw))
    if algo == "lz4":
        from numcodecs import LZ4
        return bytes(LZ4().encode(raw))[4:]  # raw block: drop numcodecs' size prefix
    c = zlib.compressobj(1 if level is None else level, zlib.DEFLATED, -15)
    return c.compress(raw) + c.flush()


def _pack(enc: list[bytes], align: int = 16):
    sizes = np.array([len(e) for e in enc], np.int64)
    padded = -(-sizes // align) * align
    offs = np.concatenate([[0], np.cumsum(padded)[:-1]]).astype(np.int64)
    host = np.zeros(int(padded.sum()), np.uint8)
    for e, o in zip(enc, offs):
        host[o:o + len(e)] = np.frombuffer(e, np.uint8)
    return host, offs, sizes


def _median_ms(fn, reps: int = 5) -> float:
    fn()  # warm
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts) * 1e3)


def bench(out: dict, python_api: bool = True) -> None:
    import cupy

    from gpu_zarr.engine.nvcomp_batch import nvcomp_info

    out["nvcomp"] = nvcomp_info()
    raws = _chunks(UNIQUE)
    raw_bytes = [r.tobytes() for r in raws]
    nbytes = len(raw_bytes[0])
    counts = (1, 16, 256, 1024)
    stream = cupy.cuda.Stream(non_blocking=True)
    try:
        from nvidia import nvcomp
    except ImportError:
        nvcomp = None
    if not python_api:
        nvcomp = None
    for algo in ("zstd", "lz4", "deflate"):
        out[algo] = res = _bench_algo(algo, raw_bytes, nbytes, counts, stream, nvcomp)
        print(algo, json.dumps(res), flush=True)


def _bench_algo(algo, raw_bytes, nbytes, counts, stream, nvcomp) -> dict:
    import cupy

    from gpu_zarr.engine.codecs.zstd_frames import check_frames
    from gpu_zarr.engine.nvcomp_batch import BatchedDecoder

    with ThreadPoolExecutor(16) as pool:
        enc = list(pool.map(lambda r: encode(algo, r), raw_bytes))
    enc = [enc[k % UNIQUE] for k in range(max(counts))]
    host, offs, sizes = _pack(enc)
    res: dict = {"ratio": float(nbytes * len(enc) / sizes.sum())}
    src = cupy.asarray(host)
    dst = cupy.empty(nbytes * len(enc), np.uint8)
    dec = BatchedDecoder(algo)
    res["alignment(in,out,temp)"] = dec.alignment
    dst_off = np.arange(len(enc), dtype=np.int64) * nbytes
    dsz = np.full(len(enc), nbytes, np.int64)
    # exactness over all 1024
    dst.fill(0)
    dec.decode(src, offs, sizes, dst, dst_off, dsz, stream)
    stream.synchronize()
    got = dst.get()
    res["exact"] = all(got[k * nbytes:(k + 1) * nbytes].tobytes() == raw_bytes[k % UNIQUE]
                       for k in range(len(enc)))
    lat = {}
    for n in counts:
        ms = _median_ms(lambda n=n: dec.decode(src, offs[:n], sizes[:n], dst, dst_off[:n], dsz[:n], stream))
        # host time per call when calls are queued without waiting (checked afterwards)
        t = time.perf_counter()
        pend = [dec.decode(src, offs[:n], sizes[:n], dst, dst_off[:n], dsz[:n], stream, check=False)
                for _ in range(5)]
        host_ms = (time.perf_counter() - t) * 1e3 / 5
        for p in pend:
            p.check()
        lat[n] = {"ms": round(ms, 2), "GiB/s": round(n * nbytes / 2**30 / (ms / 1e3), 1),
                  "host_ms_per_queued_call": round(host_ms, 3),
                  "scratch_MiB": round(dec.temp_bytes(n, nbytes, n * nbytes) / 2**20, 1)}
    if algo == "deflate":
        crc = np.array([zlib.crc32(raw_bytes[k % UNIQUE]) for k in range(len(enc))], np.uint32)
        res["with_crc32_ms"] = {n: round(_median_ms(lambda n=n: dec.decode(
            src, offs[:n], sizes[:n], dst, dst_off[:n], dsz[:n], stream, crc32=crc[:n])), 2) for n in (1, 1024)}
    if algo in ("deflate", "zstd"):
        other = BatchedDecoder(algo, backend="default")
        res["backend_default_ms"] = {n: round(_median_ms(lambda n=n: other.decode(
            src, offs[:n], sizes[:n], dst, dst_off[:n], dsz[:n], stream)), 2) for n in (1, 1024)}
        other.close()
    res["lowlevel"] = lat
    res["scratch_allocations_after_all_calls"] = dec.scratch_allocations
    res["decoder_nbytes_MiB"] = round(dec.nbytes / 2**20, 1)
    # 4 streams x 256 at once vs one call of 1024
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(4)]
    decs = [BatchedDecoder(algo) for _ in range(4)]

    def four():
        pend = [decs[i].decode(src, offs[i * 256:(i + 1) * 256], sizes[i * 256:(i + 1) * 256], dst,
                               dst_off[i * 256:(i + 1) * 256], dsz[:256], streams[i], check=False)
                for i in range(4)]
        for p in pend:
            p.check()
    stream.synchronize()
    res["4_streams_x_256_ms"] = round(_median_ms(four), 2)
    # nvCOMP's Python API, same data
    if nvcomp is not None:
        py = {}
        try:
            name = {"zstd": "Zstd", "lz4": "LZ4", "deflate": "Deflate"}[algo]
            codec = nvcomp.Codec(algorithm=name, bitstream_kind=nvcomp.BitstreamKind.RAW,
                                 cuda_stream=int(stream.ptr))
            for n in counts:
                def run(n=n):
                    s = nvcomp.as_arrays(src, [int(v) for v in offs[:n]], [int(v) for v in sizes[:n]],
                                         cuda_stream=int(stream.ptr))
                    o = nvcomp.as_arrays(dst, [int(v) for v in dst_off[:n]], [nbytes] * n,
                                         cuda_stream=int(stream.ptr))
                    codec.decode(s, out=o)
                    stream.synchronize()
                ms = _median_ms(run)
                py[n] = {"ms": round(ms, 2), "GiB/s": round(n * nbytes / 2**30 / (ms / 1e3), 1)}
        except Exception as exc:  # noqa: BLE001  (recorded in the results)
            py["error"] = f"{type(exc).__name__}: {exc}"
        res["python_api"] = py
    if algo == "zstd":
        names = [f"c{k}" for k in range(len(enc))]
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            check_frames(host, offs, sizes, nbytes, names)
            ts.append(time.perf_counter() - t)
        gib = len(enc) * nbytes / 2**30
        res["frame_check_ms_per_GiB_decoded"] = round(float(np.median(ts)) * 1e3 / gib, 2)
        res["frame_check_ms_per_1024_chunks"] = round(float(np.median(ts)) * 1e3, 2)
        # 64 KiB chunks: more frames per GiB
        small = [encode("zstd", raw_bytes[k % UNIQUE][:65536]) for k in range(4096)]
        h2, o2, s2 = _pack(small)
        t = time.perf_counter()
        check_frames(h2, o2, s2, 65536, [str(k) for k in range(4096)])
        res["frame_check_ms_4096_chunks_of_64KiB"] = round((time.perf_counter() - t) * 1e3, 2)
    return res


def engine_gzip(out: dict, where: str) -> None:
    """Whole-array read of a 0.5 GiB v2 gzip (level 1) uint16 store: our engine vs zarr CPU + cupy.asarray."""
    import cupy
    import numcodecs
    import zarr

    from gpu_zarr.zarr_io import read_zarr

    path = f"{where}/gzip.zarr"
    shape, chunks = (256, 1024, 1024), (1, 1024, 1024)  # 2 MiB chunks, as bioformats2raw writes planes
    t = time.perf_counter()
    arr = zarr.create_array(path, shape=shape, chunks=chunks, dtype="<u2", zarr_format=2,
                            compressors=numcodecs.GZip(1), overwrite=True)
    planes = np.stack(_chunks(16, shape[1:], seed=5))
    for z in range(0, shape[0], 16):
        arr[z:z + 16] = planes
    gib = np.prod(shape) * 2 / 2**30
    res: dict = {"write_s": round(time.perf_counter() - t, 1), "GiB": float(gib)}
    arr = zarr.open_array(path, mode="r")

    def ours() -> None:
        r = read_zarr(arr, prefer="kvikio")
        cupy.cuda.runtime.deviceSynchronize()
        res.setdefault("stats", {k: v for k, v in r.stats.items() if isinstance(v, (int, float, str))})

    def zarr_cpu() -> None:
        cupy.asarray(arr[...])
        cupy.cuda.runtime.deviceSynchronize()
    got = read_zarr(arr, prefer="kvikio").data
    res["exact"] = bool((got[::37].get() == arr[::37]).all())
    del got
    for name, fn, reps in (("ours_kvikio", ours, 3), ("zarr_cpu_then_cupy", zarr_cpu, 1)):
        ms = _median_ms(fn, reps)
        res[name] = {"s": round(ms / 1e3, 3), "GiB/s": round(gib / (ms / 1e3), 2)}
    out["engine_gzip"] = res
    print("engine_gzip", json.dumps(res), flush=True)


CORRUPT_CHILD = r"""
import json, sys, numpy as np
import importlib.util
_spec = importlib.util.spec_from_file_location("nvcomp_latency", sys.argv[1])
_mod = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(_mod)
encode, _pack, _chunks = _mod.encode, _mod._pack, _mod._chunks
import cupy
from gpu_zarr.engine.nvcomp_batch import BatchedDecoder
from gpu_zarr.engine.decode import decode_batch_cpu
from gpu_zarr.engine.codecs.zstd_frames import check_frames
from gpu_zarr.errors import CorruptChunkError
algo, kind, trials = sys.argv[2], sys.argv[3], int(sys.argv[4])
rng = np.random.default_rng(hash((algo, kind)) % 2**32)
raws = [c.tobytes() for c in _chunks(16, (128, 512), seed=3)]  # 128 KiB chunks
good = [encode(algo, r) for r in raws]
size = len(raws[0])
dec = BatchedDecoder(algo)
stream = cupy.cuda.Stream(non_blocking=True)
counts = {}
def bump(k): counts[k] = counts.get(k, 0) + 1
for t in range(trials):
    enc = list(good)
    k = 5
    b = bytearray(enc[k])
    expected = np.full(16, size, np.int64)
    if kind == "truncate":
        b = b[:int(rng.integers(1, len(b)))]
    elif kind == "flip":
        for _ in range(int(rng.integers(1, 9))):
            i = int(rng.integers(0, len(b)))
            b[i] ^= int(rng.integers(1, 256))
    elif kind == "flip_header":
        i = int(rng.integers(0, min(32, len(b))))
        b[i] ^= int(rng.integers(1, 256))
    elif kind == "size_bigger":
        expected[k] = size + int(rng.integers(1, 4096))
    elif kind == "size_smaller":
        expected[k] = size - int(rng.integers(1, 4096))
    elif kind == "garbage":
        b = bytearray(rng.integers(0, 256, len(b), dtype=np.uint8).tobytes())
    enc[k] = bytes(b)
    host, offs, sizes = _pack(enc)
    dst_off = np.concatenate([[0], np.cumsum(expected)[:-1]]).astype(np.int64)
    names = [f"c{i}" for i in range(16)]
    # CPU reference (numcodecs / zlib)
    ref = np.zeros(int(expected.sum()), np.uint8)
    try:
        decode_batch_cpu(algo, host, offs, sizes, ref, dst_off, expected, names)
        cpu = "ok"
    except CorruptChunkError:
        cpu = "err"
    fc = "-"
    if algo == "zstd":
        try:
            check_frames(host, offs, sizes, expected, names)
            fc = "pass"
        except CorruptChunkError:
            fc = "caught"
    src = cupy.asarray(host)
    dst = cupy.zeros(int(expected.sum()), np.uint8)
    try:
        dec.decode(src, offs, sizes, dst, dst_off, expected, stream, names)
        stream.synchronize()
        gpu = "ok"
        same = bool((dst.get() == ref).all()) if cpu == "ok" else None
    except CorruptChunkError as e:
        gpu = "err" if "chunk c5" in str(e) else "err_wrong_chunk"
        same = None
    key = f"cpu={cpu} gpu={gpu}" + (f" frame_check={fc}" if algo == "zstd" else "")
    if gpu == "ok" and cpu == "ok":
        key += " same" if same else " DIFFERENT"
    bump(key)
print(json.dumps(counts))
"""


def corruption(out: dict, trials: int) -> None:
    res: dict = {}
    for algo in ("zstd", "lz4", "deflate"):
        for kind in ("truncate", "flip", "flip_header", "size_bigger", "size_smaller", "garbage"):
            t = time.perf_counter()
            try:
                p = subprocess.run([sys.executable, "-c", CORRUPT_CHILD, __file__, algo, kind, str(trials)],
                                   capture_output=True, text=True, timeout=90, check=False)
                r = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {
                    "CRASH": p.returncode, "stderr": p.stderr[-800:]}
            except subprocess.TimeoutExpired:
                r = {"HANG": "over 90 s"}
            except Exception as exc:  # noqa: BLE001  (recorded in the results)
                r = {"harness_error": f"{type(exc).__name__}: {exc}"}
            r["s"] = round(time.perf_counter() - t, 1)
            res[f"{algo}/{kind}"] = r
            print(algo, kind, json.dumps(r), flush=True)
    out["corruption"] = res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--skip-corruption", action="store_true")
    ap.add_argument("--skip-python-api", action="store_true")
    ap.add_argument("--engine-gzip", type=str, default=None, metavar="DIR",
                    help="also time a whole-array read of a v2 gzip store written in DIR")
    a = ap.parse_args()
    out: dict = {}
    bench(out, python_api=not a.skip_python_api)
    if not a.skip_corruption:
        corruption(out, a.trials)
    if a.engine_gzip:
        engine_gzip(out, a.engine_gzip)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
