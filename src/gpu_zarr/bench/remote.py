"""``gpu-zarr bench --remote``: remote reads over loopback HTTP at 0/20/50 ms per request.

A :class:`~gpu_zarr.bench.remote_server.ServerProcess` (a loopback server in its own process, as a
real server is) serves synthetic volumes (written once to
``--workdir``) with the latency added to every request. For each volume and latency, a plain
client first GETs every object once (untimed: a fresh server process is slower at first); each
reader opens the array and reads its first plane, then the readers take turns reading the whole
array (``--repeat`` rounds) and single planes; reported: ms (best of ``--repeat`` for the whole
array, median over planes), time to the first plane (open + metadata + one plane, from nothing
cached), requests, the most requests in flight at once, and bytes moved.

Readers: ``ours`` (the engine's CPU host path over the native HTTP client:
:func:`gpu_zarr.engine.read` with ``device="cpu"`` and the array's layout parsed once when it
is opened, as its viewers read; ``--device gpu`` reads onto the GPU through the direct engine's
backend, as ``read_region`` and the lazy arrays do: a plane is a small read, decoded on CPU threads
and copied to the GPU once), ``zarr`` (zarr-python's
FsspecStore over aiohttp: what napari-ome-zarr and ome-zarr-py open URLs with), ``zarr+dask``
(the same through ``dask.array.from_zarr``, napari-ome-zarr's path), and ``tensorstore``
(its ``http`` kvstore).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpu_zarr.bench.remote_server import ServerProcess

__all__ = ["main", "run"]

MiB = 1 << 20


def _volumes(size: str) -> dict[str, dict[str, Any]]:
    z, y, c = {"full": (64, 1024, 512), "small": (16, 512, 512), "tiny": (4, 128, 64)}[size]
    return {
        "zstd v3, 512 KiB chunks": dict(fmt=3, shape=(z, y, y), chunks=(1, c, c), shards=None, codec="zstd"),
        "zstd v3, sharded 8x1024^2": dict(fmt=3, shape=(z, y, y), chunks=(1, c, c),
                                          shards=(min(8, z), y, y), codec="zstd"),
        "blosc lz4 v2, 512 KiB chunks": dict(fmt=2, shape=(z, y, y), chunks=(1, c, c), shards=None,
                                             codec="blosc"),
    }


def _write(path: Path, spec: dict[str, Any]) -> None:
    import zarr

    if (path / ("zarr.json" if spec["fmt"] == 3 else ".zarray")).exists():
        return
    if spec["fmt"] == 3:
        comp: Any = zarr.codecs.ZstdCodec(level=3)
    else:
        import numcodecs

        comp = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    arr = zarr.create_array(path, shape=spec["shape"], chunks=spec["chunks"], shards=spec["shards"],
                            dtype="<u2", compressors=comp, zarr_format=spec["fmt"], fill_value=0)
    rng = np.random.default_rng(0)
    z, y, x = spec["shape"]
    base = (np.add.outer(np.arange(y), np.arange(x)) % 4096).astype("<u2")
    step = spec["shards"][0] if spec["shards"] else 8
    for a in range(0, z, step):
        n = min(step, z - a)
        arr[a:a + n] = base[None] + rng.integers(0, 64, (n, y, x), dtype="<u2")


def _ours(device: str) -> Callable[[str], Any]:
    def open_(url: str) -> Any:
        from gpu_zarr.engine import read
        from gpu_zarr.engine.metadata import layout_of
        from gpu_zarr.store import open_array

        arr = open_array(url)
        lay = layout_of(arr)  # parsed once, as an open array's viewers do (TensorStore's open parses too)
        if device == "gpu":
            from gpu_zarr.backends import EngineBackend
            from gpu_zarr.engine.plan import normalize_selection

            # the direct engine as read_region and the lazy arrays use it: a small read (a plane)
            # decodes on CPU threads and is copied to the GPU once (nvCOMP's per-call latency)
            backend = EngineBackend(lay)
            return lambda sel: backend.read(arr, normalize_selection(lay.shape, sel), sel, options=None, progress=None,
                                            cancel=None, where="device")[0]
        from gpu_zarr.engine.ops import CpuOps
        from gpu_zarr.engine.pipeline import EngineOptions
        from gpu_zarr.engine.runtime import get_runtime

        # the CPU backend's host path: native decoders on the runtime's threads (as small reads)
        opts = EngineOptions()
        ops = CpuOps(get_runtime().pool("cpu-decode", opts.threads), opts.threads, fast=True)
        return lambda sel: read(arr, sel, device="cpu", options=opts, ops=ops, layout=lay).data
    return open_


def _zarr(url: str) -> Any:
    import zarr

    arr = zarr.open_array(url, mode="r")
    return lambda sel: arr[sel]


def _zarr_dask(url: str) -> Any:
    import dask
    import dask.array as da
    import zarr

    arr = da.from_zarr(zarr.open_array(url, mode="r"))

    def read(sel: Any) -> Any:
        with dask.config.set(scheduler="threads"):
            return arr[sel].compute()
    return read


def _tensorstore(url: str) -> Any:
    import tensorstore as ts

    driver = "zarr3" if not url.rstrip("/").endswith("v2") else "zarr"
    t = ts.open({"driver": driver, "kvstore": {"driver": "http", "base_url": url}}, read=True).result()
    return lambda sel: t[sel].read().result()


def _host(x: Any) -> np.ndarray:
    """numpy of a reader's result (``--device gpu`` gives cupy)."""
    return np.asarray(x.get() if hasattr(x, "get") else x)


