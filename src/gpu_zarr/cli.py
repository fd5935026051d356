"""The ``gpu-zarr`` command: demo, info, read, bench."""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from gpu_zarr.backends import BACKENDS
from gpu_zarr.errors import UsageError

__all__ = ["main"]

GiB = 1 << 30


def _console(stderr: bool = False):
    from rich.console import Console

    # soft_wrap: long lines (install hints, paths) are left to the terminal, never broken mid-command
    return Console(highlight=False, soft_wrap=True, stderr=stderr)


def _flags(message: str) -> str:
    """A library message in the CLI's words: ``prefer='cpu'`` -> ``--backend cpu``, hints once."""
    message = re.sub(r"""prefer=['"]([\w-]+)['"]""", r"--backend \1", message)
    message = re.sub(r"""backend=['"]([\w-]+)['"]""", r"--backend \1", message)
    message = re.sub(r"\blevel=(-?\d+)", r"--level \1", message)
    from gpu_zarr.errors import INSTALL_HINT

    first = message.find(INSTALL_HINT)
    if first >= 0:  # the hint once: later copies (from nested reasons) dropped
        head, tail = message[: first + len(INSTALL_HINT)], message[first + len(INSTALL_HINT):]
        message = head + tail.replace(", or " + INSTALL_HINT, "").replace(INSTALL_HINT, "the command above")
    return message


def _target(path: str) -> str:
    """The one place a PATH argument becomes a store location (local path or URL).

    Local paths are expanded (``~``); URLs (``scheme://``) are passed through as they are.
    """
    if "://" in path:
        return path
    return str(Path(path).expanduser())


def _option(text: str) -> tuple[str, Any]:
    """``--storage-option KEY=VALUE``: the value as JSON when it parses (``true``, ``8``,
    ``{"X-Token": "..."}``), else the string itself."""
    import json

    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. anon=true, endpoint_url=http://host:9000), "
                                         f"got {text!r}")
    try:
        return key.strip(), json.loads(value)
    except ValueError:
        return key.strip(), value


def _storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The remote store's options from ``--storage-option`` and ``--anon`` (None when none given)."""
    opts = dict(getattr(args, "storage_option", None) or [])
    if getattr(args, "anon", False):
        opts["anon"] = True
    return opts or None


def _add_store_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-option", "-o", action="append", type=_option, metavar="KEY=VALUE",
                   help="an option of a remote store (repeatable), as fsspec's storage_options: e.g. "
                        "anon=true, key=..., secret=..., endpoint_url=http://host:9000, region=eu-west-1, "
                        "requests=128, timeout=30, headers='{\"Authorization\": \"...\"}'; values parse "
                        "as JSON when they can. Without options: anonymous access, or the standard AWS "
                        "environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL...)")
    p.add_argument("--anon", action="store_true",
                   help="anonymous (unsigned) access to a public s3:// or gs:// bucket, even when AWS "
                        "credentials are set (the same as --storage-option anon=true)")


