"""Whole-array reads onto the device: ours against the peers, per layout.

Per volume and reader: one warm-up read (also records the backend ``auto`` chose
and, for ours, a sampled device-memory peak), one cold-cache read when the page
cache can be dropped, then ``repeat`` warm reads whose median gives GiB/s
(decoded bytes / seconds / 2**30). Each timer stops after the device is
synchronised. Each reader's last result is compared with zarr's CPU read.
"""

from __future__ import annotations

import gc
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import bench_env
from bench_readers import Reader, synchronize, throughput_readers, to_host
from bench_volumes import VolumeInfo

__all__ = ["TARGETS", "time_volume", "summarise"]

#: issue 4's targets on the full 4 GiB volume, warm cache, GiB/s
TARGETS = {
    "raw-v3-32MiB": 36.0,
    "zstd-v3-4MiB": 30.0,
    "zstd-v3-1MiB": 20.0,
    "sharded-zstd-v3-64MiB-1MiB": 30.0,
}
#: peak GPU memory target: output + this many bytes
EXTRA_GPU_TARGET = int(1.5 * 2**30)


#: readers that have run once in this process (imports, pools and kernels are set up)
_INITIALISED: set[str] = set()


def _free_device_memory(device: str) -> None:
    gc.collect()
    if device == "gpu":
        try:
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()
            cupy.get_default_pinned_memory_pool().free_all_blocks()
        except Exception:
            pass


def _equal(a: Any, ref: Any, device: str) -> tuple[bool, str]:
    """Exact equality of shape, dtype and values."""
    if tuple(a.shape) != tuple(ref.shape):
        return False, f"shape {tuple(a.shape)} != reference {tuple(ref.shape)}"
    if str(a.dtype) != str(ref.dtype):
        return False, f"dtype {a.dtype} != reference {ref.dtype}"
    if device == "gpu":
        import cupy

        a_gpu = a if type(a).__module__.startswith("cupy") else cupy.asarray(a)
        ok = bool(cupy.array_equal(a_gpu, ref))
        del a_gpu
    else:
        import numpy as np

        ok = bool(np.array_equal(to_host(a), ref))
    return ok, "equal" if ok else "values differ"


def _stats() -> dict[str, Any] | None:
    try:
        from gpu_zarr.engine import last_read_stats
    except Exception:
        return None
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            st = last_read_stats()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if st is None:
        return None
    return {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v)) for k, v in dict(st).items()}


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()[:2000]


def _run_one(
    reader: Reader, path: str, device: str, *, measure_mem: bool, sample_mem: bool
) -> tuple[Any, float, dict[str, Any]]:
    """One timed read: (result, seconds, memory facts)."""
    mem: dict[str, Any] = {}
    if device == "gpu" and measure_mem:
        probe = bench_env.GpuMemory(sample=sample_mem)
        with probe:
            t0 = time.perf_counter()
            out = reader.read(path)
            synchronize(device)
            dt = time.perf_counter() - t0
        mem = probe.result
    else:
        synchronize(device)
        t0 = time.perf_counter()
        out = reader.read(path)
        synchronize(device)
        dt = time.perf_counter() - t0
    return out, dt, mem


