"""Z-plane browsing: ms per random plane of a 3D volume, p50 / p95.

For each layout and reader: one untimed warm-up plane, then the same list of
random planes for every reader (seeded), each timed from the call to host numpy
in hand. Every plane is compared with zarr's CPU read of it.
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from bench_readers import PlaneReader, browse_readers
from bench_volumes import VolumeInfo

__all__ = ["plane_indices", "time_planes", "default_plane_readers"]


def plane_indices(nz: int, n: int, seed: int) -> tuple[int, list[int]]:
    """(warm-up plane, ``n`` timed planes), random with ``seed``."""
    rng = np.random.default_rng(seed)
    zs = rng.integers(0, nz, size=n + 1)
    return int(zs[0]), [int(z) for z in zs[1:]]


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()[:2000]


def time_planes(
    vol: VolumeInfo,
    readers: list[PlaneReader],
    *,
    planes: int,
    seed: int,
    log: Callable[[str], None],
    advance: Callable[[], None],
) -> dict[str, Any]:
    """Time every plane reader on one volume; returns the JSON record of the volume."""
    path = str(vol.path)
    warm_z, zs = plane_indices(vol.shape[0], planes, seed)
    record: dict[str, Any] = {**vol.to_json(), "planes": zs, "warmup_plane": warm_z, "readers": {}}
    ref: dict[int, np.ndarray] | None = None
    plane_bytes = vol.shape[1] * vol.shape[2] * 2

    for reader in readers:
        rec: dict[str, Any] = {"kind": reader.kind, "description": reader.description}
        record["readers"][reader.name] = rec
        if reader.skip_reason:
            rec["skipped"] = reader.skip_reason
            log(f"  {reader.name:<18} skipped: {reader.skip_reason}")
            advance()
            continue
        try:
            reader.open(path)
            rec.update(reader.info)
            reader.plane(warm_z)  # untimed: first-call set-up
            times: list[float] = []
            got: dict[int, np.ndarray] = {}
            for z in zs:
                t0 = time.perf_counter()
                p = reader.plane(z)
                times.append((time.perf_counter() - t0) * 1e3)
                got[z] = np.asarray(p)
            ms = np.asarray(times)
            rec["ms"] = [round(t, 4) for t in times]
            rec["p50_ms"] = float(np.percentile(ms, 50))
            rec["p95_ms"] = float(np.percentile(ms, 95))
            rec["mean_ms"] = float(ms.mean())
            rec["planes_per_s"] = 1e3 / float(ms.mean()) if ms.mean() > 0 else None
            rec["gib_per_s_p50"] = plane_bytes / (rec["p50_ms"] / 1e3) / 2**30 if rec["p50_ms"] > 0 else None
            if ref is None and reader.name == "zarr-cpu":
                ref = got
                rec["correct"] = True
                rec["correct_detail"] = "is the reference"
            else:
                if ref is None:
                    ref = _reference(path, zs)
                bad = [z for z in zs if not np.array_equal(got[z], ref[z])]
                rec["correct"] = not bad
                rec["correct_detail"] = (
                    f"all {len(zs)} planes equal zarr-cpu"
                    if not bad
                    else f"{len(bad)} of {len(zs)} planes differ from zarr-cpu, e.g. z={bad[0]}"
                )
            extra = ""
            if "load_s" in rec:
                extra = f", whole-volume load {rec['load_s']:.2f} s"
            tag = "" if rec["correct"] else "  MISMATCH"
            log(
                f"  {reader.name:<18} p50 {rec['p50_ms']:8.2f} ms  p95 {rec['p95_ms']:8.2f} ms"
                f"{extra}{tag}"
            )
            del got
        except Exception as exc:
            rec["error"] = _err(exc)
            rec["traceback"] = traceback.format_exc(limit=8)[-4000:]
            log(f"  {reader.name:<18} FAILED: {rec['error'][:300]}")
        finally:
            try:
                reader.close()
            except Exception:
                pass
            gc.collect()
            _free_gpu()
            advance()
    return record


def _reference(path: str, zs: list[int]) -> dict[int, np.ndarray]:
    import zarr

    with zarr.config.set({"codecs.zstd": "zarr.codecs.zstd.ZstdCodec"}):
        arr = zarr.open_array(path, mode="r")
        return {z: arr[z] for z in set(zs)}


def _free_gpu() -> None:
    try:
        import sys

        cupy = sys.modules.get("cupy")
        if cupy is not None:
            cupy.get_default_memory_pool().free_all_blocks()
    except Exception:
        pass


def default_plane_readers(device: str, only: list[str] | None) -> list[PlaneReader]:
    from bench_throughput import select_readers

    return select_readers(browse_readers(device), device, only)
