"""``gpu-zarr bench --mode write``: our writer against zarr-python and TensorStore (and, for
pyramids, ome-zarr-py / ngff-zarr where installed), same data, same warm-up and repeats.

The volume is uint16 with image-like structure (a random walk along x plus noise, about
2x compressible with zstd level 3), ``--size-mib`` of it, chunks ``--chunks``. Every
writer writes it to ``--workdir`` (the page cache: no fsync, as the issue measures) once to
warm up, then ``--repeat`` times, each into a new folder (the removal of the last one is not
timed, for any writer); the median is reported in GiB/s of decoded data, with the
stored size. Layouts: ``sharded`` (v3, shards of ``--shard-mib``), ``plain`` (v3 chunks),
``pyramid`` (a 4-level OME-Zarr 0.5 from the in-memory volume) and ``convert``.

Memory: every writer's timed calls run inside :class:`gpu_zarr.memory.HostMemory` (the peak
growth of the process's resident memory above its value before the call, after the C heap's
free memory is given back) and, on a machine
with a GPU, :class:`gpu_zarr.memory.GpuMemory` (cupy's pool growth, the read bench's "peak
extra" measure; for ours on the GPU the warm-up also samples the device's free memory, which
sees nvCOMP's own buffers); the tables give the largest of the repeats, beyond the input (the
volume in host memory, or on the GPU for ``ours-gpu``).

Pyramid peers write what ours writes: 4 levels halved along y and x by a 2x2 mean
(ome-zarr-py ``local_mean``, ngff-zarr ``ITKWASM_BIN_SHRINK``), the same chunks, shards and zstd
level, OME-Zarr 0.5.

``convert`` (also ``gpu-zarr bench --mode convert``: this benchmark with ``--layouts convert``
and our writers against TensorStore): the volume is first written (untimed) as an OME-Zarr 0.4
store, zarr v2 with Blosc-LZ4 (shuffle, level 5), ``--convert-levels`` levels; then each writer
converts it into sharded OME-Zarr 0.5 with zstd ``--level``, the same chunks, shards and level
count: ours with :func:`gpu_zarr.write.convert.convert` (the pyramid computed again from level 0),
TensorStore by reading the v2 level 0 and writing each sharded v3 level (level ``k`` through its
``downsample`` driver, mean by ``2**k`` along y and x) plus the group's ``zarr.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["LAYOUTS", "WRITERS", "build_parser", "main", "run"]

LAYOUTS = ("sharded", "plain", "pyramid", "convert")
WRITERS = ("ours-gpu", "ours-cpu", "zarr", "tensorstore", "ome-zarr-py", "ngff-zarr")
GiB = 1 << 30


def _volume(size_mib: int, chunks: Sequence[int], seed: int) -> np.ndarray:
    y, x = chunks[-2], chunks[-1]
    planes = max(1, (size_mib << 20) // (y * x * 2))
    rng = np.random.default_rng(seed)
    walk = np.cumsum(rng.integers(-2, 3, (planes, y, x), dtype=np.int16), axis=2, dtype=np.int32)
    return ((walk % 4096) + rng.integers(0, 16, walk.shape)).astype(np.uint16)


def _shards(chunks: Sequence[int], shape: Sequence[int], shard_mib: int) -> tuple[int, ...]:
    from gpu_zarr.write.plan import auto_shards

    return auto_shards(shape, chunks, 2, shard_mib << 20)


def _writer(name: str, layout: str, data: np.ndarray, chunks: tuple[int, ...], shards: tuple[int, ...] | None,
            level: int) -> Callable[[Path], Any] | str:
    """A function writing ``data`` at a path, or the reason this writer cannot run here."""
    import importlib.util

    has = importlib.util.find_spec
    if name.startswith("ours"):
        enc = name.removeprefix("ours-")
        if enc == "gpu":
            from gpu_zarr.capabilities import probe

            if not (probe().gpu and probe().nvcomp):
                return "no usable GPU with nvCOMP"
            import cupy

            src: Any = cupy.asarray(data)
        else:
            src = data
        if layout == "pyramid":
            from gpu_zarr.write.omezarr import write_ome_zarr

            return lambda p: write_ome_zarr(src, p, axes="zyx", levels=4, chunks=chunks, shards=shards, level=level,
                                            encoder=enc, overwrite=True)
        from gpu_zarr.write.api import write_zarr

        return lambda p: write_zarr(src, p, chunks=chunks, shards=shards if layout == "sharded" else False,
                                    level=level, encoder=enc, overwrite=True)
    if name == "zarr" and layout != "pyramid":
        import zarr
        from zarr.codecs import ZstdCodec

        def zarr_write(p: Path) -> None:
            z = zarr.create_array(str(p), shape=data.shape, dtype=data.dtype, chunks=chunks,
                                  shards=shards if layout == "sharded" else None,
                                  compressors=ZstdCodec(level=level), fill_value=0, overwrite=True)
            z[...] = data
        return zarr_write
    if name == "tensorstore" and layout != "pyramid":
        if not has("tensorstore"):
            return "tensorstore is not installed"
        import tensorstore as ts

        inner = [{"name": "bytes", "configuration": {"endian": "little"}},
                 {"name": "zstd", "configuration": {"level": level}}]
        codecs = inner if layout == "plain" else [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": list(chunks), "codecs": inner, "index_codecs": [
                {"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}]
        grid = list(chunks if layout == "plain" else shards or chunks)

        def ts_write(p: Path) -> None:
            t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(p)},
                         "metadata": {"shape": list(data.shape), "data_type": "uint16", "codecs": codecs,
                                      "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": grid}}}},
                        create=True, delete_existing=True).result()
            t.write(data).result()
        return ts_write
    if name in ("ome-zarr-py", "ngff-zarr") and layout == "pyramid":
        return _pyramid_peer(name, data, chunks, shards, level)
    return f"{name} does not write the {layout} layout"


def _pyramid_peer(name: str, data: np.ndarray, chunks: tuple[int, ...], shards: tuple[int, ...] | None,
                  level: int) -> Callable[[Path], Any] | str:
    """ome-zarr-py's or ngff-zarr's 4-level pyramid written as ours is (y/x 2x2 mean, the same
    chunks, shards and zstd level), or the reason it cannot run here."""
    import importlib.util

    has = importlib.util.find_spec
    if name == "ome-zarr-py":
        if not has("ome_zarr"):
            return "ome-zarr-py is not installed"
        import zarr
        from ome_zarr.scale import Methods
        from ome_zarr.writer import write_image
        from zarr.codecs import ZstdCodec

        opts = []
        for k in range(4):  # each level's chunks and shards as ours (level_geometry), zstd at our level
            ch, sh = _level_geometry(data.shape, k, chunks, shards)
            opts.append({"chunks": ch, "shards": sh, "compressors": [ZstdCodec(level=level)]})

        def omezarr_write(p: Path) -> None:
            shutil.rmtree(p, ignore_errors=True)
            write_image(data, zarr.open_group(str(p), mode="w"), axes="zyx", scale_factors=[2, 4, 8],
                        method=Methods.LOCAL_MEAN, storage_options=opts)
        return omezarr_write
    if name == "ngff-zarr":
        if not has("ngff_zarr"):
            return "ngff-zarr is not installed"
        import ngff_zarr as nz

        per_shard = tuple(s // c for s, c in zip(shards, chunks, strict=True)) if shards else None
        zstd = [{"name": "zstd", "configuration": {"level": level, "checksum": False}}]
        halved_yx = [{"z": 1, "y": f, "x": f} for f in (2, 4, 8)]  # as ours (its integer factors halve z too)

        def ngff_write(p: Path) -> None:
            shutil.rmtree(p, ignore_errors=True)
            ms = nz.to_multiscales(nz.to_ngff_image(data, dims=["z", "y", "x"]), scale_factors=halved_yx,
                                   chunks=chunks, method=nz.Methods.ITKWASM_BIN_SHRINK)
            nz.to_ngff_zarr(str(p), ms, version="0.5", chunks_per_shard=per_shard, compressors=zstd)
        return ngff_write
    return f"{name} does not write the pyramid layout"


def _convert_source(root: Path, data: np.ndarray, chunks: tuple[int, ...], levels: int) -> Path:
    """The OME-Zarr 0.4 (zarr v2, Blosc-LZ4) store every ``convert`` writer reads (written once, untimed)."""
    from gpu_zarr.write.omezarr import write_ome_zarr

    src = root / "convert-source-v04.ome.zarr"
    write_ome_zarr(data, src, axes="zyx", levels=levels, chunks=chunks, codec="blosc-lz4", ome_version="0.4",
                   encoder="cpu", overwrite=True)
    return src


def _convert_writer(name: str, src: Path, chunks: tuple[int, ...], shards: tuple[int, ...] | None,
                    level: int) -> Callable[[Path], Any] | str:
    """A function converting ``src`` into sharded OME-Zarr 0.5 at a path, or why it cannot run here."""
    import importlib.util

    if name.startswith("ours"):
        enc = name.removeprefix("ours-")
        if enc == "gpu":
            from gpu_zarr.capabilities import probe

            if not (probe().gpu and probe().nvcomp):
                return "no usable GPU with nvCOMP"
        from gpu_zarr.write.convert import convert

        return lambda p: convert(src, p, chunks=chunks, shards=shards, level=level, encoder=enc, overwrite=True)
    if name != "tensorstore":
        return f"{name} does not write the convert layout"
    if not importlib.util.find_spec("tensorstore"):
        return "tensorstore is not installed"
    import tensorstore as ts

    from gpu_zarr.write.omezarr import level_geometry

    attrs = json.loads((src / ".zattrs").read_text())
    multiscales = [{k: v for k, v in m.items() if k != "version"} for m in attrs["multiscales"]]
    n_levels = len(multiscales[0]["datasets"])
    inner = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": level}}]

    def ts_convert(p: Path) -> None:
        shutil.rmtree(p, ignore_errors=True)
        base = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(src / "0")}}, read=True).result()
        for k in range(n_levels):
            lv = base if k == 0 else ts.downsample(base, [1] + [2 ** k] * (base.rank - 1), "mean")
            ch, sh = level_geometry(lv.shape, chunks, shards)
            codecs = [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": list(ch), "codecs": inner, "index_codecs": [
                    {"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}]
            out = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(p / str(k))},
                           "metadata": {"shape": list(lv.shape), "data_type": "uint16", "codecs": codecs,
                                        "dimension_names": ["z", "y", "x"],
                                        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(sh)}}}},
                          create=True, delete_existing=True).result()
            out.write(lv).result()
        (p / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {
            "ome": {"version": "0.5", "multiscales": multiscales}}}))
    return ts_convert


def _level_geometry(shape: Sequence[int], k: int, chunks: tuple[int, ...],
                    shards: tuple[int, ...] | None) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """Level ``k``'s chunks and shards as our pyramid writes them (y and x halved ``k`` times)."""
    from gpu_zarr.write.omezarr import level_geometry

    lv = tuple(s if ax == 0 else -(-s // 2**k) for ax, s in enumerate(shape))
    return level_geometry(lv, chunks, shards)


def _read_back(path: Path, data: np.ndarray, planes: int = 8) -> str | None:
    """The first and last planes of what a writer stored, and some between (seeded), read back by
    zarr-python and compared with ``data``; a pyramid or converted store is checked at its first
    multiscales dataset. None when equal, else what differs: a writer's figures count only when
    what it wrote is the data."""
    import zarr

    node: Any = zarr.open(str(path), mode="r")
    if not isinstance(node, zarr.Array):
        attrs: dict[str, Any] = dict(node.attrs)
        ms: Any = (attrs.get("ome") or attrs).get("multiscales") or [{}]
        node = node[ms[0].get("datasets", [{"path": "0"}])[0]["path"]]
    if tuple(node.shape) != data.shape:
        return f"read back: shape {tuple(node.shape)}, the data's is {data.shape}"
    rng = np.random.default_rng(0)
    for z in sorted({0, data.shape[0] - 1, *rng.integers(0, data.shape[0], planes - 2).tolist()}):
        plane = np.asarray(node[z])
        if not np.array_equal(plane, data[z]):
            bad = int(np.count_nonzero(plane != data[z]))
            return f"read back by zarr: plane {z} differs from the data in {bad} of {plane.size} values"
    return None


def _stored(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def _gpu_memory_usable() -> bool:
    import importlib.util

    if not importlib.util.find_spec("cupy"):
        return False
    from gpu_zarr.capabilities import probe

    return bool(probe().gpu)


def _measured(fn: Callable[[Path], Any], path: Path, gpu: bool, sample: bool = False) -> tuple[float, dict[str, Any]]:
    """Seconds of ``fn(path)`` and the memory it took (host; the GPU's pool, and sampled, where asked);
    ``stages`` too where ``fn`` returns a write result (ours: seconds per stage, summed over lanes)."""
    from gpu_zarr.memory import GpuMemory, HostMemory

    dev = GpuMemory(sample=sample) if gpu else None
    host = HostMemory(trim=True)  # one process measures every writer: earlier writers' freed heap given back
    if dev is not None:
        dev.__enter__()
    with host:
        t0 = time.perf_counter()
        result = fn(path)
        sec = time.perf_counter() - t0
    if dev is not None:
        dev.__exit__(None, None, None)
    mem: dict[str, Any] = {"host_peak_bytes": host.peak_bytes, "host_memory": host.method}
    stages = getattr(result, "stages", None)
    if isinstance(stages, dict):
        mem["stages"] = {k: float(v) for k, v in stages.items()}
    if dev is not None:
        mem["device_peak_bytes"] = dev.result.get("pool_peak_bytes")
        if "device_peak_bytes_sampled" in dev.result:
            mem["device_peak_bytes_sampled"] = dev.result["device_peak_bytes_sampled"]
    return sec, mem


def _peak(values: list[Any]) -> int | None:
    known = [int(v) for v in values if v is not None]
    return max(known) if known else None


def run(*, size_mib: int = 2048, chunks: Sequence[int] = (1, 512, 1024), shard_mib: int = 64, level: int = 3,
        layouts: Sequence[str] = LAYOUTS, writers: Sequence[str] = WRITERS, repeat: int = 3,
        peer_repeat: int | None = None, workdir: str | None = None, seed: int = 0, convert_levels: int = 4,
        log: Callable[[str], None] = print,
        on_layout: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the write benchmark; returns the records (also what ``--out`` saves as JSON).

    ``peer_repeat``: timed writes of each peer (default ``repeat``); ``on_layout(records)`` is
    called after each layout (``--out`` saves what is done so far: a run cut short keeps it).
    """
    chunks = tuple(int(c) for c in chunks)
    data = _volume(size_mib, chunks, seed)
    shards = _shards(chunks, data.shape, shard_mib)
    root = Path(workdir or tempfile.mkdtemp(prefix="gpu-zarr-bench-write-"))
    root.mkdir(parents=True, exist_ok=True)
    gpu_mem = _gpu_memory_usable()
    out: dict[str, Any] = {"shape": list(data.shape), "dtype": "uint16", "chunks": list(chunks), "shards": list(shards),
                           "nbytes": int(data.nbytes), "level": level, "repeat": repeat,
                           "peer_repeat": repeat if peer_repeat is None else peer_repeat, "layouts": {}}
    src = _convert_source(root, data, chunks, convert_levels) if "convert" in layouts else None
    if src is not None:
        out["convert_levels"] = convert_levels
    for layout in layouts:
        recs: dict[str, Any] = {}
        out["layouts"][layout] = recs
        for name in writers:
            fn = (_convert_writer(name, src, chunks, shards, level) if layout == "convert" and src is not None
                  else _writer(name, layout, data, chunks, shards, level))
            if isinstance(fn, str):
                recs[name] = {"skipped": fn}
                continue
            path = root / f"{layout}-{name}.zarr"
            n_timed = repeat if name.startswith("ours") or peer_repeat is None else peer_repeat
            try:
                # warm-up (and the store whose size is reported); ours on the GPU: device memory sampled too
                warm_s, warm = _measured(fn, path, gpu_mem, sample=gpu_mem and name == "ours-gpu")
                times, mems = [], [warm]
                for k in range(n_timed):  # each timed write into a new folder: removing the last is not timed
                    fresh = root / f"{layout}-{name}-{k}.zarr"
                    sec, mem = _measured(fn, fresh, gpu_mem)
                    times.append(sec)
                    mems.append(mem)
                    shutil.rmtree(fresh, ignore_errors=True)
            except Exception as exc:  # noqa: BLE001 - a peer's failure is recorded, not fatal
                recs[name] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            differs = _read_back(path, data)
            if differs:
                recs[name] = {"error": differs}
                log(f"{layout:8s} {name:12s} {differs}")
                continue
            sec = statistics.median(times) if times else warm_s
            timed = mems[1:] or mems  # peaks of the timed writes (the warm-up's when none was timed)
            rec = {"seconds": sec, "gib_per_s": data.nbytes / sec / GiB, "stored_bytes": _stored(path),
                   "ratio": data.nbytes / max(1, _stored(path)), "times": times,
                   "host_peak_bytes": _peak([m["host_peak_bytes"] for m in timed]),
                   "host_memory": timed[-1]["host_memory"]}
            if "stages" in timed[-1]:  # those of the timed write nearest the median: what bounds it
                near = min(range(len(timed)), key=lambda i: abs((times or [warm_s])[i] - sec))
                rec["stages"] = timed[near]["stages"]
            if gpu_mem:
                rec["device_peak_bytes"] = _peak([m.get("device_peak_bytes") for m in timed])
                if warm.get("device_peak_bytes_sampled") is not None:
                    rec["device_peak_bytes_sampled"] = warm["device_peak_bytes_sampled"]
            recs[name] = rec
            log(f"{layout:8s} {name:12s} {rec['gib_per_s']:7.2f} GiB/s  ratio {rec['ratio']:.3f}  "
                f"peak extra {_mem_text(rec)}")
            shutil.rmtree(path, ignore_errors=True)
        if on_layout is not None:
            on_layout(out)
    if src is not None:
        shutil.rmtree(src, ignore_errors=True)
    if workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    return out


def _mem_text(rec: dict[str, Any]) -> str:
    """"host MiB / GPU MiB" of a record (the GPU's: the larger of the pool's and the sampled)."""
    host = rec.get("host_peak_bytes")
    text = f"{host / 2**20:.0f}" if host is not None else "?"
    if "device_peak_bytes" in rec:
        dev = _peak([rec.get("device_peak_bytes"), rec.get("device_peak_bytes_sampled")])
        text += f" / {dev / 2**20:.0f}" if dev is not None else " / ?"
    return text


def _stages_text(stages: dict[str, float], wall: float) -> str:
    """"encode 1.21, write 0.80, copy 0.05 of 1.92 s": the three longest stages and the wall time."""
    top = sorted(((v, k) for k, v in stages.items() if v >= 0.0005), reverse=True)[:3]
    return ", ".join(f"{k} {v:.2f}" for v, k in top) + f" of {wall:.2f} s"


def markdown(res: dict[str, Any]) -> str:
    """The results as a Markdown table (GiB/s; ours against the fastest peer per layout; peak extra memory)."""
    gpu = any("device_peak_bytes" in r for recs in res["layouts"].values() for r in recs.values())
    lines = [f"write {res['nbytes'] / GiB:.2f} GiB uint16 {tuple(res['shape'])}, chunks {tuple(res['chunks'])}, "
             f"shards {tuple(res['shards'])}, zstd level {res['level']}, median of {res['repeat']}"
             + (f"; convert: OME-Zarr 0.4 (v2, Blosc-LZ4) of {res['convert_levels']} levels into sharded 0.5"
                if "convert_levels" in res else ""), "",
             "| layout | writer | GiB/s | ratio | peak extra MiB, host" + (" / GPU" if gpu else "") + " | note |",
             "|---|---|---|---|---|---|"]
    for layout, recs in res["layouts"].items():
        peers = [r["gib_per_s"] for n, r in recs.items() if not n.startswith("ours") and "gib_per_s" in r]
        for name, r in recs.items():
            if "gib_per_s" in r:
                note = f"{r['gib_per_s'] / max(peers):.2f}x the fastest peer" if name.startswith("ours") and peers else ""
                if r.get("stages"):
                    note += ("; " if note else "") + "stages " + _stages_text(r["stages"], r["seconds"])
                lines.append(f"| {layout} | {name} | {r['gib_per_s']:.2f} | {r['ratio']:.3f} | {_mem_text(r)} | {note} |")
            else:
                lines.append(f"| {layout} | {name} | - | - | - | {r.get('skipped') or r.get('error')} |")
    lines += ["", "Stages: ours' seconds per stage of the timed write nearest the median, summed over its lanes "
              "(lanes overlap: a sum can pass the wall time), the longest first.",
              "", "Peak extra memory: the largest growth over a writer's timed calls, host: resident memory "
              "(gpu_zarr.memory.HostMemory)" + ("; GPU: the larger of cupy's pool growth and, for ours-gpu's "
                                               "warm-up, the sampled drop in free device memory" if gpu else "") + "."]
    return "\n".join(lines)


def _save(res: dict[str, Any], out: str) -> None:
    """The records as JSON at ``out`` and their table beside it (.md); ``out``'s folder is made
    when missing (the first save comes after a layout's writes: a missing folder lost them)."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(res, indent=1))
    Path(out).with_suffix(".md").write_text(markdown(res) + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-zarr bench --mode write", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mib", type=int, default=2048, help="volume size (default 2048: the issue's 2 GiB)")
    p.add_argument("--chunks", default="1,512,1024", help="chunk shape z,y,x")
    p.add_argument("--shard-mib", type=int, default=64, help="shard size of the sharded layouts")
    p.add_argument("--level", type=int, default=3, help="zstd level")
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--writers", default=",".join(WRITERS))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--peer-repeat", type=int, default=None, help="timed writes of each peer (default: --repeat; "
                   "0: the warm-up's time)")
    p.add_argument("--workdir", default=None, help="where the stores are written (default: a temporary folder)")
    p.add_argument("--out", default=None, help="write the records as JSON (and .md beside it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--convert-levels", type=int, default=4, help="pyramid levels of the convert layout's source "
                   "(and of what is written)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``gpu-zarr bench --mode write [options]``; returns 1 when one of our writers failed."""
    args = build_parser().parse_args([a for a in (sys.argv[1:] if argv is None else argv)])
    res = run(size_mib=args.size_mib, chunks=[int(v) for v in args.chunks.split(",")], shard_mib=args.shard_mib,
              level=args.level, layouts=[v for v in args.layouts.split(",") if v],
              writers=[v for v in args.writers.split(",") if v], repeat=args.repeat, peer_repeat=args.peer_repeat,
              workdir=args.workdir, seed=args.seed, convert_levels=args.convert_levels,
              on_layout=(lambda r: _save(r, args.out)) if args.out else None)
    md = markdown(res)
    print(md)
    if args.out:
        _save(res, args.out)
    return 1 if any("error" in r for recs in res["layouts"].values() for n, r in recs.items() if n.startswith("ours")) else 0