def time_volume(
    vol: VolumeInfo,
    readers: list[Reader],
    device: str,
    *,
    repeat: int,
    cold: bool,
    log: Callable[[str], None],
    advance: Callable[[], None],
) -> dict[str, Any]:
    """Time every reader on one volume; returns the JSON record of the volume."""
    path = str(vol.path)
    nbytes = vol.nbytes
    record: dict[str, Any] = {**vol.to_json(), "readers": {}}
    ref = None
    ref_name = None
    cold_ok, cold_reason = bench_env.can_drop_caches() if cold else (False, "disabled (--no-cold)")
    record["cold"] = {"measured": cold_ok, "reason": cold_reason}

    for reader in readers:
        rec: dict[str, Any] = {"kind": reader.kind, "description": reader.description}
        record["readers"][reader.name] = rec
        if reader.skip_reason:
            rec["skipped"] = reader.skip_reason
            log(f"  {reader.name:<15} skipped: {reader.skip_reason}")
            advance()
            continue
        is_ours = reader.kind == "ours"
        out = None
        try:
            # warm-up (untimed for the median): also the backend choice and a sampled peak
            if reader.info is not None:
                try:
                    rec.update(reader.info(path))
                except Exception as exc:
                    rec["info_error"] = _err(exc)
                _free_device_memory(device)
            # A peer already initialised on an earlier volume needs no warm-up when a
            # cold run follows: the cold run fills the page cache for the warm runs.
            if is_ours or not (cold_ok and reader.name in _INITIALISED):
                out, dt, mem = _run_one(
                    reader, path, device, measure_mem=is_ours, sample_mem=is_ours
                )
                rec["warmup_s"] = dt
                if mem.get("device_peak_bytes_sampled") is not None:
                    rec["device_peak_bytes_sampled"] = mem["device_peak_bytes_sampled"]
                del out
                out = None
                _free_device_memory(device)
                _INITIALISED.add(reader.name)
            if cold_ok:
                done, why = bench_env.drop_caches()
                if done:
                    out, dt, _ = _run_one(reader, path, device, measure_mem=False, sample_mem=False)
                    rec["cold_s"] = dt
                    rec["cold_gib_per_s"] = nbytes / dt / 2**30
                    del out
                    out = None
                    _free_device_memory(device)
                else:
                    rec["cold_error"] = why
                    if "warmup_s" not in rec:  # no warm-up yet: do one now
                        out, rec["warmup_s"], _ = _run_one(
                            reader, path, device, measure_mem=False, sample_mem=False
                        )
                        del out
                        out = None
                        _free_device_memory(device)
            times: list[float] = []
            peaks: list[int] = []
            stages: list[Any] = []
            for i in range(repeat):
                if out is not None:
                    del out
                    out = None
                    _free_device_memory(device)
                before = _stats() if is_ours else None
                out, dt, mem = _run_one(reader, path, device, measure_mem=is_ours, sample_mem=False)
                times.append(dt)
                if "pool_peak_bytes" in mem:
                    peaks.append(mem["pool_peak_bytes"])
                    rec["pool_held_before_bytes"] = mem["pool_held_before_bytes"]
                if is_ours:
                    st = _stats()
                    if st is not None and st != before:  # else this read did not use the engine
                        stages.append(st)
            med = statistics.median(times)
            rec["warm_s"] = times
            rec["median_s"] = med
            rec["gib_per_s"] = nbytes / med / 2**30
            rec["output_bytes"] = int(out.nbytes)
            if peaks:
                rec["peak_gpu_bytes"] = max(peaks)
                rec["extra_gpu_bytes"] = max(peaks) - int(out.nbytes)
                rec["peak_within_target"] = rec["extra_gpu_bytes"] <= EXTRA_GPU_TARGET
            if stages:
                rec["stages"] = stages
            # correctness against zarr's CPU read (the first reader, or computed here)
            if ref is None:
                if reader.kind == "peer" and reader.name.startswith("zarr-cpu"):
                    ref, ref_name = out, reader.name
                    out = None
                else:
                    ref = _reference(path, device)
                    ref_name = "zarr-cpu (untimed)"
            if out is not None:
                ok, why = _equal(out, ref, device)
                rec["correct"] = ok
                rec["correct_detail"] = f"{why} (vs {ref_name})"
            else:
                rec["correct"] = True
                rec["correct_detail"] = "is the reference"
            tag = "" if rec["correct"] else "  MISMATCH"
            cold_txt = f", cold {rec['cold_gib_per_s']:.2f}" if "cold_gib_per_s" in rec else ""
            mem_txt = (
                f", peak +{rec['extra_gpu_bytes'] / 2**30:.2f} GiB over output"
                if "extra_gpu_bytes" in rec
                else ""
            )
            backend = f" [{rec['backend']}]" if rec.get("backend") else ""
            log(
                f"  {reader.name:<15} {rec['gib_per_s']:8.2f} GiB/s warm (median {med:.3f} s of {repeat})"
                f"{cold_txt}{mem_txt}{backend}{tag}"
            )
        except Exception as exc:
            rec["error"] = _err(exc)
            rec["traceback"] = traceback.format_exc(limit=8)[-4000:]
            log(f"  {reader.name:<15} FAILED: {rec['error'][:300]}")
        finally:
            out = None
            _free_device_memory(device)
            advance()
    ref = None
    _free_device_memory(device)
    record["reference"] = ref_name
    record["ratios"] = summarise(record)
    return record


def _reference(path: str, device: str):
    import zarr

    with zarr.config.set({"codecs.zstd": "zarr.codecs.zstd.ZstdCodec"}):
        host = zarr.open_array(path, mode="r")[...]
    if device == "gpu":
        import cupy

        return cupy.asarray(host)
    return host


def summarise(record: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{ours_reader: {peer_reader: ours_gib_per_s / peer_gib_per_s}}``."""
    readers = record["readers"]
    ours = {n: r["gib_per_s"] for n, r in readers.items() if r["kind"] == "ours" and "gib_per_s" in r}
    peers = {n: r["gib_per_s"] for n, r in readers.items() if r["kind"] == "peer" and "gib_per_s" in r}
    return {o: {p: og / pg for p, pg in peers.items() if pg > 0} for o, og in ours.items()}


def default_readers(device: str, only: list[str] | None) -> list[Reader]:
    return select_readers(throughput_readers(device), device, only)


def select_readers(readers: list, device: str, only: list[str] | None) -> list:
    """``readers`` restricted to the names in ``only`` (all when empty); unknown names raise."""
    if only:
        unknown = set(only) - {r.name for r in readers}
        if unknown:
            raise ValueError(
                f"unknown reader(s) {sorted(unknown)} for device {device}; "
                f"choose from {[r.name for r in readers]}"
            )
        readers = [r for r in readers if r.name in only]
    return readers
