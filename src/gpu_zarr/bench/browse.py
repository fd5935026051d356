"""Plane browsing: ms per 2-D plane (or tile) of a volume, p50 / p95, per access pattern.

Three patterns, the same index lists for every reader (seeded):

``random``
    planes at random positions (what jumping around a stack does);
``scroll``
    consecutive planes forward from a random start, then back again (what dragging
    napari's slider does). The first scroll plane is timed apart (``first_ms``): the
    p50/p95 are those of the planes after it, shown while scrolling;
``tile``
    a 1024 x 1024 tile (clipped to the plane when the plane is smaller) at a random
    position of a random plane (what a zoomed-in viewer asks for).

For each volume and reader: one untimed warm-up plane, then each pattern's reads, each
timed from the call to host numpy in hand. Every read is compared with zarr's CPU read
of it. A "plane" is the last two axes; the leading axes are indexed (flattened in C
order for arrays of more than three dimensions).

A read is named by a key: the leading indices, and for a tile ``(start, stop)`` of each
of the last two axes (JSON: ``[z, [y0, y1], [x0, x1]]``); :func:`index_of` makes the
index a reader takes. For our readers the engine's per-stage timings are summarised per
pattern (``stages_ms``: the median of each stage over the reads, and ``bound_by``: the
longest stage), so a reader of the figures sees which stage bounds each one.
"""

from __future__ import annotations

import gc
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import gpu_zarr.bench.env as env
from gpu_zarr.bench.readers import (
    PlaneReader,
    browse_readers,
    fingerprint,
    record_failure,
    select_readers,
    to_host,
)
from gpu_zarr.bench.volumes import VolumeInfo

__all__ = ["PATTERNS", "TILE", "Key", "index_of", "tile_shape", "plane_patterns", "time_planes",
           "stage_summary", "default_plane_readers"]

PATTERNS = ("random", "scroll", "tile")
#: edge of a ``tile`` read (clipped to the plane)
TILE = 1024

#: a read: leading indices, then for a tile ``(start, stop)`` of each of the last two axes
Key = tuple[Any, ...]


def index_of(key: Key) -> tuple[int | slice, ...]:
    """The index a reader takes for ``key`` (ints, and slices for a tile's last two axes)."""
    return tuple(slice(int(k[0]), int(k[1])) if isinstance(k, (tuple, list)) else int(k) for k in key)


def tile_shape(shape: tuple[int, ...], tile: int = TILE) -> tuple[int, int]:
    """The (height, width) of a ``tile`` read of an array of ``shape``."""
    return min(tile, int(shape[-2])), min(tile, int(shape[-1]))


def plane_patterns(
    shape: tuple[int, ...], n: int, seed: int, patterns: tuple[str, ...] = ("random", "scroll"),
    tile: int = TILE,
) -> tuple[tuple[int, ...], dict[str, list[Key]]]:
    """(warm-up plane, {pattern: read keys}), seeded.

    ``random`` has ``n`` planes; ``scroll`` goes forward over ``min(n, planes)``
    consecutive planes from a random start, then back to the start; ``tile`` has ``n``
    tiles of :func:`tile_shape` at random positions of random planes.
    """
    lead = tuple(shape[:-2]) or (1,)
    total = math.prod(lead)
    rng = np.random.default_rng(seed)

    def idx(k: int) -> tuple[int, ...]:
        return tuple(int(i) for i in np.unravel_index(int(k), lead)) if shape[:-2] else ()

    warm = idx(int(rng.integers(0, total)))
    out: dict[str, list[Key]] = {}
    for pattern in patterns:
        if pattern == "random":
            out["random"] = [idx(k) for k in rng.integers(0, total, size=n)]
        elif pattern == "scroll":
            m = max(1, min(n, total))
            start = int(rng.integers(0, total - m + 1))
            fwd = list(range(start, start + m))
            out["scroll"] = [idx(k) for k in fwd + fwd[-2::-1]]
        elif pattern == "tile":
            h, w = tile_shape(shape, tile)
            ys = rng.integers(0, int(shape[-2]) - h + 1, size=n)
            xs = rng.integers(0, int(shape[-1]) - w + 1, size=n)
            out["tile"] = [(*idx(k), (int(y), int(y) + h), (int(x), int(x) + w))
                           for k, y, x in zip(rng.integers(0, total, size=n), ys, xs, strict=True)]
        else:
            raise ValueError(f"unknown browse pattern {pattern!r}; choose from {PATTERNS}")
    return warm, out


