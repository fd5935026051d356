"""``gpu-zarr bench``: ours against the peers, in one run.

Run as ``gpu-zarr bench [PATH] [options]`` or ``python -m gpu_zarr.bench [PATH] [options]``.

With PATH (a zarr array, or an OME-Zarr image with ``--level``): the user's own store is
read, never written, with every backend of ours available here and every peer
installed, and the comparison is printed (GiB/s and the ratio of ours to each peer).

Without PATH: synthetic test volumes, written to ``--workdir`` and reused.

throughput (default)
    Whole-array reads onto the GPU: raw v3/v2, zstd v3 at 32/4/1 MiB chunks, sharded
    zstd, Blosc lz4 + shuffle and Blosc zstd + bitshuffle (v2), sharded Blosc zstd (v3),
    gzip (v2). ``--cold`` adds one cold-cache read per layout against the disk's rate.
browse
    ms per plane (p50/p95) for random planes and for a scroll through consecutive
    planes (forward then back).

Writes ``<stem>.json``, ``.md`` and ``.png`` to ``--out``.

``--remote`` runs :mod:`gpu_zarr.bench.remote` instead (remote reads over loopback HTTP, its
own options: ``gpu-zarr bench --remote --help``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpu_zarr.bench.api import DEFAULT_WORKDIR, MODES, layouts_for, print_result, run
from gpu_zarr.errors import GpuZarrError

__all__ = ["build_parser", "main"]

DEFAULT_OUT = "gpu-zarr-bench"


class _DefaultsOnce(argparse.HelpFormatter):
    """``(default: X)`` after an option's help, once: not where the help already names its default,
    and not for a default that means "not given" (None, False, an empty string)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "(default" in text or default is None or default is False or default == "" \
                or default == argparse.SUPPRESS or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    """The ``gpu-zarr bench`` argument parser."""
    p = argparse.ArgumentParser(
        prog="gpu-zarr bench",
        description="Benchmark napari-gpu-zarr against zarr (CPU and enable_gpu()), kvikio GDSStore, "
        "TensorStore, zarrs-python and czarr (those installed): on your own store (PATH) or on synthetic "
        "volumes. gpu-zarr bench --list names the layouts and readers.",
        formatter_class=_DefaultsOnce,
    )
    p.add_argument("path", nargs="?", default=None,
                   help="your zarr array or OME-Zarr image (read only, never written); "
                        "omit for the synthetic volumes")
    p.add_argument("--level", type=int, default=0, help="OME-Zarr resolution level of PATH")
    p.add_argument("--mode", choices=MODES, default="throughput",
                   help="throughput: whole arrays, GiB/s; browse: ms per plane as a viewer reads them "
                        "(random planes and a scroll)")
    p.add_argument(
        "--size",
        default="full",
        help="synthetic volumes: full (4 GiB throughput / 2 GiB browse), small, tiny (tests), or Z,Y,X; "
        "chunks and shards scale with the shape",
    )
    p.add_argument(
        "--device",
        choices=("auto", "gpu", "cpu"),
        default="auto",
        help="gpu: cupy results and GPU peers; cpu: numpy only (CI); auto: gpu when cupy sees a device",
    )
    p.add_argument("--workdir", default=DEFAULT_WORKDIR, help="where the synthetic volumes live (reused)")
    p.add_argument("--out", default=None,
                   help=f"directory for JSON, Markdown and PNG (default: ./{DEFAULT_OUT} for synthetic "
                        "volumes; nothing is written for PATH unless given)")
    p.add_argument("--repeat", type=int, default=3, help="timed warm reads per reader (median reported)")
    p.add_argument("--peer-repeat", type=int, default=None,
                   help="timed warm reads per peer (default: --repeat); fewer saves time on slow peers")
    p.add_argument("--planes", type=int, default=39, help="browse: random planes, and the scroll's length")
    p.add_argument("--patterns", default="random,scroll", help="browse: random and/or scroll")
    p.add_argument("--layouts", default="", help="comma-separated layout names, e.g. zstd-v3-1MiB,gzip-v2 "
                   "(default: all; --list names them)")
    p.add_argument("--readers", default="", help="comma-separated reader names, ours and peers, e.g. "
                   "ours-auto,tensorstore (default: every one installed; --list names them)")
    p.add_argument("--cold", action="store_true",
                   help="throughput: per layout, one read of ours after dropping the page cache, "
                        "and the disk's own rate measured once")
    p.add_argument("--rewrite", action="store_true", help="rewrite the volumes even when reusable")
    p.add_argument("--seed", type=int, default=0, help="data and plane-choice seed")
    p.add_argument("--write-threads", type=int, default=None, help="threads writing volumes (default: half the cores, 2 to 8)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    p.add_argument("--list", action="store_true", help="list layouts and readers, then exit")
    p.add_argument("--remote", action="store_true",
                   help="instead: remote reads over a loopback HTTP server at 0/20/50 ms per request, ours "
                        "against zarr's FsspecStore (napari-ome-zarr's path) and TensorStore; its options: "
                        "gpu-zarr bench --remote --help")
    return p


def _split(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _list(size: str) -> int:
    import gpu_zarr.bench.volumes as volumes
    from gpu_zarr.bench.readers import browse_readers, throughput_readers

    for mode in MODES:
        table = volumes.THROUGHPUT_SHAPES if mode == "throughput" else volumes.BROWSE_SHAPES
        shape = volumes.parse_shape(size, table)
        print(f"{mode} layouts at {shape}:")
        for lay in layouts_for(mode, shape):
            shards = f" shards {lay.shards}" if lay.shards else ""
            print(f"  {lay.name:<28} v{lay.zarr_format} chunks {lay.chunks}{shards} {lay.codec_label}")
    for dev in ("gpu", "cpu"):
        rs = throughput_readers(dev)
        ps = browse_readers(dev)
        print(f"{dev} throughput readers: {', '.join(r.name for r in rs)}")
        print(f"{dev} browse readers: {', '.join(r.name for r in ps)}")
    return 0


_CONVERT = ["--layouts", "convert", "--writers", "ours-gpu,ours-cpu,tensorstore"]


def _without_write_mode(argv: list[str]) -> list[str] | None:
    """``argv`` less its ``--mode write`` (or ``--mode=write``), or None when that is not there.
    ``--mode convert`` is the write benchmark's convert layout (ours against TensorStore): its
    options first, so that the caller's own ``--layouts`` / ``--writers`` still win."""
    for k, a in enumerate(argv):
        if a in ("--mode=write", "--mode=convert"):
            return (_CONVERT if a.endswith("convert") else []) + argv[:k] + argv[k + 1:]
        if a == "--mode" and argv[k + 1:k + 2] in (["write"], ["convert"]):
            return (_CONVERT if argv[k + 1] == "convert" else []) + argv[:k] + argv[k + 2:]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns 0, or 1 when one of our readers failed or was wrong."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--remote" in argv:  # remote reads over loopback HTTP: gpu_zarr.bench.remote, its own options
        from gpu_zarr.bench.remote import main as remote_main

        return remote_main([a for a in argv if a != "--remote"])
    rest = _without_write_mode(argv)
    if rest is not None:  # the writer against its peers: gpu_zarr.bench.write, its own options
        from gpu_zarr.bench.write import main as write_main

        return write_main(rest)
    args = build_parser().parse_args(argv)
    if args.list:
        return _list(args.size)
    out = args.out if args.out is not None or args.path is not None else DEFAULT_OUT
    try:
        res = run(
            args.path,
            level=args.level,
            mode=args.mode,
            size=args.size,
            device=args.device,
            readers=_split(args.readers),
            layouts=_split(args.layouts),
            repeat=args.repeat,
            peer_repeat=args.peer_repeat,
            planes=args.planes,
            patterns=tuple(_split(args.patterns)),
            cold=args.cold,
            workdir=args.workdir,
            out=out,
            rewrite=args.rewrite,
            seed=args.seed,
            write_threads=args.write_threads,
            progress="lines" if args.no_progress else "bar",
            argv=argv,
        )
    except (ValueError, GpuZarrError) as exc:
        print(f"gpu-zarr bench: {exc}", file=sys.stderr)
        return 2
    print_result(res)
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
