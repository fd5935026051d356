"""Plane browsing: ms per 2-D plane of a volume, p50 / p95, per access pattern.

Two patterns, the same index lists for every reader (seeded):

``random``
    planes at random positions (what jumping around a stack does);
``scroll``
    consecutive planes forward from a random start, then back again (what dragging
    napari's slider does). The first scroll plane is timed apart (``first_ms``): the
    p50/p95 are those of the planes after it, shown while scrolling.

For each volume and reader: one untimed warm-up plane, then the random planes, then
the scroll, each timed from the call to host numpy in hand. Every plane is compared
with zarr's CPU read of it. A "plane" is the last two axes; the leading axes are
indexed (flattened in C order for arrays of more than three dimensions).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import gpu_zarr.bench.env as env
from gpu_zarr.bench.readers import (
    PlaneReader,
    browse_readers,
    fingerprint,
    record_failure,
    select_readers,
)
from gpu_zarr.bench.volumes import VolumeInfo

__all__ = ["PATTERNS", "plane_patterns", "time_planes", "default_plane_readers"]

PATTERNS = ("random", "scroll")


def plane_patterns(
    shape: tuple[int, ...], n: int, seed: int, patterns: tuple[str, ...] = PATTERNS
) -> tuple[tuple[int, ...], dict[str, list[tuple[int, ...]]]]:
    """(warm-up plane, {pattern: plane indices}), seeded.

    ``random`` has ``n`` planes; ``scroll`` goes forward over ``min(n, planes)``
    consecutive planes from a random start, then back to the start.
    """
    lead = tuple(shape[:-2]) or (1,)
    total = math.prod(lead)
    rng = np.random.default_rng(seed)

    def idx(k: int) -> tuple[int, ...]:
        return tuple(int(i) for i in np.unravel_index(int(k), lead)) if shape[:-2] else ()

    warm = idx(int(rng.integers(0, total)))
    out: dict[str, list[tuple[int, ...]]] = {}
    for pattern in patterns:
        if pattern == "random":
            out["random"] = [idx(k) for k in rng.integers(0, total, size=n)]
        elif pattern == "scroll":
            m = max(1, min(n, total))
            start = int(rng.integers(0, total - m + 1))
            fwd = list(range(start, start + m))
            out["scroll"] = [idx(k) for k in fwd + fwd[-2::-1]]
        else:
            raise ValueError(f"unknown browse pattern {pattern!r}; choose from {PATTERNS}")
    return warm, out


def _summary(times: list[float], plane_bytes: int, pattern: str) -> dict[str, Any]:
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
    return rec


def _key(idx: tuple[int, ...]) -> str:
    return ",".join(map(str, idx))


def time_planes(
    vol: VolumeInfo,
    readers: list[PlaneReader],
    *,
    planes: int,
    seed: int,
    log: Callable[[str], None],
    advance: Callable[[], None],
    patterns: tuple[str, ...] = PATTERNS,
) -> dict[str, Any]:
    """Time every plane reader on one volume; returns the JSON record of the volume."""
    if len(vol.shape) < 2:
        raise ValueError(f"{vol.path}: browsing needs an array of at least 2 dimensions, got {vol.shape}")
    path = str(vol.path)
    env.warm_files(vol.path)
    warm, pats = plane_patterns(vol.shape, planes, seed, patterns)
    record: dict[str, Any] = {
        **vol.to_json(),
        "patterns": {p: [list(i) for i in idxs] for p, idxs in pats.items()},
        "warmup_plane": list(warm),
        "readers": {},
    }
    ref: dict[tuple[int, ...], np.ndarray] | None = None
    plane_bytes = math.prod(vol.shape[-2:]) * np.dtype(vol.dtype).itemsize
    every = sorted({i for idxs in pats.values() for i in idxs})

    def reference() -> dict[tuple[int, ...], np.ndarray]:
        nonlocal ref
        if ref is None:
            ref = _reference(path, every)
        return ref

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
                res = reader.run_all(path, warm, pats)  # type: ignore[attr-defined]
                if "error" in res:
                    rec["error"] = res["error"]
                    if "traceback" in res:
                        rec["traceback"] = res["traceback"]
                    log(f"  {reader.name:<18} FAILED: {rec['error'][:300]}")
                    continue
                bad = []
                for pattern, idxs in pats.items():
                    child = res["patterns"][pattern]
                    rec["patterns"][pattern] = _summary(child["ms"], plane_bytes, pattern)
                    bad += [i for i, fp in zip(idxs, child["fingerprints"], strict=True)
                            if [int(x) for x in fp] != fingerprint(reference()[i])]
                _verdict(rec, bad, len(every), "fingerprint")
            else:
                reader.open(path)
                rec.update(reader.info)
                reader.plane(warm)  # untimed: first-call set-up
                got: dict[tuple[int, ...], np.ndarray] = {}
                for pattern, idxs in pats.items():
                    times: list[float] = []
                    for i in idxs:
                        t0 = time.perf_counter()
                        p = reader.plane(i)
                        times.append((time.perf_counter() - t0) * 1e3)
                        got.setdefault(i, np.asarray(p))
                    rec["patterns"][pattern] = _summary(times, plane_bytes, pattern)
                if ref is None and reader.name == "zarr-cpu":
                    ref = got
                    rec["correct"] = True
                    rec["correct_detail"] = "is the reference"
                else:
                    bad = [i for i in every if not np.array_equal(got[i], reference()[i])]
                    _verdict(rec, bad, len(every), "values")
                del got
            first = rec["patterns"].get(patterns[0], {})
            rec["p50_ms"], rec["p95_ms"] = first.get("p50_ms"), first.get("p95_ms")  # the first pattern's
            extra = f", whole-volume load {rec['load_s']:.2f} s" if "load_s" in rec else ""
            tag = "" if rec["correct"] else "  MISMATCH"
            txt = "  ".join(
                f"{p} p50 {r['p50_ms']:7.2f} p95 {r['p95_ms']:7.2f} ms" for p, r in rec["patterns"].items()
            )
            log(f"  {reader.name:<18} {txt}{extra}{tag}")
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


def _reference(path: str, idxs: list[tuple[int, ...]]) -> dict[tuple[int, ...], np.ndarray]:
    import zarr

    with zarr.config.set({"codecs.zstd": "zarr.codecs.zstd.ZstdCodec"}):
        arr = zarr.open_array(path, mode="r")
        return {i: np.asarray(arr[i]) for i in set(idxs)}


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