def _summary(times: list[float], plane_bytes: int, pattern: str,
             stages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    first = None
    if pattern == "scroll" and len(times) > 1:
        first, times = times[0], times[1:]
    ms = np.asarray(times)
    rec: dict[str, Any] = {
        "ms": [round(t, 4) for t in times],
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
        "mean_ms": float(ms.mean()),
    }
    if first is not None:
        rec["first_ms"] = round(first, 4)
    rec["planes_per_s"] = 1e3 / rec["mean_ms"] if rec["mean_ms"] > 0 else None
    rec["gib_per_s_p50"] = plane_bytes / (rec["p50_ms"] / 1e3) / 2**30 if rec["p50_ms"] > 0 else None
    if stages:
        rec.update(stage_summary(stages[1:] if first is not None and len(stages) > 1 else stages))
    return rec


#: engine stats that are not stage times (``total_s`` is the whole read)
_NOT_STAGES = ("total_s",)


def stage_summary(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-stage timings of the engine reads ``stats`` (their ``*_s`` entries), summarised.

    Returns ``stages_ms`` (the median ms of each stage over the reads; a stage a read did
    not run counts 0), ``engine_total_ms`` (median of ``total_s``), ``bound_by`` (the
    stage with the largest median; on the pipelined GPU path stages overlap, so it names
    the longest, not a share of the total), ``engine_reads`` and the median
    ``cache_hits`` when the chunk cache served chunks.

    On the sequential (fused, CPU) executor the engine's total less its named stages is
    reported as the stage ``untimed``: the work the engine does not time by name (placing
    chunks from the chunk cache, finishing the output, putting chunks into the cache).
    """
    if not stats:
        return {}
    keys = sorted({k for st in stats for k, v in st.items()
                   if k.endswith("_s") and k not in _NOT_STAGES and isinstance(v, (int, float))})
    stages = {k[:-2]: float(np.median([float(st.get(k) or 0.0) for st in stats])) * 1e3 for k in keys}
    rest = [_untimed(st) for st in stats]
    if rest and all(r is not None for r in rest):
        stages["untimed"] = float(np.median([r for r in rest if r is not None])) * 1e3
    out: dict[str, Any] = {"engine_reads": len(stats), "stages_ms": {k: round(v, 4) for k, v in stages.items()}}
    totals = [float(st["total_s"]) for st in stats if isinstance(st.get("total_s"), (int, float))]
    if totals:
        out["engine_total_ms"] = round(float(np.median(totals)) * 1e3, 4)
    if stages:
        out["bound_by"] = max(stages, key=lambda k: stages[k])
    hits = [st["cache_hits"] for st in stats if isinstance(st.get("cache_hits"), int)]
    if any(hits):
        out["cache_hits_median"] = float(np.median(hits))
    return out


def _untimed(st: dict[str, Any]) -> float | None:
    """Seconds of a sequential engine read outside its named stages; None for a pipelined
    read (its stages overlap: ``setup_s``, ``wait_read_s``...) or without ``total_s``."""
    total = st.get("total_s")
    if not isinstance(total, (int, float)) or "setup_s" in st or "wait_read_s" in st:
        return None
    named = sum(float(v) for k, v in st.items() if k.endswith("_s") and k not in _NOT_STAGES
                and isinstance(v, (int, float)))
    return max(0.0, float(total) - named)


def _engine_stats() -> dict[str, Any] | None:
    """This thread's most recent engine read's stats (the deprecated accessor: the lazy
    array, like napari, keeps only the data), or None."""
    try:
        import warnings

        from gpu_zarr.engine import last_read_stats

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return last_read_stats()
    except Exception:
        return None


def _key(idx: Key) -> str:
    return ",".join(f"{k[0]}:{k[1]}" if isinstance(k, (tuple, list)) else str(k) for k in idx)


@dataclass(frozen=True)
class _Seen:
    """What the check keeps of one read (not the array: a viewer holds one plane at a time,
    and a bench that held every result would make each reader's allocator fetch fresh memory
    for every read -- page faults the reader does not cost a viewer)."""

    digest: bytes  # of the values in native byte order, their shape and dtype
    fingerprint: list[int]  # what a reader in another process hands back (czarr)


def _seen(a: Any) -> _Seen:
    h = np.asarray(to_host(a))
    h = np.ascontiguousarray(h, dtype=h.dtype.newbyteorder("="))
    d = hashlib.blake2b(h.tobytes(), digest_size=16)
    d.update(repr((h.shape, h.dtype.str)).encode())
    return _Seen(d.digest(), fingerprint(h))


class _PlaneSet:
    """What every reader of one volume reads (the warm-up plane, each pattern's keys and
    bytes per read), and zarr's CPU read of those keys, which every reader's result is
    compared with: read when first needed, unless the zarr-cpu reader's own comes first."""

    def __init__(self, vol: VolumeInfo, planes: int, seed: int, patterns: tuple[str, ...], tile: int) -> None:
        self.path = str(vol.path)
        self.warm, self.pats = plane_patterns(vol.shape, planes, seed, patterns, tile)
        itemsize = np.dtype(vol.dtype).itemsize
        self.read_bytes = {
            p: (math.prod(tile_shape(vol.shape, tile)) if p == "tile" else math.prod(vol.shape[-2:])) * itemsize
            for p in self.pats}
        self.every = sorted({i for idxs in self.pats.values() for i in idxs}, key=_key)
        self.ref: dict[Key, _Seen] | None = None

    def reference(self) -> dict[Key, _Seen]:
        if self.ref is None:
            self.ref = _reference(self.path, self.every)
        return self.ref

    def check(self, got: dict[Key, _Seen], reader: PlaneReader, rec: dict[str, Any]) -> None:
        """Record in ``rec`` whether the planes ``got`` equal the reference."""
        if self.ref is None and reader.name == "zarr-cpu":
            self.ref = got
            rec["correct"] = True
            rec["correct_detail"] = "is the reference"
        else:
            bad = [i for i in self.every if got[i].digest != self.reference()[i].digest]
            _verdict(rec, bad, len(self.every), "values")


def _time_external(reader: PlaneReader, ps: _PlaneSet, rec: dict[str, Any], log: Callable[[str], None]) -> bool:
    """A reader in its own process, which times itself and hands back fingerprints; False
    (the failure recorded and logged) when it failed."""
    res = reader.run_all(ps.path, ps.warm, ps.pats)  # type: ignore[attr-defined]
    if "error" in res:
        rec["error"] = res["error"]
        if "traceback" in res:
            rec["traceback"] = res["traceback"]
        log(f"  {reader.name:<18} FAILED: {rec['error'][:300]}")
        return False
    bad = []
    for pattern, idxs in ps.pats.items():
        child = res["patterns"][pattern]
        rec["patterns"][pattern] = _summary(child["ms"], ps.read_bytes[pattern], pattern)
        bad += [i for i, fp in zip(idxs, child["fingerprints"], strict=True)
                if [int(x) for x in fp] != ps.reference()[i].fingerprint]
    _verdict(rec, bad, len(ps.every), "fingerprint")
    return True


def _time_in_process(reader: PlaneReader, ps: _PlaneSet, rec: dict[str, Any]) -> None:
    """A reader in this process: opened, one untimed first-call plane, then each pattern's
    reads timed (with the engine's stage times for ours) and checked."""
    reader.open(ps.path)
    rec.update(reader.info)
    reader.plane(ps.warm)  # untimed: first-call set-up
    got: dict[Key, _Seen] = {}
    ours = reader.kind == "ours"
    for pattern, idxs in ps.pats.items():
        times: list[float] = []
        stages: list[dict[str, Any]] = []
        for i in idxs:
            before = _engine_stats() if ours else None
            index = index_of(i)
            t0 = time.perf_counter()
            p = reader.plane(index)
            times.append((time.perf_counter() - t0) * 1e3)
            if ours:
                st = _engine_stats()
                if st is not None and st != before:  # else this read did not use the engine
                    stages.append(st)
            if i not in got:
                got[i] = _seen(p)
            del p  # as a viewer drops the plane it showed before
        rec["patterns"][pattern] = _summary(times, ps.read_bytes[pattern], pattern, stages)
    ps.check(got, reader, rec)


def _log_reader(reader: PlaneReader, rec: dict[str, Any], first_pattern: str, log: Callable[[str], None]) -> None:
    """The first pattern's p50 and p95 into ``rec``; every pattern's in the log line."""
    first = rec["patterns"].get(first_pattern, {})
    rec["p50_ms"], rec["p95_ms"] = first.get("p50_ms"), first.get("p95_ms")
    extra = f", whole-volume load {rec['load_s']:.2f} s" if "load_s" in rec else ""
    tag = "" if rec["correct"] else "  MISMATCH"
    txt = "  ".join(
        f"{p} p50 {r['p50_ms']:7.2f} p95 {r['p95_ms']:7.2f} ms" for p, r in rec["patterns"].items()
    )
    log(f"  {reader.name:<18} {txt}{extra}{tag}")


def time_planes(
    vol: VolumeInfo,
    readers: list[PlaneReader],
    *,
    planes: int,
    seed: int,
    log: Callable[[str], None],
    advance: Callable[[], None],
    patterns: tuple[str, ...] = ("random", "scroll"),
    tile: int = TILE,
) -> dict[str, Any]:
    """Time every plane reader on one volume; returns the JSON record of the volume.

    ``tile`` is the edge of a ``tile`` read (clipped to the plane).
    """
    if len(vol.shape) < 2:
        raise ValueError(f"{vol.path}: browsing needs an array of at least 2 dimensions, got {vol.shape}")
    env.warm_files(vol.path)
    ps = _PlaneSet(vol, planes, seed, patterns, tile)
    record: dict[str, Any] = {
        **vol.to_json(),
        "patterns": {p: [_jsonable(i) for i in idxs] for p, idxs in ps.pats.items()},
        "warmup_plane": list(ps.warm),
        "readers": {},
    }
    if "tile" in ps.pats:
        record["tile_shape"] = list(tile_shape(vol.shape, tile))
    for reader in readers:
        rec: dict[str, Any] = {"kind": reader.kind, "description": reader.description, "patterns": {}}
        record["readers"][reader.name] = rec
        if reader.skip_reason:
            rec["skipped"] = reader.skip_reason
            log(f"  {reader.name:<18} skipped: {reader.skip_reason}")
            advance()
            continue
        try:
            if getattr(reader, "external", False):
                if not _time_external(reader, ps, rec, log):
                    continue
            else:
                _time_in_process(reader, ps, rec)
            _log_reader(reader, rec, patterns[0], log)
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            record_failure(rec, exc, log, f"{reader.name:<18}")
        finally:
            try:
                reader.close()
            except Exception:
                pass
            gc.collect()
            _free_gpu()
            advance()
    return record


def _verdict(rec: dict[str, Any], bad: list[tuple[int, ...]], n: int, how: str) -> None:
    rec["correct"] = not bad
    rec["correct_detail"] = (
        f"all {n} planes equal zarr-cpu ({how})"
        if not bad
        else f"{len(bad)} plane reads differ from zarr-cpu ({how}), e.g. {_key(bad[0])}"
    )


def _reference(path: str, idxs: list[Key]) -> dict[Key, _Seen]:
    import zarr

    with zarr.config.set({"codecs.zstd": "zarr.codecs.zstd.ZstdCodec"}):
        arr = zarr.open_array(path, mode="r")
        return {i: _seen(arr[index_of(i)]) for i in set(idxs)}


def _jsonable(key: Key) -> list[Any]:
    return [list(k) if isinstance(k, tuple) else k for k in key]


def _free_gpu() -> None:
    import sys

    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            cupy.get_default_memory_pool().free_all_blocks()
        except Exception:
            pass


def default_plane_readers(device: str, only: list[str] | None) -> list[PlaneReader]:
    return select_readers(browse_readers(device), device, only)