def _warm(base: str, workdir: Path, rel: str) -> None:
    """GET every object of the volume once, from a plain client (urllib, 32 at once), before
    anything is timed: a server process's first answers (its code, its files) are slower, and
    they fell on whichever reader ran first."""
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    root = workdir / rel
    paths = [p.relative_to(workdir).as_posix() for p in sorted(root.rglob("*")) if p.is_file()]

    def get(path: str) -> None:
        with urllib.request.urlopen(f"{base}/{path}", timeout=120) as r:
            r.read()
    with ThreadPoolExecutor(32) as ex:
        list(ex.map(get, paths))


def _clear() -> None:
    from gpu_zarr.engine.runtime import get_runtime
    from gpu_zarr.engine.sources.remote import byte_cache

    byte_cache(get_runtime()).clear()
    get_runtime().clear_caches()


def run(workdir: Path, *, size: str = "full", latencies: Sequence[float] = (0, 20, 50), repeat: int = 2,
        planes: int = 5, readers: Sequence[str] = ("ours", "zarr", "zarr+dask", "tensorstore"),
        device: str = "cpu", log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run the remote benchmark; one row per (volume, latency, reader)."""
    import zarr

    makers: dict[str, Callable[[str], Any]] = {"ours": _ours(device), "zarr": _zarr, "zarr+dask": _zarr_dask,
                                                "tensorstore": _tensorstore}
    workdir.mkdir(parents=True, exist_ok=True)
    if device == "gpu":  # the CUDA context is the process's, not an open's: made before the first plane is timed
        import cupy

        cupy.asarray(np.zeros(1, np.uint8)).get()
    rows = []
    vols = _volumes(size)
    for i, (vname, spec) in enumerate(vols.items()):
        rel = f"remote-{size}-{i}" + ("-v2" if spec["fmt"] == 2 else "")
        _write(workdir / rel, spec)
        ref = zarr.open_array(workdir / rel, mode="r")
        check = np.asarray(ref[spec["shape"][0] // 2])
        nbytes = int(np.prod(spec["shape"])) * 2
        for lat in latencies:
            with ServerProcess(workdir, latency=lat / 1000) as srv:
                url = f"{srv.url}/{rel}"
                _warm(srv.url, workdir, rel)
                # each reader opens the array and reads its first plane, from nothing cached; then
                # the whole array and the planes, the readers taking turns (a reader that ran all
                # its reads first, on a server process nobody had used, was 10-20 % slower)
                opened, ttfp = {}, {}
                for name in readers:
                    _clear()
                    t = time.perf_counter()
                    read = makers[name](url)
                    first = _host(read((0,)))
                    ttfp[name] = time.perf_counter() - t
                    assert first.shape == check.shape
                    opened[name] = read
                whole: dict[str, list[float]] = {name: [] for name in readers}
                counts: dict[str, tuple[int, int, int]] = {}
                for _ in range(repeat):
                    for name in readers:
                        _clear()
                        srv.reset_counters()
                        t = time.perf_counter()
                        out = opened[name](Ellipsis)
                        whole[name].append(time.perf_counter() - t)
                        counts[name] = (srv.requests, srv.bytes_sent, srv.max_in_flight)
                        got = _host(out[spec["shape"][0] // 2])
                        assert np.array_equal(got, check), f"{name} read wrong pixels"
                        del out
                pl: dict[str, list[float]] = {name: [] for name in readers}
                plane_reqs = dict.fromkeys(readers, 0)
                for k in range(planes):
                    z = (7 * k + 3) % spec["shape"][0]
                    for name in readers:
                        _clear()
                        srv.reset_counters()
                        t = time.perf_counter()
                        opened[name]((z,))
                        pl[name].append(time.perf_counter() - t)
                        plane_reqs[name] += srv.requests
                for name in readers:
                    reqs, moved, inflight = counts[name]
                    best = min(whole[name])
                    row = dict(volume=vname, latency_ms=lat, reader=name, whole_ms=best * 1e3,
                               whole_mib_s=nbytes / MiB / best, plane_ms=statistics.median(pl[name]) * 1e3,
                               first_plane_ms=ttfp[name] * 1e3, requests=reqs, max_in_flight=inflight,
                               moved_mib=moved / MiB, plane_requests=plane_reqs[name] / planes)
                    rows.append(row)
                    log(f"{vname:30s} {lat:3.0f} ms {name:12s} whole {row['whole_ms']:8.0f} ms  plane "
                        f"{row['plane_ms']:6.1f} ms  first plane {row['first_plane_ms']:6.0f} ms  "
                        f"{reqs} req ({inflight} in flight), {row['moved_mib']:.0f} MiB")
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of :func:`run`'s rows."""
    out = ["| volume | ms/request | reader | whole (ms) | MiB/s | plane (ms) | first plane (ms) | requests "
           "(whole) | most in flight | MiB moved | requests/plane |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['volume']} | {r['latency_ms']:.0f} | {r['reader']} | {r['whole_ms']:.0f} | "
                   f"{r['whole_mib_s']:.0f} | {r['plane_ms']:.1f} | {r['first_plane_ms']:.0f} | {r['requests']} | "
                   f"{r['max_in_flight']} | {r['moved_mib']:.0f} | {r['plane_requests']:.1f} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``gpu-zarr bench --remote``."""
    from gpu_zarr.bench.api import DEFAULT_WORKDIR

    p = argparse.ArgumentParser(prog="gpu-zarr bench --remote", description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("full", "small", "tiny"), default="full",
                   help="full: 64x1024x1024 uint16 (128 MiB); small: 16x512x512; tiny: 4x128x128 (tests)")
    p.add_argument("--latency", default="0,20,50", help="ms added per request, comma-separated")
    p.add_argument("--readers", default="ours,zarr,zarr+dask,tensorstore")
    p.add_argument("--repeat", type=int, default=2, help="whole-array reads per reader (best reported)")
    p.add_argument("--planes", type=int, default=5, help="single-plane reads per reader (median reported)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="where ours decodes")
    p.add_argument("--workdir", default=DEFAULT_WORKDIR)
    p.add_argument("--out", default=None, help="write remote.json and remote.md here")
    a = p.parse_args(list(argv or []))
    rows = run(Path(a.workdir), size=a.size, latencies=[float(x) for x in a.latency.split(",")],
               repeat=a.repeat, planes=a.planes, readers=a.readers.split(","), device=a.device)
    md = table(rows)
    print(md)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "remote.json").write_text(json.dumps(rows, indent=1))
        (out / "remote.md").write_text(md + "\n")
    return 0
