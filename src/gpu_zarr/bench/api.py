"""The benchmark as a Python call: :func:`run` returns a :class:`BenchResult`."""

from __future__ import annotations

import datetime as _dt
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BenchResult", "run", "layouts_for", "print_result", "DEFAULT_WORKDIR", "MODES"]

DEFAULT_WORKDIR = str(Path(tempfile.gettempdir()) / "gpu-zarr-bench")
MODES = ("throughput", "browse")


class BenchResult:
    """What one benchmark run measured.

    Attributes
    ----------
    data : dict
        Everything recorded (the JSON written by :meth:`save`): per volume and reader,
        times, GiB/s or ms per plane, correctness, errors, the machine.
    markdown : str
        The comparison tables as Markdown.
    failed : bool
        True when one of our readers failed or returned wrong data.
    files : dict of str to pathlib.Path
        What :meth:`save` wrote (``json``, ``md``, ``png``).

    Notes
    -----
    In a notebook the result displays as the tables and the chart (PNG inline, base64).
    """

    def __init__(self, data: dict[str, Any]) -> None:
        import gpu_zarr.bench.report as report

        self.data = data
        self.markdown = report.markdown(data)
        self.failed = _any_failed(data.get("layouts", []))
        self.files: dict[str, Path] = {}
        self._png: bytes | None = None
        self._png_error: str | None = None

    def png_bytes(self) -> bytes | None:
        """The chart as PNG bytes (None, with :attr:`png_error` set, without matplotlib)."""
        if self._png is None and self._png_error is None:
            import gpu_zarr.bench.report as report

            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "chart.png"
                try:
                    report.png(self.data, path)
                    self._png = path.read_bytes()
                except Exception as exc:
                    self._png_error = f"{type(exc).__name__}: {exc}"
        return self._png

    @property
    def png_error(self) -> str | None:
        """Why there is no chart (matplotlib missing...), else None."""
        self.png_bytes()
        return self._png_error

    def save(self, out: str | Path, stem: str | None = None) -> dict[str, Path]:
        """Write ``<stem>.json``, ``.md`` and ``.png`` (when matplotlib is installed) to ``out``.

        Returns
        -------
        dict
            ``{"json": path, "md": path, "png": path}`` (no ``png`` without matplotlib;
            the JSON then says why under ``png_error``).
        """
        import gpu_zarr.bench.report as report

        out = Path(out)
        _check_out(out, self.data)
        out.mkdir(parents=True, exist_ok=True)
        stem = stem or self.data.get("stem") or "bench"
        files: dict[str, Path] = {"json": out / f"{stem}.json", "md": out / f"{stem}.md"}
        files["md"].write_text(self.markdown)
        png = self.png_bytes()
        if png is not None:
            files["png"] = out / f"{stem}.png"
            files["png"].write_bytes(png)
            self.data["png"] = str(files["png"])
        else:
            self.data["png"] = None
            self.data["png_error"] = self._png_error
        self.data["markdown"] = str(files["md"])
        report.write_json(self.data, files["json"])
        self.files = files
        return files

    def _repr_html_(self) -> str:
        import gpu_zarr.bench.report as report

        note = f"no chart: {self.png_error}" if self.png_bytes() is None else ""
        return report.html(self.markdown, self.png_bytes(), note)

    def __repr__(self) -> str:
        d = self.data
        return (f"<BenchResult {d.get('mode')} {d.get('device')}: {len(d.get('layouts', []))} volume(s), "
                f"{'FAILED' if self.failed else 'ok'}>")

    def __str__(self) -> str:
        return self.markdown


def _any_failed(layouts: list[dict[str, Any]]) -> bool:
    """True when one of our readers failed or returned wrong data, or a volume failed."""
    for rec in layouts:
        if "error" in rec:
            return True
        for r in rec.get("readers", {}).values():
            if r.get("kind") == "ours" and ("error" in r or r.get("correct") is False):
                return True
    return False


def _check_out(out: Path, data: dict[str, Any]) -> None:
    """Refuse an output folder inside the user's store (we never write there)."""
    store = data.get("store")
    if not store:
        return
    o, s = Path(out).resolve(), Path(store).resolve()
    if o == s or s in o.parents:
        raise ValueError(f"--out {out} is inside the store {store}; gpu-zarr bench never writes into "
                         "the store it reads: choose another folder")


