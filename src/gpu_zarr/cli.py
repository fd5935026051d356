"""The ``gpu-zarr`` command: demo, info, read, bench."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]

GiB = 1 << 30


def _console():
    from rich.console import Console

    return Console(highlight=False)


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(str(text))


def _resolve_array(path: Path | str, level: int):
    """A zarr array from an array path or an OME-Zarr image path (given level)."""
    from gpu_zarr.omezarr import is_ome_zarr, read_omezarr

    if is_ome_zarr(path):
        arr, _ = read_omezarr(path, level=level)
        return arr
    from gpu_zarr.zarr_io import open_array

    return open_array(path)


def _print_result(con: Any, label: str, res: Any) -> None:
    from rich.table import Table

    t = Table(title=label, show_header=False, box=None)
    t.add_row("backend", f"[bold]{res.backend}[/bold]")
    t.add_row("why", _esc(res.reason))
    t.add_row("read", f"{res.nbytes / 2**20:.1f} MiB in {res.seconds * 1e3:.1f} ms")
    t.add_row("throughput", f"[bold green]{res.gib_per_s:.2f} GiB/s[/bold green]")
    if res.gpu_bytes:
        t.add_row("GPU memory", f"{res.gpu_bytes / 2**20:.1f} MiB")
    stages = {k: v for k, v in res.stats.items() if k.endswith("_s") and isinstance(v, float)}
    if stages:
        t.add_row("stages", ", ".join(f"{k[:-2]} {v * 1e3:.1f} ms" for k, v in stages.items()))
    con.print(t)


def _read_with_progress(con: Any, arr: Any, backend: str) -> Any:
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    from gpu_zarr.backends import check_backend
    from gpu_zarr.zarr_io import read_zarr

    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), console=con, transient=True) as bar:
        task = bar.add_task(f"reading ({backend})", total=arr.nbytes)
        return read_zarr(arr, prefer=check_backend(backend), progress=lambda d, t: bar.update(task, completed=d, total=t))


def cmd_demo(args: argparse.Namespace) -> int:
    from gpu_zarr.capabilities import probe
    from gpu_zarr.omezarr import read_omezarr
    from gpu_zarr.sample import sample_path

    con = _console()
    caps = probe()
    con.print("[bold]napari-gpu-zarr demo[/bold]")
    con.print(caps.report(), markup=False)
    path = sample_path()
    con.print(_esc(f"sample OME-Zarr: {path}"))
    arr, resolution = read_omezarr(path, level=0)
    con.print(f"level 0: shape {arr.shape}, {arr.dtype}, chunks {arr.chunks}, "
              f"{arr.nbytes / 2**20:.1f} MiB decoded, resolution {resolution}")
    backend = args.backend
    if not caps.gpu and backend == "auto":
        con.print("[yellow]No usable NVIDIA GPU here: using the CPU path (numpy via zarr-python).[/yellow] "
                  + _esc('On a GPU machine: pip install "napari-gpu-zarr[cuda13]".'))
    _read_with_progress(con, arr, backend)  # warm-up: page cache, kernels, codecs
    res = _read_with_progress(con, arr, backend)
    _print_result(con, "result", res)
    con.print(f"Backend used: {res.backend} - {res.gib_per_s:.2f} GiB/s")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from gpu_zarr.capabilities import probe

    print(probe().report())
    return 0


def cmd_read(args: argparse.Namespace) -> int:
    from gpu_zarr.zarr_io import choose_backend

    con = _console()
    arr = _resolve_array(args.path if "://" in args.path else Path(args.path), args.level)  # URLs stay strings
    choice = choose_backend(arr, args.backend)
    con.print(_esc(f"{args.path}: shape {arr.shape}, {arr.dtype}, chunks {arr.chunks}; backend {choice}"))
    res = None
    for _ in range(max(1, args.repeat)):
        res = _read_with_progress(con, arr, args.backend)
    _print_result(con, str(args.path), res)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpu-zarr`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from gpu_zarr.bench.cli import main as bench_main  # lazy: the harness loads only here

        return int(bench_main(argv[1:]) or 0)
    parser = argparse.ArgumentParser(prog="gpu-zarr", description="Zarr and OME-Zarr volumes onto an NVIDIA GPU, fast.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    backends = ["auto", "kvikio", "zarr-gpu", "cpu"]
    p = sub.add_parser("demo", help="write a sample OME-Zarr, read it with the best backend, print speed")
    p.add_argument("--backend", default="auto", choices=backends)
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("info", help="what this machine offers: GPU, kvikio, GDS, nvCOMP")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("read", help="read a zarr array (or an OME-Zarr level) and report the speed")
    p.add_argument("path")
    p.add_argument("--backend", default="auto", choices=backends)
    p.add_argument("--level", type=int, default=0, help="OME-Zarr resolution level (default 0)")
    p.add_argument("--repeat", type=int, default=2, help="reads; the last one is reported (default 2)")
    p.set_defaults(func=cmd_read)
    sub.add_parser("bench", help="ours against zarr, kvikio, TensorStore, czarr: on your store (PATH) or on "
                   "synthetic volumes (gpu-zarr bench --help)")
    args = parser.parse_args(argv)
    from gpu_zarr.errors import GpuZarrError

    try:
        return args.func(args)
    except GpuZarrError as exc:
        print(f"gpu-zarr: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
