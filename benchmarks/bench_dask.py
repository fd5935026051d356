"""Dask scale-out benchmark: aggregate GiB/s of ``gpu_zarr.to_dask(...).persist()`` with 1 and 2 workers.

Run as::

    python3 benchmarks/bench_dask.py --size-gib 16 --layouts zstd-1MiB,blosc-lz4,zstd-256KiB --workers 1,2 --out OUT
    python3 benchmarks/bench_dask.py --size-gib 0.05 --cpu --out OUT        # CPU-only machine (CI)

For each worker count it starts a cluster (dask-cuda's ``LocalCUDACluster``, one worker per
GPU, each seeing its GPU as device 0; with ``--cpu`` a ``LocalCluster`` of processes), warms
every worker up, then per layout:

- with the smallest worker count, times a plain ``gpu_zarr.read_zarr`` of the whole volume
  on one worker (one GPU): the single-process reference;
- times ``to_dask(path).persist()`` + ``wait`` (``--repeat`` times, best reported): the
  blocks stay on the workers' GPUs;
- with the largest worker count, checks every persisted block: a checksum of each block is
  computed on the worker that holds it and compared with the checksum of zarr-python's CPU
  read of the same region, computed on the workers too. Nothing but the checksums reaches
  the client.

Volumes are shape ``(Z, 2048, 2048)`` uint16 (``Z`` from ``--size-gib``), the data of
``gpu_zarr.bench.volumes.make_slab`` (smooth structure + 8 noisy bits), written by many processes:

- ``zstd-1MiB``: zarr v3, zstd level 1, chunks 1x512x1024 (1 MiB);
- ``blosc-lz4``: zarr v2, numcodecs Blosc lz4 level 5 with byte shuffle, chunks 1x1024x1024 (2 MiB);
- ``zstd-256KiB``: zarr v3, zstd level 1, chunks 1x256x512 (256 KiB: the small-file case).

Writes ``dask-<size>-<device>.json`` and ``.md`` to ``--out`` and prints the Markdown.
Targets: 2 workers >= 1.9x the 1-worker aggregate rate; 1 worker within 10 % of the plain read.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import multiprocessing
import os
import platform
import shutil
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

_HERE = Path(__file__).resolve().parent

__all__ = ["LAYOUTS", "block_checksum", "build_parser", "ensure_volumes", "main"]

GiB = 1 << 30
YX = (2048, 2048)
DTYPE = np.dtype("uint16")

#: name -> (zarr format, chunks, codec description)
LAYOUTS: dict[str, dict[str, Any]] = {
    "zstd-1MiB": {"zarr_format": 3, "chunks": (1, 512, 1024), "codec": "zstd-1",
                  "label": "zarr v3, zstd level 1, 1x512x1024 chunks (1 MiB)"},
    "blosc-lz4": {"zarr_format": 2, "chunks": (1, 1024, 1024), "codec": "blosc-lz4-shuffle",
                  "label": "zarr v2, Blosc lz4 level 5 + shuffle, 1x1024x1024 chunks (2 MiB)"},
    "zstd-256KiB": {"zarr_format": 3, "chunks": (1, 256, 512), "codec": "zstd-1",
                    "label": "zarr v3, zstd level 1, 1x256x512 chunks (256 KiB: many small files)"},
}
TARGET_SCALING = 1.9
TARGET_VS_PLAIN = 0.10


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_dask", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--size-gib", type=float, default=16.0, help="decoded size of each volume")
    p.add_argument("--layouts", default="zstd-1MiB,blosc-lz4,zstd-256KiB", help=f"comma-separated, of {sorted(LAYOUTS)}")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts (one GPU each)")
    p.add_argument("--threads", type=int, default=1,
                   help="threads per worker (dask-cuda's default is 1: one block read at a time per GPU)")
    p.add_argument("--cpu", action="store_true", help="CPU only: LocalCluster, numpy blocks (backend cpu)")
    p.add_argument("--out", default=str(_HERE / "results"), help="folder for the JSON and Markdown")
    p.add_argument("--workdir", default=None,
                   help="where the volumes live (reused when complete); default /tmp/gpu-zarr-bench-dask")
    p.add_argument("--repeat", type=int, default=2, help="timed runs per measurement (best reported)")
    p.add_argument("--block-mib", default="auto",
                   help="comma-separated decoded MiB per dask block, each measured; 'auto' is to_dask's "
                        "default rule (1 GiB GPU / 128 MiB CPU); the first is the one checked")
    p.add_argument("--write-procs", type=int, default=None, help="processes writing the volumes (default: all cores)")
    p.add_argument("--no-check", action="store_true", help="skip the per-block checksum comparison")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="after this many seconds (from the start, writing included) optional runs are skipped: "
                        "repeats beyond the first and block sizes beyond the first")
    p.add_argument("--seed", type=int, default=0)
    return p


def _log(msg: str) -> None:
    print(f"[bench_dask {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------ volumes


def volume_shape(size_gib: float) -> tuple[int, int, int]:
    plane = YX[0] * YX[1] * DTYPE.itemsize
    return (max(1, round(size_gib * GiB / plane)), *YX)


def _spec(name: str, shape: tuple[int, ...], seed: int) -> dict[str, Any]:
    import gpu_zarr.bench.volumes as bench_volumes

    lay = LAYOUTS[name]
    return {"layout": name, "codec": lay["codec"], "chunks": list(lay["chunks"]), "shape": list(shape),
            "seed": seed, "generator": bench_volumes.GENERATOR_VERSION}


def _complete(path: Path, spec: dict[str, Any]) -> bool:
    import zarr

    try:
        got = dict(zarr.open_array(str(path), mode="r").attrs.get("gpu_zarr_bench_dask", {}))
    except Exception:  # noqa: BLE001 - anything unreadable is rewritten
        return False
    return bool(got.pop("complete", False)) and got == spec


def _create(path: Path, name: str, shape: tuple[int, ...], spec: dict[str, Any]) -> None:
    import numcodecs
    import zarr
    from zarr.codecs import ZstdCodec

    if path.exists():
        shutil.rmtree(path)
    lay = LAYOUTS[name]
    if name.startswith("zstd"):
        comp: Any = ZstdCodec(level=1)
    else:
        comp = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    zarr.create_array(str(path), shape=shape, chunks=lay["chunks"], dtype=DTYPE, fill_value=0,
                      zarr_format=lay["zarr_format"], compressors=comp,
                      attributes={"gpu_zarr_bench_dask": {**spec, "complete": False}})


def _write_part(paths: list[str], shape: tuple[int, int, int], z0: int, z1: int, seed: int) -> int:
    """In a writer process: planes z0:z1 of the test volume, into every path."""
    import zarr

    import gpu_zarr.bench.volumes as bench_volumes

    slab = bench_volumes.make_slab(shape, z0, z1, seed)
    with zarr.config.set({"threading.max_workers": 2, "async.concurrency": 16}):
        for p in paths:
            zarr.open_array(p, mode="r+")[z0:z1] = slab
    return slab.nbytes * len(paths)


def ensure_volumes(workdir: Path, names: list[str], shape: tuple[int, int, int], seed: int,
                   procs: int | None) -> dict[str, dict[str, Any]]:
    """Write (or reuse) one volume per layout; all missing ones in one parallel pass."""
    import gpu_zarr.bench.volumes as bench_volumes

    workdir.mkdir(parents=True, exist_ok=True)
    tag = "x".join(str(s) for s in shape)
    info: dict[str, dict[str, Any]] = {}
    todo = []
    for name in names:
        path = workdir / f"{name}-{tag}.zarr"
        spec = _spec(name, shape, seed)
        info[name] = {"path": str(path), "reused": _complete(path, spec), "write_s": 0.0}
        if not info[name]["reused"]:
            todo.append((name, path, spec))
    if todo:
        nbytes = math.prod(shape) * DTYPE.itemsize
        free = shutil.disk_usage(workdir).free
        if nbytes * len(todo) * 0.9 > free:
            raise SystemExit(f"not enough space in {workdir}: the volumes need up to "
                             f"{nbytes * len(todo) / GiB:.1f} GiB, {free / GiB:.1f} GiB free; use --workdir")
        for name, path, spec in todo:
            _create(path, name, shape, spec)
        procs = procs or max(1, (os.cpu_count() or 2))
        planes = max(1, min(16, shape[0] // max(1, 4 * procs)))
        parts = [(z, min(z + planes, shape[0])) for z in range(0, shape[0], planes)]
        _log(f"writing {', '.join(n for n, _, _ in todo)}: {len(todo)} x {nbytes / GiB:.2f} GiB, shape {shape}, "
             f"{len(parts)} parts on {procs} processes under {workdir}")
        t0 = time.perf_counter()
        paths = [str(p) for _, p, _ in todo]
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(procs, len(parts)), mp_context=ctx) as pool:
            futs = [pool.submit(_write_part, paths, shape, a, b, seed) for a, b in parts]
            done = sum(f.result() for f in futs)
        import zarr

        for _name, path, spec in todo:
            zarr.open_array(str(path), mode="r+").attrs["gpu_zarr_bench_dask"] = {**spec, "complete": True}
        dt = time.perf_counter() - t0
        _log(f"wrote {done / GiB:.2f} GiB in {dt:.1f} s ({done / GiB / dt:.2f} GiB/s)")
        for name, _path, _sp in todo:
            info[name]["write_s"] = round(dt, 2)
    for name in names:
        stored = bench_volumes.stored_bytes(Path(info[name]["path"]))
        info[name].update({"label": LAYOUTS[name]["label"], "shape": list(shape), "nbytes": math.prod(shape) * 2,
                           "stored_bytes": stored,
                           "ratio": round(math.prod(shape) * 2 / stored, 3) if stored else None})
    return info


# ------------------------------------------------------------------ on the workers


def block_checksum(b: Any) -> tuple[int, int, int, int]:
    """Order-sensitive checksum of an array's bytes, equal for numpy and cupy.

    The bytes are viewed as uint64 words in a (rows, 1024) matrix; returned are the word
    sum, the row sums weighted by row number, the column sums weighted by column number
    (all modulo 2**64) and the element count.
    """
    try:
        import cupy

        xp = cupy.get_array_module(b)
    except ImportError:
        xp = np
    flat = xp.ascontiguousarray(b).reshape(-1).view(xp.uint8)
    if flat.size % 8:
        flat = xp.concatenate([flat, xp.zeros((-flat.size) % 8, xp.uint8)])
    w = flat.view(xp.uint64)
    k = 1024
    if w.size % k:
        w = xp.concatenate([w, xp.zeros((-w.size) % k, xp.uint64)])
    m = w.reshape(-1, k)
    rows = m.sum(axis=1, dtype=xp.uint64)
    cols = m.sum(axis=0, dtype=xp.uint64)
    r = (rows * xp.arange(1, rows.size + 1, dtype=xp.uint64)).sum(dtype=xp.uint64)
    c = (cols * xp.arange(1, k + 1, dtype=xp.uint64)).sum(dtype=xp.uint64)
    return int(rows.sum(dtype=xp.uint64)), int(r), int(c), int(b.size)


def _zarr_checksum(path: str, region: tuple[tuple[int, int], ...]) -> tuple[int, int, int, int]:
    """zarr-python's own CPU read of a region, checksummed (runs on a worker)."""
    import zarr

    a = np.asarray(zarr.open_array(path, mode="r")[tuple(slice(s, e) for s, e in region)])
    return block_checksum(a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("=")))