def _harness_error(v: Any, exc: Exception, log: Callable[[str], None]) -> dict[str, Any]:
    """A volume whose timing loop itself failed: recorded, and the run goes on."""
    log(f"  FAILED: {exc}")
    return {**v.to_json(), "readers": {}, "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(limit=8)}


def _resolve_device(requested: str) -> tuple[str, str]:
    from gpu_zarr.bench.readers import gpu_available

    if requested not in ("auto", "gpu", "cpu"):
        raise ValueError(f"device must be 'auto', 'gpu' or 'cpu', got {requested!r}")
    if requested == "cpu":
        return "cpu", "requested"
    ok, why = gpu_available()
    if requested == "gpu":
        if not ok:
            raise ValueError(f"device 'gpu': {why}; use device 'cpu' to run without a GPU")
        return "gpu", why
    return ("gpu", why) if ok else ("cpu", f"no GPU: {why}")


def layouts_for(mode: str, shape: tuple[int, int, int], only: Sequence[str] = ()) -> list[Any]:
    """The test layouts of ``mode`` scaled to ``shape``, restricted to ``only`` when given."""
    import gpu_zarr.bench.volumes as volumes

    if mode == "throughput":
        full, table = volumes.THROUGHPUT_SHAPES["full"], volumes.THROUGHPUT_LAYOUTS
    else:
        full, table = volumes.BROWSE_SHAPES["full"], volumes.BROWSE_LAYOUTS
    lays = volumes.scaled_layouts(table, full, shape)
    if only:
        unknown = set(only) - {lay.name for lay in lays}
        if unknown:
            raise ValueError(f"unknown layout(s) {sorted(unknown)}; choose from {[lay.name for lay in lays]}")
        lays = [lay for lay in lays if lay.name in only]
    return lays


def _dtypes(lays: Sequence[Any]) -> str:
    """The synthetic volumes' dtypes: ``uint16``, or e.g. ``uint16+uint8`` when the
    small-chunk uint8 layouts are among them (``nbytes`` is then the uint16 volume's)."""
    names = list(dict.fromkeys(getattr(lay, "dtype", "uint16") for lay in lays)) or ["uint16"]
    return "+".join(names)


def _size_tag(size: str, shape: tuple[int, ...]) -> str:
    return size if size in ("full", "small", "tiny") else "x".join(map(str, shape))


@dataclass(frozen=True)
class _Options:
    """The arguments of :func:`run`, as one record that its steps share."""

    path: str | Path | None
    level: int
    mode: str
    size: str
    device: str
    readers: Sequence[str]
    layouts: Sequence[str]
    repeat: int
    peer_repeat: int | None
    planes: int
    patterns: Sequence[str]
    cold: bool
    workdir: str | Path
    out: str | Path | None
    rewrite: bool
    seed: int
    write_threads: int | None
    progress: bool | str
    argv: Sequence[str] | None


@dataclass(frozen=True)
class _Plan:
    """What a run reads and on which device, settled before anything is written."""

    dev: str
    dev_why: str
    n_readers: int
    thr_readers: list[Any]  # throughput mode only
    pats: tuple[str, ...]  # browse mode only
    user: Any  # the user's volume, or None for the synthetic ones
    shape: tuple[int, ...]
    lays: list[Any]
    stem: str


def _plan(o: _Options) -> _Plan:
    """Check the options and settle device, readers and volumes; unknown names fail here."""
    import gpu_zarr.bench.browse as browse
    import gpu_zarr.bench.throughput as throughput
    import gpu_zarr.bench.volumes as volumes

    if o.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {o.mode!r}")
    if o.repeat < 1 or (o.peer_repeat is not None and o.peer_repeat < 1):
        raise ValueError("repeat and peer_repeat must be >= 1")
    dev, dev_why = _resolve_device(o.device)
    # the readers first: an unknown name fails before anything is written
    thr_readers: list[Any] = []
    pats: tuple[str, ...] = ()
    if o.mode == "throughput":
        thr_readers = throughput.default_readers(dev, list(o.readers))
        n_readers = len(thr_readers)
    else:
        n_readers = len(browse.default_plane_readers(dev, list(o.readers)))
        pats = tuple(o.patterns)
        for p in pats:
            if p not in browse.PATTERNS:
                raise ValueError(f"unknown browse pattern {p!r}; choose from {browse.PATTERNS}")

    user = volumes.user_volume(o.path, o.level) if o.path is not None else None
    if user is not None:
        if o.layouts:
            raise ValueError("layouts select synthetic volumes; they do not apply to a user store")
        shape = user.shape
        lays: list[Any] = []
        lvl = f"-level{o.level}" if user.meta.get("ome_level") is not None else ""
        stem = f"store-{Path(str(o.path)).name}{lvl}-{o.mode}-{dev}"
    else:
        table = volumes.THROUGHPUT_SHAPES if o.mode == "throughput" else volumes.BROWSE_SHAPES
        shape = volumes.parse_shape(o.size, table)
        lays = layouts_for(o.mode, shape, list(o.layouts))
        stem = f"{o.mode}-{_size_tag(o.size, shape)}-{dev}"
    return _Plan(dev, dev_why, n_readers, thr_readers, pats, user, shape, lays, stem)


def _new_record(o: _Options, p: _Plan) -> dict[str, Any]:
    """The run's record before any measurement: what is read, how, and where."""
    user, shape = p.user, p.shape
    result: dict[str, Any] = {
        "mode": o.mode,
        "complete": False,
        "started": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "argv": list(o.argv) if o.argv is not None else None,
        "device": p.dev,
        "device_reason": p.dev_why,
        "stem": p.stem,
        "size": o.size if user is None else None,
        "shape": list(shape),
        "dtype": user.dtype if user is not None else _dtypes(p.lays),
        "nbytes": user.nbytes if user is not None else int(2 * shape[0] * shape[1] * shape[2]),
        "repeat": o.repeat,
        "peer_repeat": o.peer_repeat if o.peer_repeat is not None else o.repeat,
        "workdir": str(o.workdir) if user is None else None,
        "store": str(o.path) if user is not None else None,
        "level": o.level if user is not None else None,
        "layouts": [],
    }
    if o.mode == "browse":
        result.update(planes=o.planes, seed=o.seed, browse_patterns=list(p.pats))
    return result


def _json_path(out: str | Path | None, result: dict[str, Any], stem: str) -> Path | None:
    """Where the partial JSON goes after each volume (None without ``out``); creates ``out``."""
    if out is None:
        return None
    _check_out(Path(out), result)
    Path(out).mkdir(parents=True, exist_ok=True)
    return Path(out) / f"{stem}.json"


def _progress_style(progress: bool | str) -> str:
    """``progress`` as one of ``bar``, ``lines`` or ``off``."""
    show = {True: "bar", False: "off"}.get(progress, progress) if isinstance(progress, bool) else progress
    if show not in ("bar", "lines", "off"):
        raise ValueError(f"progress must be True, False, 'bar', 'lines' or 'off', got {progress!r}")
    return show


def _record_environment(p: _Plan, result: dict[str, Any], log: Callable[[str], None]) -> None:
    """Log what is measured, and record the machine (and its GPU's name) in ``result``."""
    import gpu_zarr.bench.env as env

    what = f"store {p.user.path} {p.user.shape} {p.user.dtype}" if p.user else f"shape {p.shape} uint16"
    log(f"gpu-zarr bench: mode {result['mode']}, device {p.dev} ({p.dev_why}), {what}")
    result["environment"] = env.environment(p.dev)
    gpu = result["environment"].get("gpu", {})
    if isinstance(gpu, dict) and gpu.get("name"):
        result["device_name"] = gpu["name"]
    caps = result["environment"].get("capabilities", {})
    if caps.get("report"):
        log("capabilities:\n" + caps["report"])


def _volumes(o: _Options, p: _Plan, prog: Any, log: Callable[[str], None]) -> list[Any]:
    """The volumes to time: the user's, or the synthetic ones (written unless reusable)."""
    import gpu_zarr.bench.volumes as volumes

    if p.user is not None:
        vols = [p.user]
    else:
        wtask = prog.task("writing volumes (MiB)", 1)

        def wprogress(done: int, total: int) -> None:
            prog.update(wtask, done >> 20, total >> 20)

        vols = volumes.ensure_volumes(
            Path(o.workdir), o.mode, p.lays, (p.shape[0], p.shape[1], p.shape[2]), seed=o.seed,
            rewrite=o.rewrite, log=log, progress=wprogress, threads=o.write_threads,
        )
        prog.update(wtask, 1, 1)
    for v in vols:
        log(f"volume {v.name}: {v.to_json().get('codec')}, chunks {v.to_json().get('chunks')}, "
            f"ratio {v.ratio:.3f}, {'reused' if v.reused else 'written'}")
    return vols


_TimeOne = Callable[[Any], dict[str, Any]]


def _throughput_timer(o: _Options, p: _Plan, vols: list[Any], result: dict[str, Any],
                      log: Callable[[str], None], advance: Callable[[], None]) -> _TimeOne:
    """Throughput: record the targets and the cold-read setup (the disk's rate measured once
    when ``cold``); returns the timing of one volume."""
    import gpu_zarr.bench.env as env
    import gpu_zarr.bench.report as report
    import gpu_zarr.bench.throughput as throughput
    import gpu_zarr.bench.volumes as volumes

    cold_cache = env.ColdCache() if o.cold else None
    if p.dev == "gpu" and p.user is None and tuple(p.shape) == volumes.THROUGHPUT_SHAPES["full"]:
        result["targets"] = throughput.TARGETS  # they are for the 4 GiB volume
        result["extra_gpu_target_bytes"] = throughput.EXTRA_GPU_TARGET
    cold_reader = report.primary_ours(
        {"layouts": [{"readers": {r.name: {} for r in p.thr_readers if not r.skip_reason}}]}
    )
    result["cold"] = {"requested": bool(o.cold), "reader": cold_reader if o.cold else None}
    if cold_cache is not None:
        src = max(vols, key=lambda v: v.stored_bytes / max(1, len(env.store_files(v.path))))
        disk = cold_cache.measure_disk(src.path)
        result["cold"]["disk"] = disk
        log("disk rate: " + (f"{disk['gib_per_s']:.2f} GiB/s ({disk['drop']})"
                             if disk.get("gib_per_s") else f"not measured: {disk.get('error')}"))

    def time_one(v: Any) -> dict[str, Any]:
        return throughput.time_volume(
            v, throughput.default_readers(p.dev, list(o.readers)), p.dev,
            repeat=o.repeat, peer_repeat=o.peer_repeat, log=log,
            advance=advance, cold=cold_cache, cold_reader=cold_reader,
        )
    return time_one


def _browse_timer(o: _Options, p: _Plan, log: Callable[[str], None],
                  advance: Callable[[], None]) -> _TimeOne:
    """Browse: the timing of one volume."""
    import gpu_zarr.bench.browse as browse

    def time_one(v: Any) -> dict[str, Any]:
        return browse.time_planes(
            v, browse.default_plane_readers(p.dev, list(o.readers)), planes=o.planes, seed=o.seed,
            log=log, advance=advance, patterns=p.pats,
        )
    return time_one


def _measure(o: _Options, p: _Plan, result: dict[str, Any], json_path: Path | None) -> None:
    """Write or open the volumes and time every reader on each, into ``result["layouts"]``;
    a volume whose timing fails is recorded and the run goes on."""
    import gpu_zarr.bench.report as report
    from gpu_zarr.bench.progress import Progress

    show = _progress_style(o.progress)
    with Progress(enabled=show == "bar") as prog:
        log = prog.log if show != "off" else (lambda _msg: None)
        _record_environment(p, result, log)
        vols = _volumes(o, p, prog, log)
        ttask = prog.task("timing", len(vols) * p.n_readers, plain_lines=False)

        def advance() -> None:
            prog.advance(ttask)

        if o.mode == "throughput":
            time_one = _throughput_timer(o, p, vols, result, log, advance)
        else:
            time_one = _browse_timer(o, p, log, advance)
        for v in vols:
            log(f"{v.name} ({v.nbytes / 2**30:.2f} GiB, ratio {v.ratio:.2f}):")
            try:
                rec = time_one(v)
            except Exception as exc:  # the harness itself: record and go on
                rec = _harness_error(v, exc, log)
            result["layouts"].append(rec)
            if json_path is not None:
                report.write_json(result, json_path)


def run(
    path: str | Path | None = None,
    *,
    level: int = 0,
    mode: str = "throughput",
    size: str = "full",
    device: str = "auto",
    readers: Sequence[str] = (),
    layouts: Sequence[str] = (),
    repeat: int = 3,
    peer_repeat: int | None = None,
    planes: int = 39,
    patterns: Sequence[str] = ("random", "scroll"),
    cold: bool = False,
    workdir: str | Path = DEFAULT_WORKDIR,
    out: str | Path | None = None,
    rewrite: bool = False,
    seed: int = 0,
    write_threads: int | None = None,
    progress: bool | str = False,
    argv: Sequence[str] | None = None,
) -> BenchResult:
    """Time ours against the peers, on the user's store or on synthetic test volumes.

    Parameters
    ----------
    path : str or Path, optional
        The user's zarr array, or an OME-Zarr image (``level`` picks the array). It is
        only read: nothing is written into it. Without ``path`` the synthetic test
        volumes of ``mode`` are written to ``workdir`` (reused when present) and read.
    level : int
        OME-Zarr resolution level of ``path``.
    mode : {"throughput", "browse"}
        Whole-array reads onto the device (GiB/s), or plane browsing (ms per plane).
    size : str
        Synthetic volumes: ``full`` (4 GiB throughput / 2 GiB browse), ``small``,
        ``tiny`` or ``"Z,Y,X"``; chunks and shards scale with the shape.
    device : {"auto", "gpu", "cpu"}
        ``gpu``: cupy results and GPU peers; ``cpu``: numpy readers only.
    readers, layouts : sequence of str
        Subsets by name (all when empty); see ``gpu-zarr bench --list``.
    repeat, peer_repeat : int
        Timed warm reads of ours and of the peers (``peer_repeat`` defaults to
        ``repeat``); the median is reported.
    planes : int
        Browse: random planes, and the length of the scroll.
    patterns : sequence of str
        Browse: any of ``random``, ``scroll`` and ``tile`` (random 1024x1024 tiles of
        random planes, clipped to the plane).
    cold : bool
        Also one read of our primary reader per volume after dropping the page cache,
        and the disk's own rate measured once; reported against disk rate x ratio.
    workdir : str or Path
        Where the synthetic volumes live.
    out : str or Path, optional
        Write JSON, Markdown and PNG there (partial JSON after each volume).
    rewrite, seed, write_threads
        Synthetic volumes: rewrite even when reusable, data seed, writer threads.
    progress : bool or {"bar", "lines", "off"}
        ``"bar"`` (or True): a progress bar (rich, on a terminal) and log lines;
        ``"lines"``: log lines only; ``"off"`` (or False): quiet.

    Returns
    -------
    BenchResult
        Its ``data`` holds everything measured; it renders as tables and a chart in a
        notebook.
    """
    opts = _Options(**locals())  # every argument, as one record for the steps below
    plan = _plan(opts)
    t_start = time.perf_counter()
    result = _new_record(opts, plan)
    json_path = _json_path(out, result, plan.stem)
    _measure(opts, plan, result, json_path)
    result["complete"] = True
    result["elapsed_s"] = round(time.perf_counter() - t_start, 2)
    res = BenchResult(result)
    if out is not None:
        res.save(out, plan.stem)
    return res


def print_result(res: BenchResult) -> None:
    """Print the tables, where the files went and the elapsed time (what the command shows)."""
    import gpu_zarr.bench.report as report

    print()
    report.print_tables(res.markdown)
    if res.files:
        print("\n" + "\n".join(f"{k.upper()}: {p}" for k, p in res.files.items()))
        if "png" not in res.files:
            print(f"PNG: not written ({res.png_error})")
    print(f"elapsed {res.data['elapsed_s']:.1f} s"
          + ("  (some of our reads FAILED or were wrong: see above)" if res.failed else ""),
          file=sys.stdout, flush=True)
