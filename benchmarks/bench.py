"""napari-gpu-zarr benchmark: ours against the peers, in one run.

Run as ``gpu-zarr bench [options]`` or ``python benchmarks/bench.py [options]``.

Modes
-----
throughput (default)
    Whole-array reads onto the GPU of the figures.md layouts (raw v3 32 MiB, raw v2
    8 MiB, zstd v3 32/4/1 MiB chunks, sharded zstd v3 64 MiB shards of 1 MiB chunks):
    ours (``read_zarr_to_gpu`` with ``prefer="kvikio"`` and ``"auto"``) against zarr
    ``enable_gpu()``, kvikio ``GDSStore`` + ``enable_gpu()`` and zarr CPU +
    ``cupy.asarray``. Warm cache median of ``--repeat`` runs, plus a cold-cache run
    when the page cache can be dropped.
browse
    ms per random z-plane (p50/p95) of a 3D volume, for ours (lazy region reads and
    resident volume), zarr CPU, zarr ``enable_gpu()`` and dask over zarr.

Writes ``<mode>-<size>-<device>.json``, ``.md`` and ``.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
import traceback
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

import bench_browse  # noqa: E402
import bench_env  # noqa: E402
import bench_report  # noqa: E402
import bench_throughput  # noqa: E402
import bench_volumes  # noqa: E402
from bench_progress import Progress  # noqa: E402
from bench_readers import gpu_available  # noqa: E402

__all__ = ["main", "build_parser"]

DEFAULT_WORKDIR = "/tmp/gpu-zarr-bench"
DEFAULT_OUT = _HERE / "results"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu-zarr bench",
        description="Benchmark napari-gpu-zarr against zarr enable_gpu(), kvikio GDSStore and zarr CPU.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--mode", choices=("throughput", "browse"), default="throughput")
    p.add_argument(
        "--size",
        default="full",
        help="full (4 GiB throughput / 2 GiB browse), small, tiny (tests), or Z,Y,X; "
        "chunks and shards scale with the shape",
    )
    p.add_argument(
        "--device",
        choices=("auto", "gpu", "cpu"),
        default="auto",
        help="gpu: cupy results and GPU peers; cpu: numpy only (CI); auto: gpu when cupy sees a device",
    )
    p.add_argument("--workdir", default=DEFAULT_WORKDIR, help="where the test volumes live (reused)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="directory for JSON, Markdown and PNG")
    p.add_argument("--repeat", type=int, default=3, help="warm runs per reader (median reported)")
    p.add_argument("--planes", type=int, default=39, help="browse: random z-planes per reader")
    p.add_argument("--layouts", default="", help="comma-separated layout names (default: all)")
    p.add_argument("--readers", default="", help="comma-separated reader names (default: all)")
    p.add_argument("--no-cold", action="store_true", help="skip the cold-cache runs")
    p.add_argument("--rewrite", action="store_true", help="rewrite the volumes even when reusable")
    p.add_argument("--seed", type=int, default=0, help="data and plane-choice seed")
    p.add_argument("--write-threads", type=int, default=None, help="threads writing volumes")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    p.add_argument("--list", action="store_true", help="list layouts and readers, then exit")
    return p


def _split(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _resolve_device(requested: str) -> tuple[str, str]:
    ok, why = gpu_available()
    if requested == "cpu":
        return "cpu", "requested"
    if requested == "gpu":
        if not ok:
            raise SystemExit(f"--device gpu: {why}; use --device cpu to run without a GPU")
        return "gpu", why
    return ("gpu", why) if ok else ("cpu", f"no GPU: {why}")


def _layouts(mode: str, shape: tuple[int, int, int], only: list[str]) -> list[bench_volumes.Layout]:
    if mode == "throughput":
        full, table = bench_volumes.THROUGHPUT_SHAPES["full"], bench_volumes.THROUGHPUT_LAYOUTS
    else:
        full, table = bench_volumes.BROWSE_SHAPES["full"], bench_volumes.BROWSE_LAYOUTS
    lays = bench_volumes.scaled_layouts(table, full, shape)
    if only:
        unknown = set(only) - {lay.name for lay in lays}
        if unknown:
            raise SystemExit(
                f"unknown layout(s) {sorted(unknown)}; choose from {[lay.name for lay in lays]}"
            )
        lays = [lay for lay in lays if lay.name in only]
    return lays


def _size_tag(size: str, shape: tuple[int, ...]) -> str:
    return size if size in ("full", "small", "tiny") else "x".join(map(str, shape))


def _list(args: argparse.Namespace) -> int:
    for mode in ("throughput", "browse"):
        table = bench_volumes.THROUGHPUT_SHAPES if mode == "throughput" else bench_volumes.BROWSE_SHAPES
        shape = bench_volumes.parse_shape(args.size, table)
        print(f"{mode} layouts at {shape}:")
        for lay in _layouts(mode, shape, []):
            print(f"  {lay.name:<28} chunks {lay.chunks} shards {lay.shards} {lay.codec} v{lay.zarr_format}")
    for dev in ("gpu", "cpu"):
        rs = bench_throughput.default_readers(dev, None)
        ps = bench_browse.default_plane_readers(dev, None)
        print(f"{dev} throughput readers: {', '.join(r.name for r in rs)}")
        print(f"{dev} browse readers: {', '.join(r.name for r in ps)}")
    return 0



def _harness_error(v, exc: Exception, log) -> dict:
    """A volume whose timing loop itself failed: recorded, and the run goes on."""
    log(f"  FAILED: {exc}")
    return {**v.to_json(), "readers": {}, "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(limit=8)}


def _any_failed(layouts: list[dict]) -> bool:
    """True when one of our readers failed or returned wrong data, or a volume failed."""
    for rec in layouts:
        if "error" in rec:
            return True
        for r in rec.get("readers", {}).values():
            if r.get("kind") == "ours" and ("error" in r or r.get("correct") is False):
                return True
    return False

def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns 0, or 1 when one of our readers failed or was wrong."""
    args = build_parser().parse_args(argv)
    if args.list:
        return _list(args)
    if args.repeat < 1:
        raise SystemExit("--repeat must be >= 1")
    device, device_why = _resolve_device(args.device)
    table = bench_volumes.THROUGHPUT_SHAPES if args.mode == "throughput" else bench_volumes.BROWSE_SHAPES
    try:
        shape = bench_volumes.parse_shape(args.size, table)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    layouts = _layouts(args.mode, shape, _split(args.layouts))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{args.mode}-{_size_tag(args.size, shape)}-{device}"
    json_path = out_dir / f"{stem}.json"

    t_start = time.perf_counter()
    result: dict[str, Any] = {
        "mode": args.mode,
        "complete": False,
        "started": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "argv": list(argv) if argv is not None else sys.argv[1:],
        "device": device,
        "device_reason": device_why,
        "size": args.size,
        "shape": list(shape),
        "dtype": "uint16",
        "nbytes": int(2 * shape[0] * shape[1] * shape[2]),
        "repeat": args.repeat,
        "workdir": str(args.workdir),
        "layouts": [],
    }
    if args.mode == "browse":
        result["planes"] = args.planes
        result["seed"] = args.seed

    with Progress(enabled=not args.no_progress) as prog:
        log = prog.log
        log(f"gpu-zarr bench: mode {args.mode}, device {device} ({device_why}), shape {shape} uint16")
        result["environment"] = bench_env.environment(device)
        gpu = result["environment"].get("gpu", {})
        if isinstance(gpu, dict) and gpu.get("name"):
            result["device_name"] = gpu["name"]
        caps = result["environment"].get("capabilities", {})
        if caps.get("report"):
            log("capabilities:\n" + caps["report"])
        elif caps.get("error"):
            log(f"capabilities: {caps['error']}")

        # 1. volumes
        wtask = prog.task("writing volumes (MiB)", 1)

        def wprogress(done: int, total: int) -> None:
            prog.update(wtask, done >> 20, total >> 20)

        vols = bench_volumes.ensure_volumes(
            Path(args.workdir),
            args.mode,
            layouts,
            shape,
            seed=args.seed,
            rewrite=args.rewrite,
            log=log,
            progress=wprogress,
            threads=args.write_threads,
        )
        prog.update(wtask, 1, 1)
        for v in vols:
            log(
                f"volume {v.layout.name}: chunks {v.layout.chunks} shards {v.layout.shards}, "
                f"ratio {v.ratio:.3f}, {'reused' if v.reused else 'written'}"
            )

        # 2. timing
        failed = False
        if args.mode == "throughput":
            readers = bench_throughput.default_readers(device, _split(args.readers))
            if device == "gpu" and tuple(shape) == bench_volumes.THROUGHPUT_SHAPES["full"]:
                result["targets"] = bench_throughput.TARGETS  # they are for the 4 GiB volume
                result["extra_gpu_target_bytes"] = bench_throughput.EXTRA_GPU_TARGET
            if not args.no_cold:
                log("cold cache: trying `sync; echo 3 > /proc/sys/vm/drop_caches` (sync flushes new volumes)")
            cold = (False, "disabled (--no-cold)") if args.no_cold else bench_env.can_drop_caches()
            result["cold"] = {"measured": cold[0], "reason": cold[1] if not cold[0] else "caches dropped before each cold run"}
            log(f"cold cache: {'measured' if cold[0] else cold[1]}")
            ttask = prog.task("timing reads", len(vols) * len(readers), plain_lines=False)
            for v in vols:
                log(f"{v.layout.name} ({v.nbytes / 2**30:.2f} GiB, ratio {v.ratio:.2f}):")
                try:
                    rec = bench_throughput.time_volume(
                        v, readers, device,
                        repeat=args.repeat, cold=not args.no_cold and cold[0],
                        log=log, advance=lambda: prog.advance(ttask),
                    )
                except Exception as exc:  # the harness itself: record and go on
                    rec = _harness_error(v, exc, log)
                result["layouts"].append(rec)
                bench_report.write_json(result, json_path)
            failed = failed or _any_failed(result["layouts"])
        else:
            n_readers = len(bench_browse.default_plane_readers(device, _split(args.readers)))
            ttask = prog.task("timing planes", len(vols) * n_readers, plain_lines=False)
            for v in vols:
                log(f"{v.layout.name} ({v.nbytes / 2**30:.2f} GiB, ratio {v.ratio:.2f}):")
                readers = bench_browse.default_plane_readers(device, _split(args.readers))
                try:
                    bench_env.warm_files(v.path)
                    rec = bench_browse.time_planes(
                        v, readers, planes=args.planes, seed=args.seed,
                        log=log, advance=lambda: prog.advance(ttask),
                    )
                except Exception as exc:
                    rec = _harness_error(v, exc, log)
                result["layouts"].append(rec)
                bench_report.write_json(result, json_path)
            failed = failed or _any_failed(result["layouts"])

    # 3. report
    result["complete"] = True
    result["elapsed_s"] = round(time.perf_counter() - t_start, 2)
    md = (
        bench_report.throughput_markdown(result)
        if args.mode == "throughput"
        else bench_report.browse_markdown(result)
    )
    md_path = out_dir / f"{stem}.md"
    md_path.write_text(md)
    png_path = out_dir / f"{stem}.png"
    try:
        if args.mode == "throughput":
            bench_report.throughput_png(result, png_path)
        else:
            bench_report.browse_png(result, png_path)
        result["png"] = str(png_path)
    except Exception as exc:
        result["png"] = None
        result["png_error"] = f"{type(exc).__name__}: {exc}"
    result["markdown"] = str(md_path)
    bench_report.write_json(result, json_path)
    print()
    bench_report.print_tables(md)
    print(f"\nJSON: {json_path}\nMarkdown: {md_path}\nPNG: {result['png'] or result['png_error']}")
    print(f"elapsed {result['elapsed_s']:.1f} s" + ("  (some of our reads FAILED or were wrong: see above)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