def _warm(paths: list[str], backend: str) -> dict[str, Any]:
    """Worker warm-up: CUDA context, engine pools, codecs; says which device and backend serve."""
    from gpu_zarr.capabilities import probe
    from gpu_zarr.zarr_io import read_selection

    caps = probe()
    served = {}
    for p in paths:
        # 32 planes (256 MiB): above the small-read threshold, so nvCOMP and the GPU path warm up
        r = read_selection(p, (slice(0, 32),), prefer=backend)
        served[Path(p).name] = f"{r.backend}: {r.reason}"
    return {"pid": os.getpid(), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "gpu": caps.device_name if caps.gpu else None, "served": served}


def _plain_read(path: str, backend: str, repeat: int) -> dict[str, Any]:
    """A plain ``read_zarr`` of the whole volume on this worker; only the timings return."""
    from gpu_zarr.zarr_io import read_zarr

    secs = []
    res = None
    for _ in range(repeat):
        res = read_zarr(path, prefer=backend)  # type: ignore[arg-type]
        secs.append(res.seconds)
        nbytes, be, why = res.nbytes, res.backend, res.reason
        del res
        _free_gpu_pool()
    return {"seconds": secs, "nbytes": nbytes, "backend": be, "reason": why}


def _free_gpu_pool() -> None:
    try:
        import cupy
    except ImportError:
        return
    with contextlib.suppress(Exception):  # no device: nothing to free
        cupy.get_default_memory_pool().free_all_blocks()