def _positive(text: str) -> int:
    """``--repeat N``: a whole number of reads, at least 1."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of reads, at least 1; got {text!r}")
    return n


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(str(text))


def _resolve_array(path: str, level: int | None, storage_options: dict[str, Any] | None = None):
    """A zarr array from an array path or an OME-Zarr image path (given level, default 0)."""
    from gpu_zarr.omezarr import is_ome_zarr, open_ome

    if is_ome_zarr(path, storage_options):
        img = open_ome(path, with_labels=False, storage_options=storage_options)
        n = len(img.levels)
        lv = 0 if level is None else level
        if not -n <= lv < n:
            raise UsageError(f"--level {lv}: {path} has {n} level(s) (0..{n - 1}, or -{n}..-1)")
        return img.open_level(lv)
    from gpu_zarr.plate import is_plate, is_well

    plate = is_plate(path, storage_options)
    if plate or is_well(path, storage_options):
        raise UsageError(f"{path} is an HCS {'plate' if plate else 'well'}: read one field's image "
                         "(e.g. PATH/A/1/0), or see gpu-zarr info PATH")
    from gpu_zarr.omezarr import open_node
    from gpu_zarr.zarr_io import open_array

    node = open_node(path, storage_options)
    if not hasattr(node, "shape"):  # a group that is no image, plate or well: name what to read in it
        try:
            members = sorted(k for k, _ in node.members())
        except Exception as exc:  # noqa: BLE001 - a member zarr cannot parse (an object dtype): name the group
            raise UsageError(f"{path} is a zarr group, not an array or an OME-Zarr image, and a member of it could "
                             f"not be read: {exc}. Read one of its arrays by its path.") from exc
        example = f" (e.g. gpu-zarr read {path.rstrip('/')}/{members[0]})" if members else ""
        raise UsageError(f"{path} is a zarr group, not an array or an OME-Zarr image; it holds "
                         + (", ".join(members) if members else "nothing") + f": read one of those{example}")
    arr = open_array(node, None)
    if level is not None:
        raise UsageError(f"--level {level}: {path} is a plain zarr array (shape {tuple(arr.shape)}), not an "
                         "OME-Zarr image with levels; leave --level out")
    return arr


def _stage_text(res: Any) -> str:
    """The engine's stages in ms, then what they leave unaccounted, so the line adds up to the read.

    The engine times its stages and its own total (``total_s``); time inside the engine that no
    stage claims is "other", time outside it (backend setup, the copy to the caller, progress
    reports) is "outside the engine". Stages that overlap (fetch and decode at once on the GPU
    path) sum to more than the engine's total: then the line says so instead.
    """
    stages = {k[:-2]: v for k, v in res.stats.items() if k.endswith("_s") and isinstance(v, float)}
    if not stages:
        return ""
    total = stages.pop("total", sum(stages.values()))
    parts = [f"{k} {v * 1e3:.1f} ms" for k, v in stages.items()]
    other = total - sum(stages.values())
    if other >= 5e-5:
        parts.append(f"other {other * 1e3:.1f} ms")
    elif other < -5e-5:
        parts.append(f"(stages overlap: {total * 1e3:.1f} ms in the engine)")
    outside = res.seconds - total
    if outside >= 5e-5:
        parts.append(f"outside the engine {outside * 1e3:.1f} ms")
    return ", ".join(parts) + f" = {res.seconds * 1e3:.1f} ms"


def _print_result(con: Any, label: str, res: Any) -> None:
    con.print(_esc(f"{label}:"))
    con.print(f"  backend     [bold]{_esc(res.backend)}[/bold]")
    con.print(f"  read        {res.nbytes / 2**20:.1f} MiB in {res.seconds * 1e3:.1f} ms")
    con.print(f"  throughput  [bold green]{res.gib_per_s:.2f} GiB/s[/bold green]")
    if res.gpu_bytes:
        con.print(f"  GPU memory  {res.gpu_bytes / 2**20:.1f} MiB")
    stages = _stage_text(res)
    if stages:
        con.print(_esc(f"  stages      {stages}"))
    con.print(_esc(f"why: {_flags(res.reason)}"))  # never wrapped mid-command (soft_wrap)


def _read(arr: Any, backend: str) -> Any:
    """One measured read; a progress bar on a terminal for reads longer than about a second."""
    from gpu_zarr.backends import check_backend
    from gpu_zarr.zarr_io import read_zarr

    return read_zarr(arr, prefer=check_backend(backend), progress="auto")


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
        from gpu_zarr.errors import INSTALL_HINT

        shown = INSTALL_HINT in caps.report()
        con.print("[yellow]No usable NVIDIA GPU here: reading into host memory (the cpu backend; the "
                  "line 'why' below says which path).[/yellow] "
                  + _esc("On a GPU machine install the CUDA extra" + (" (see the note above)." if shown
                                                                       else f": {INSTALL_HINT}.")))
    _read(arr, backend)  # warm-up: page cache, kernels, codecs
    res = _read(arr, backend)
    _print_result(con, "result", res)
    con.print(f"Backend used: {res.backend} - {res.gib_per_s:.2f} GiB/s")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    if args.path is None:
        from gpu_zarr.capabilities import probe

        print(probe().report())
        return 0
    print(describe(_target(args.path), backend=args.backend, storage_options=_storage_options(args)))
    return 0


def _array_lines(arr: Any, indent: str = "  ") -> list[str]:
    from gpu_zarr.reprs import codec_names

    shards = getattr(arr, "shards", None)
    return [f"{indent}shape {tuple(arr.shape)}, {arr.dtype}, chunks {tuple(arr.chunks)}"
            + (f", shards {tuple(shards)}" if shards else "") + f", codecs {', '.join(codec_names(arr))}"]


def _backend_line(arr: Any, backend: str) -> str:
    from gpu_zarr.backends import check_backend
    from gpu_zarr.zarr_io import choose_backend

    try:
        choice = choose_backend(arr, check_backend(backend))
        return f"backend: {choice.backend} (--backend {backend}): {choice.reason}"
    except Exception as exc:  # noqa: BLE001 - explained, not raised: info describes what would happen
        return f"backend: --backend {backend} cannot read it: {exc}"


def _image_lines(img: Any, indent: str = "") -> list[str]:
    lines = [f"{indent}OME-NGFF {img.version or '?'} image {img.name!r}; axes "
             + " ".join(f"{a.name}" + (f"[{a.unit}]" if a.unit else "") for a in img.axes)]
    for i, lv in enumerate(img.levels):
        lines.append(f"{indent}  level {i} ({lv.path}): shape {lv.shape}, {lv.dtype}, chunks {lv.chunks}"
                     + (f", shards {lv.shards}" if lv.shards else "") + f", codecs {', '.join(lv.codecs)}"
                     + f", scale {tuple(round(x, 6) for x in lv.scale)}")
    if img.channels:
        lines.append(f"{indent}  channels: " + ", ".join(f"{c.name} {c.color}" for c in img.channels))
    if img.labels:
        lines.append(f"{indent}  labels: " + ", ".join(img.labels))
    return lines


def describe(path: str, backend: str = "auto", storage_options: dict[str, Any] | None = None) -> str:
    """What a store holds and which backend would read it, as text (``gpu-zarr info PATH``).

    Format, groups, arrays or levels (shape, chunks, shards, codecs), OME metadata, HCS plate
    layout, and the backend :func:`gpu_zarr.zarr_io.choose_backend` takes for the first
    full-resolution array, with its reason. ``storage_options``: a remote store's options.
    """
    opts = storage_options
    import zarr

    from gpu_zarr.omezarr import is_ome_zarr, open_node, open_ome
    from gpu_zarr.plate import is_plate, is_well, open_plate, open_well

    node = open_node(path, opts)
    fmt = f"zarr v{node.metadata.zarr_format}"
    lines = [path]
    if is_plate(path, opts):
        plate = open_plate(path, storage_options=opts)
        assert plate.image is not None and plate.first_well is not None
        lines.append(f"format: {fmt}, OME-NGFF {plate.version} HCS plate {plate.name!r}")
        lines.append(f"plate: {len(plate.rows)} rows ({' '.join(plate.rows)}) x {len(plate.columns)} columns "
                     f"({' '.join(plate.columns)}), {len(plate.wells)} wells: "
                     + " ".join(w.name for w in plate.wells[:24]) + (" ..." if len(plate.wells) > 24 else ""))
        lines.append(f"fields: {len(plate.first_well.fields)} in the first well"
                     + (f" (field_count {plate.field_count})" if plate.field_count else "")
                     + (f"; acquisitions: {', '.join(str(a.get('name', a.get('id'))) for a in plate.acquisitions)}"
                        if plate.acquisitions else ""))
        lines.append(f"first field ({plate.first_well.field_path(0)}):")
        lines += _image_lines(plate.image, "  ")
        lines.append(_backend_line(plate.image.open_level(0), backend))
    elif is_well(path, opts):
        well = open_well(path, storage_options=opts)
        lines.append(f"format: {fmt}, OME-NGFF {well.version} HCS well, {len(well.fields)} fields "
                     f"({' '.join(well.fields)}), shown as a {well.grid[0]} x {well.grid[1]} grid")
        lines += _image_lines(well.image, "  ")
        lines.append(_backend_line(well.image.open_level(0), backend))
    elif is_ome_zarr(path, opts):
        img = open_ome(path, storage_options=opts)
        lines.append(f"format: {fmt}")
        lines += _image_lines(img)
        lines.append(_backend_line(img.open_level(0), backend))
    elif isinstance(node, zarr.Array):
        lines.append(f"format: {fmt} array")
        lines += _array_lines(node)
        lines.append(_backend_line(node, backend))
    else:
        lines.append(f"format: {fmt} group (no OME-NGFF multiscales, plate or well metadata)")
        groups = sorted(k for k, _ in node.groups())
        from gpu_zarr.store import arrays_of

        arrays = arrays_of(node, str(path))  # unsafe or broken members named, never parsed blindly
        if groups:
            lines.append("groups: " + " ".join(groups))
        for key, arr in arrays:
            lines.append(f"array {key}:")
            lines += _array_lines(arr)
        if arrays:
            lines.append(_backend_line(arrays[0][1], backend))
    return "\n".join(lines)


def cmd_read(args: argparse.Namespace) -> int:
    from gpu_zarr.zarr_io import choose_backend

    con = _console()
    path = _target(args.path)
    arr = _resolve_array(path, args.level, _storage_options(args))
    choice = choose_backend(arr, args.backend)
    con.print(_esc(f"{args.path}: shape {arr.shape}, {arr.dtype}, chunks {arr.chunks}; backend {choice}"))
    results = [_read(arr, args.backend) for _ in range(max(1, args.repeat))]
    res = sorted(results, key=lambda r: r.seconds)[(len(results) - 1) // 2]  # the median read
    _print_result(con, f"{args.path} (median of {len(results)} reads)", res)
    if len(results) > 1:
        con.print("reads: " + ", ".join(f"{r.seconds * 1e3:.1f} ms" for r in results)
                  + f"; median {statistics.median(r.seconds for r in results) * 1e3:.1f} ms")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpu-zarr`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from gpu_zarr.bench.cli import main as bench_main  # lazy: the harness loads only here

        return int(bench_main(argv[1:]) or 0)
    parser = argparse.ArgumentParser(prog="gpu-zarr", description="Zarr and OME-Zarr volumes onto an NVIDIA GPU, fast.")
    from gpu_zarr import __version__

    parser.add_argument("--version", action="version", version=f"gpu-zarr {__version__} (napari-gpu-zarr)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    backends = list(BACKENDS)
    p = sub.add_parser("demo", help="write a sample OME-Zarr, read it with the best backend, print speed")
    p.add_argument("--backend", default="auto", choices=backends)
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("info", help="what this machine offers (GPU, kvikio, GDS, nvCOMP), or with PATH: what a "
                       "store holds (format, arrays/levels, chunks, shards, codecs, OME metadata, plate "
                       "layout) and which backend would read it and why")
    p.add_argument("path", nargs="?", default=None)
    p.add_argument("--backend", default="auto", choices=backends, help="the backend to explain (default auto)")
    _add_store_options(p)
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("read", help="read a zarr array (or an OME-Zarr level) and report the speed")
    p.add_argument("path")
    p.add_argument("--backend", default="auto", choices=backends)
    p.add_argument("--level", type=int, default=None, help="OME-Zarr resolution level (default 0; OME-Zarr only)")
    p.add_argument("--repeat", type=_positive, default=3, metavar="N", help="reads; the median one is reported (default 3)")
    _add_store_options(p)
    p.set_defaults(func=cmd_read)
    from gpu_zarr.write.convert import add_cli as add_convert  # the writer's command, its arguments with it

    add_convert(sub, _add_store_options, _storage_options)
    sub.add_parser("bench", help="ours against zarr, kvikio, TensorStore, czarr: on your store (PATH) or on "
                   "synthetic volumes (gpu-zarr bench --help)")
    args = parser.parse_args(argv)
    from gpu_zarr.errors import GpuZarrError

    try:
        return args.func(args)
    except (GpuZarrError, UsageError, IndexError, FileNotFoundError, ValueError) as exc:
        print(f"gpu-zarr: {_flags(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