# ------------------------------------------------------------------ clusters


def make_cluster(n: int, cpu: bool, threads: int = 1) -> tuple[Any, str]:
    """A cluster of ``n`` worker processes (``threads`` threads each): one per GPU, or CPU-only."""
    from distributed import LocalCluster

    if cpu:
        return LocalCluster(n_workers=n, threads_per_worker=threads, processes=True, dashboard_address=None), \
            "distributed.LocalCluster (processes, CPU)"
    import cupy

    ngpu = cupy.cuda.runtime.getDeviceCount()
    if n > ngpu:
        raise SystemExit(f"--workers asks for {n} workers, one per GPU, but this machine has {ngpu} GPU(s)")
    visible = ",".join(str(i) for i in range(ngpu))
    try:
        from dask_cuda import LocalCUDACluster

        return LocalCUDACluster(n_workers=n, threads_per_worker=threads, CUDA_VISIBLE_DEVICES=visible,
                                dashboard_address=None), "dask_cuda.LocalCUDACluster"
    except Exception as exc:  # noqa: BLE001 - fall back to the same layout by hand, and say so
        why = f"{type(exc).__name__}: {exc}"
        _log(f"dask_cuda.LocalCUDACluster unavailable ({why}); one Nanny per GPU with CUDA_VISIBLE_DEVICES instead")
        return nanny_per_gpu_cluster(n, ngpu, threads), f"SpecCluster, one Nanny per GPU (dask_cuda: {why})"


def nanny_per_gpu_cluster(n: int, ngpu: int, threads: int = 1) -> Any:
    """What LocalCUDACluster does for us: worker ``i`` sees GPU ``i`` first (its device 0)."""
    from distributed import Nanny, Scheduler, SpecCluster
    from distributed.system import MEMORY_LIMIT

    ids = list(range(ngpu))
    # host memory: the machine's share of each worker, as LocalCUDACluster gives. A Nanny's
    # "auto" is memory x nthreads / cores (8 GiB for 1 thread of 16 cores): dask counts the
    # persisted cupy blocks against it, spilled them to disk and killed the worker at 95 %
    workers = {i: {"cls": Nanny, "options": {"nthreads": threads, "memory_limit": MEMORY_LIMIT // n, "env": {
        "CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in ids[i:] + ids[:i])}}} for i in range(n)}
    return SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}})


# ------------------------------------------------------------------ measurement


def _regions(chunks: tuple[tuple[int, ...], ...]) -> list[tuple[tuple[int, int], ...]]:
    starts = [np.concatenate([[0], np.cumsum(c)]).astype(int).tolist() for c in chunks]
    return [tuple((starts[a][i], starts[a][i + 1]) for a, i in enumerate(idx))
            for idx in np.ndindex(*[len(c) for c in chunks])]


def _check(client, y, path: str) -> dict[str, Any]:
    import dask

    t0 = time.perf_counter()
    blocks = y.to_delayed().ravel()
    regions = _regions(y.chunks)
    ours = client.compute([dask.delayed(block_checksum)(b) for b in blocks], sync=True)
    ref = client.gather(client.map(_zarr_checksum, [path] * len(regions), regions, pure=False))
    bad = [str(r) for r, a, b in zip(regions, ours, ref) if tuple(a) != tuple(b)]
    return {"blocks": len(regions), "mismatched": len(bad), "first_mismatches": bad[:5],
            "equal": not bad, "seconds": round(time.perf_counter() - t0, 2)}


def measure(args: argparse.Namespace, volumes: dict[str, dict[str, Any]], t_start: float) -> dict[str, Any]:
    from distributed import Client, wait

    from gpu_zarr.dask_array import to_dask

    if __name__ != "__main__":  # imported (tests): ship this module's task functions by value
        import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    backend = "cpu" if args.cpu else "auto"
    counts = sorted({int(w) for w in args.workers.split(",") if w.strip()})
    blocks = parse_blocks(args.block_mib)
    skipped: list[str] = []

    def late(what: str) -> bool:
        if args.deadline_s is not None and time.perf_counter() - t_start > args.deadline_s:
            skipped.append(what)
            _log(f"past --deadline-s {args.deadline_s:g}: skipping {what}")
            return True
        return False
    out: dict[str, Any] = {"clusters": {}, "layouts": {
        n: {"plain": None, "dask": {label: {"runs": {}} for label in blocks}, "check": None} for n in volumes}}
    for n in counts:
        t0 = time.perf_counter()
        cluster, kind = make_cluster(n, args.cpu, args.threads)
        with cluster, Client(cluster) as client:
            client.wait_for_workers(n)
            warm = client.run(_warm, [v["path"] for v in volumes.values()], backend)
            out["clusters"][n] = {"kind": kind, "threads_per_worker": args.threads, "start_s": round(time.perf_counter() - t0, 1),
                                  "workers": list(warm.values())}
            _log(f"{n} worker(s) on {kind}: " + "; ".join(
                f"pid {w['pid']} GPU {w['gpu']} (CUDA_VISIBLE_DEVICES={w['CUDA_VISIBLE_DEVICES']})"
                for w in warm.values()))
            for name, vol in volumes.items():
                rec = out["layouts"][name]
                path, nbytes = vol["path"], vol["nbytes"]
                if n == counts[0]:
                    reps = 1 if late(f"{name}: plain read repeats") else args.repeat
                    p = client.submit(_plain_read, path, backend, reps, pure=False).result()
                    p["gib_s"] = round(nbytes / GiB / min(p["seconds"]), 3)
                    rec["plain"] = p
                    _log(f"{name}: plain read_zarr on one worker {p['gib_s']:.2f} GiB/s ({p['backend']})")
                for i, (label, chunks) in enumerate(blocks.items()):
                    if i and late(f"{name}: {n} worker(s), blocks {label}"):
                        continue
                    secs = []
                    y = None
                    for r in range(args.repeat):
                        if r and late(f"{name}: {n} worker(s), blocks {label}, repeat {r + 1}"):
                            break
                        del y
                        client.run(_free_gpu_pool)
                        t = time.perf_counter()
                        y = to_dask(path, chunks=chunks, backend=backend).persist()
                        wait(y)
                        secs.append(time.perf_counter() - t)
                        if r == 0:
                            chunktype = type(y._meta).__module__.split(".")[0] + "." + type(y._meta).__name__
                            nblocks, blocksize = y.npartitions, list(y.chunksize)
                            where = {str(k): len(v) for k, v in client.has_what().items()}
                    run = {"seconds": [round(x, 3) for x in secs], "gib_s": round(nbytes / GiB / min(secs), 3),
                           "blocks": nblocks, "block_shape": blocksize,
                           "block_mib": round(math.prod(blocksize) * DTYPE.itemsize / (1 << 20), 1),
                           "meta": chunktype, "keys_per_worker": where}
                    rec["dask"][label]["runs"][n] = run
                    _log(f"{name}: {n} worker(s), blocks {label}: to_dask().persist() {run['gib_s']:.2f} GiB/s "
                         f"({nblocks} blocks of {blocksize}, {chunktype})")
                    if i == 0 and n == counts[-1] and not args.no_check:
                        rec["check"] = _check(client, y, path)
                        _log(f"{name}: per-block checksums vs zarr CPU read: {rec['check']['blocks']} blocks, "
                             f"{rec['check']['mismatched']} mismatched ({rec['check']['seconds']} s)")
                    del y
                    client.run(_free_gpu_pool)
    out["skipped_for_time"] = skipped
    for rec in out["layouts"].values():
        for d in rec["dask"].values():
            runs = d["runs"]
            if 1 in runs and 2 in runs:
                d["scaling_2_vs_1"] = round(runs[2]["gib_s"] / runs[1]["gib_s"], 3)
            if 1 in runs and rec["plain"]:
                d["one_worker_vs_plain"] = round(runs[1]["gib_s"] / rec["plain"]["gib_s"], 3)
    return out


def parse_blocks(spec: str) -> dict[str, str | None]:
    """``--block-mib``: comma-separated MiB per block, ``auto`` for to_dask's default rule."""
    out: dict[str, str | None] = {}
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        if item == "auto":
            out["auto"] = None
            continue
        try:
            mib = float(item)
        except ValueError:
            raise SystemExit(f"--block-mib expects numbers (MiB) or 'auto', got {item!r}") from None
        if mib <= 0:
            raise SystemExit(f"--block-mib must be positive, got {item!r}")
        out[f"{mib:g} MiB"] = f"{int(mib * (1 << 20))}B"
    if not out:
        raise SystemExit("--block-mib: give at least one size or 'auto'")
    return out


# ------------------------------------------------------------------ report


def _versions() -> dict[str, str | None]:
    import importlib.metadata as md

    out: dict[str, str | None] = {}
    for name in ("napari-gpu-zarr", "dask", "distributed", "dask-cuda", "zarr", "numcodecs", "cupy-cuda13x",
                 "kvikio-cu13", "nvidia-nvcomp-cu13", "numpy"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def markdown(res: dict[str, Any]) -> str:
    lines = [(f"Dask scale-out, {res['size_gib']:g} GiB uint16 volumes {tuple(res['shape'])}, device "
             f"{res['device']}; aggregate GiB/s of decoded bytes, data persisted on the workers, "
             f"best of up to {res['repeat']} runs (all in the JSON)."), ""]
    counts = sorted({int(n) for rec in res["layouts"].values() for d in rec["dask"].values() for n in d["runs"]})
    head = ["layout", "ratio", "plain read_zarr (1 worker)", "dask blocks"]
    head += [f"{n} worker{'s' if n > 1 else ''}" for n in counts]
    head += [f"2 vs 1 (>= {TARGET_SCALING}x)", "1 worker vs plain (within 10 %)", "blocks checked vs zarr CPU"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rec in res["layouts"].items():
        vol = res["volumes"][name]
        for i, (label, d) in enumerate(rec["dask"].items()):
            runs = {int(k): v for k, v in d["runs"].items()}
            first = next(iter(runs.values()), None)
            row = [f"{name}: {vol['label']}", f"{vol['ratio']}",
                   f"{rec['plain']['gib_s']:.2f} ({rec['plain']['backend']})" if rec["plain"] else "-",
                   f"{label}: {first['blocks']} x {first['block_mib']:g} MiB" if first else label]
            row += [f"{runs[n]['gib_s']:.2f}" if n in runs else "-" for n in counts]
            sc = d.get("scaling_2_vs_1")
            row.append(f"{sc:.2f}x: {'met' if sc >= TARGET_SCALING else 'MISSED'}" if sc else "-")
            v = d.get("one_worker_vs_plain")
            row.append(f"{v:.2f}: {'met' if v >= 1 - TARGET_VS_PLAIN else 'MISSED'}" if v else "-")
            c = rec.get("check") if i == 0 else None
            row.append("-" if i else "skipped" if not c else
                       f"{c['blocks']} blocks, {'all equal' if c['equal'] else str(c['mismatched']) + ' MISMATCHED'}")
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for n, cl in res["clusters"].items():
        ws = "; ".join(f"GPU {w['gpu']} (CUDA_VISIBLE_DEVICES={w['CUDA_VISIBLE_DEVICES']})" for w in cl["workers"])
        served = {k: v for w in cl["workers"] for k, v in w["served"].items()}
        lines.append(f"- {n} worker(s), {cl.get('threads_per_worker', 1)} thread(s) each: {cl['kind']}, "
                     f"started in {cl['start_s']} s; {ws}")
        for k, v in served.items():
            lines.append(f"  - {k} read by {v}")
    if res.get("skipped_for_time"):
        lines.append(f"- skipped (past --deadline-s): {'; '.join(res['skipped_for_time'])}")
    lines.append(f"- versions: {', '.join(f'{k} {v}' for k, v in res['versions'].items() if v)}")
    lines.append(f"- command: `{res['command']}`")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [n.strip() for n in args.layouts.split(",") if n.strip()]
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown or not names:
        raise SystemExit(f"--layouts: unknown {unknown}; choose from {sorted(LAYOUTS)}")
    if args.cpu:
        device = "cpu"
    else:
        from gpu_zarr.capabilities import probe

        caps = probe()
        if not caps.gpu:
            raise SystemExit("no usable GPU here (" + "; ".join(caps.notes) + "); run with --cpu")
        device = "gpu"
    shape = volume_shape(args.size_gib)
    workdir = Path(args.workdir or "/tmp/gpu-zarr-bench-dask")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    volumes = ensure_volumes(workdir, names, shape, args.seed, args.write_procs)
    res: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": "python3 benchmarks/bench_dask.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "size_gib": args.size_gib, "shape": list(shape), "device": device, "repeat": args.repeat,
        "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "versions": _versions(), "volumes": volumes,
        "targets": {"scaling_2_vs_1": TARGET_SCALING, "one_worker_vs_plain_within": TARGET_VS_PLAIN},
    }
    rc = 0
    try:
        res.update(measure(args, volumes, t0))
    except Exception as exc:  # noqa: BLE001 - recorded, and the exit status says so
        traceback.print_exc()
        res["error"] = f"{type(exc).__name__}: {exc}"
        res.setdefault("layouts", {})
        res.setdefault("clusters", {})
        rc = 1
    res["total_s"] = round(time.perf_counter() - t0, 1)
    if any(rec.get("check") and not rec["check"]["equal"] for rec in res["layouts"].values()):
        rc = 2
    stem = f"dask-{args.size_gib:g}GiB-{device}"
    (out_dir / f"{stem}.json").write_text(json.dumps(res, indent=2, default=str))
    if "error" not in res:
        md_text = markdown(res)
        (out_dir / f"{stem}.md").write_text(md_text)
        print(md_text)
    _log(f"wrote {out_dir / stem}.json ({res['total_s']} s in all)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
