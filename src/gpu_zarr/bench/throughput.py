"""Whole-array reads onto the device: ours against the peers, per volume.

Per volume: its files are read once (warm page cache). Per reader: one untimed warm-up
read (ours on every volume, also recording the backend ``auto`` chose and a sampled
device-memory peak; a CPU-decoding peer once per process, a GPU peer once per codec
chain: its kernels and nvCOMP handles are set up), with ``--cold`` one read of our
primary reader after the page cache is dropped, then ``repeat`` warm reads whose
median gives GiB/s (decoded bytes / seconds / 2**30). Each timer stops after the
device is synchronised. Each reader's last result is compared with zarr's CPU read.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import gpu_zarr.bench.env as env
from gpu_zarr.bench.browse import stage_summary
from gpu_zarr.bench.readers import (
    Reader,
    error_text,
    fingerprint,
    record_failure,
    select_readers,
    synchronize,
    throughput_readers,
    to_host,
)
from gpu_zarr.bench.volumes import VolumeInfo
from gpu_zarr.errors import BenchReaderFailed

__all__ = ["TARGETS", "EXTRA_GPU_TARGET", "time_volume", "summarise", "default_readers"]

#: issues 8 and 9: targets on the full 4 GiB volume, warm cache, GiB/s (gzip: beat zarr CPU)
TARGETS = {
    "raw-v3-32MiB": 40.0,
    "zstd-v3-4MiB": 40.0,
    "zstd-v3-1MiB": 40.0,
    "sharded-zstd-v3-64MiB-1MiB": 40.0,
    "blosc-lz4-shuffle-v2": 40.0,
    "blosc-zstd-bitshuffle-v2": 40.0,
    "sharded-blosc-zstd-v3": 40.0,
}
#: peak GPU memory target: output + this many bytes (issue 9's default budget)
EXTRA_GPU_TARGET = 3 * 2**30


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
    """Exact equality of shape, dtype and values (in either byte order: zarr returns a big-endian
    array's own byte order, cupy and our reads native order)."""
    import numpy as np

    if tuple(a.shape) != tuple(ref.shape):
        return False, f"shape {tuple(a.shape)} != reference {tuple(ref.shape)}"
    if np.dtype(a.dtype).newbyteorder("=") != np.dtype(ref.dtype).newbyteorder("="):
        return False, f"dtype {a.dtype} != reference {ref.dtype}"
    if device == "gpu":
        import cupy

        a_gpu = a if type(a).__module__.startswith("cupy") else cupy.asarray(a)
        ok = bool(cupy.array_equal(a_gpu, ref))
        del a_gpu
    else:
        ok = bool(np.array_equal(to_host(a), ref))
    return ok, "equal" if ok else "values differ"


def _stats() -> dict[str, Any] | None:
    try:
        from gpu_zarr.engine import last_read_stats
    except Exception:
        return None
    try:
        import warnings

        with warnings.catch_warnings():  # deprecated by the runtime refactor; still what we need
            warnings.simplefilter("ignore", DeprecationWarning)
            st = last_read_stats()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if st is None:
        return None
    return {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v)) for k, v in dict(st).items()}


def _run_one(
    reader: Reader, path: str, device: str, *, measure_mem: bool, sample_mem: bool
) -> tuple[Any, float, dict[str, Any]]:
    """One timed read: (result, seconds, memory facts)."""
    mem: dict[str, Any] = {}
    if device == "gpu" and measure_mem:
        probe = env.GpuMemory(sample=sample_mem)
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


def _cold_read(
    reader: Reader, vol: VolumeInfo, device: str, cold: env.ColdCache, rec: dict[str, Any]
) -> None:
    """Drop the page cache (the whole system's, else this volume's files), then one timed read."""
    done, how = cold.drop(vol.path)
    if not done:
        rec["cold_error"] = how
        return
    out, dt, _ = _run_one(reader, str(vol.path), device, measure_mem=False, sample_mem=False)
    del out
    _free_device_memory(device)
    rec["cold_s"] = dt
    rec["cold_gib_per_s"] = vol.nbytes / dt / 2**30
    rec["cold_drop"] = how
    if cold.disk_gib_per_s:
        limit = cold.disk_gib_per_s * vol.ratio
        rec["cold_limit_gib_per_s"] = limit
        rec["cold_fraction_of_limit"] = rec["cold_gib_per_s"] / limit


class _Reference:
    """zarr's CPU read of one volume, which every reader's result is compared with: read
    when first needed, unless a zarr-cpu peer's own read comes first and becomes it."""

    def __init__(self, path: str, device: str) -> None:
        self.path, self.device = path, device
        self.data: Any = None
        self.name: str | None = None
        self._fingerprint: list[int] | None = None

    def get(self) -> Any:
        if self.data is None:
            self.data, self.name = _reference(self.path, self.device), "zarr-cpu (untimed)"
        return self.data

    def fingerprint(self) -> list[int]:
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.get())
        return self._fingerprint

    def check(self, out: Any, reader: Reader, rec: dict[str, Any]) -> None:
        """Record in ``rec`` whether ``out`` equals the reference."""
        if self.data is None and reader.kind == "peer" and reader.name.startswith("zarr-cpu"):
            self.data, self.name = out, reader.name
            rec["correct"] = True
            rec["correct_detail"] = "is the reference"
        else:
            ok, why = _equal(out, self.get(), self.device)
            rec["correct"] = ok
            rec["correct_detail"] = f"{why} (vs {self.name})"


def _warm_up(reader: Reader, path: str, device: str, record: dict[str, Any], rec: dict[str, Any]) -> None:
    """The untimed warm-up: ours on every volume (with a sampled memory peak), a peer once per
    process or per codec chain (the page cache is warm already)."""
    is_ours = reader.kind == "ours"
    if reader.info is not None:
        try:
            rec.update(reader.info(path))
        except Exception as exc:
            rec["info_error"] = error_text(exc)
        _free_device_memory(device)
    key = reader.name if reader.warmup == "process" else (
        f"{reader.name}|v{record.get('zarr_format')}|{record.get('codec')}|"
        f"{'sharded' if record.get('shards') else 'chunked'}")
    if is_ours or key not in _INITIALISED:
        out, dt, mem = _run_one(reader, path, device, measure_mem=is_ours, sample_mem=is_ours)
        rec["warmup_s"] = dt
        if mem.get("device_peak_bytes_sampled") is not None:
            rec["device_peak_bytes_sampled"] = mem["device_peak_bytes_sampled"]
        del out
        _free_device_memory(device)
        _INITIALISED.add(key)


def _warm_reads(
    reader: Reader, path: str, device: str, n_timed: int, rec: dict[str, Any]
) -> tuple[list[float], Any]:
    """``n_timed`` timed reads (each after the previous result is freed), with the memory peaks
    and, for ours, the engine's stage times, into ``rec``; returns the times and the last result."""
    is_ours = reader.kind == "ours"
    out = None
    times: list[float] = []
    peaks: list[int] = []
    stages: list[Any] = []
    for _ in range(n_timed):
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
    assert out is not None  # n_timed >= 1
    rec["output_bytes"] = int(out.nbytes)
    if peaks:
        rec["peak_gpu_bytes"] = max(peaks)
        rec["extra_gpu_bytes"] = max(peaks) - int(out.nbytes)
        rec["peak_within_target"] = rec["extra_gpu_bytes"] <= EXTRA_GPU_TARGET
    if stages:
        rec["stages"] = stages
        rec.update(stage_summary(stages))  # stages_ms, bound_by, engine_total_ms
    return times, out


def _time_reader(
    reader: Reader, vol: VolumeInfo, device: str, n_timed: int, record: dict[str, Any],
    rec: dict[str, Any], ref: _Reference, cold: env.ColdCache | None,
) -> list[float]:
    """One reader on one volume into ``rec``: an external reader times itself; any other is
    warmed up, read cold once when ``cold`` is given, timed warm and checked against zarr's
    CPU read. Returns the warm read times."""
    path = str(vol.path)
    if reader.external is not None:
        rec.update(reader.external(path, n_timed, ref.fingerprint))
        if "error" in rec:
            raise BenchReaderFailed(rec["error"])
        times: list[float] = rec["warm_s"]
        return times
    _warm_up(reader, path, device, record, rec)
    if cold is not None:
        _cold_read(reader, vol, device, cold, rec)
    times, out = _warm_reads(reader, path, device, n_timed, rec)
    ref.check(out, reader, rec)  # the first reader, or computed here
    return times


def _record_rate(reader: Reader, rec: dict[str, Any], times: list[float], nbytes: int,
                 log: Callable[[str], None]) -> None:
    """The median warm rate into ``rec``, and its log line."""
    med = statistics.median(times)
    rec["warm_s"] = times
    rec["median_s"] = med
    rec["gib_per_s"] = nbytes / med / 2**30
    tag = "" if rec["correct"] else "  MISMATCH"
    cold_txt = f", cold {rec['cold_gib_per_s']:.2f}" if "cold_gib_per_s" in rec else ""
    mem_txt = (
        f", peak +{rec['extra_gpu_bytes'] / 2**30:.2f} GiB over output"
        if "extra_gpu_bytes" in rec
        else ""
    )
    backend = f" [{rec['backend']}]" if rec.get("backend") else ""
    log(
        f"  {reader.name:<17} {rec['gib_per_s']:8.2f} GiB/s warm (median {med:.3f} s of {len(times)})"
        f"{cold_txt}{mem_txt}{backend}{tag}"
    )


def time_volume(
    vol: VolumeInfo,
    readers: list[Reader],
    device: str,
    *,
    repeat: int,
    log: Callable[[str], None],
    advance: Callable[[], None],
    peer_repeat: int | None = None,
    cold: env.ColdCache | None = None,
    cold_reader: str | None = None,
) -> dict[str, Any]:
    """Time every reader on one volume; returns the JSON record of the volume.

    Parameters
    ----------
    repeat, peer_repeat
        Timed warm reads of ours and of the peers (``peer_repeat`` defaults to
        ``repeat``); the median is reported.
    cold, cold_reader
        When given, ``cold_reader`` (one of ours) also makes one read after the page
        cache is dropped, reported against the disk rate x compression ratio.
    """
    record: dict[str, Any] = {**vol.to_json(), "readers": {}}
    ref = _Reference(str(vol.path), device)
    env.warm_files(vol.path)
    for reader in readers:
        rec: dict[str, Any] = {"kind": reader.kind, "description": reader.description}
        record["readers"][reader.name] = rec
        if reader.skip_reason:
            rec["skipped"] = reader.skip_reason
            log(f"  {reader.name:<17} skipped: {reader.skip_reason}")
            advance()
            continue
        n_timed = repeat if reader.kind == "ours" or peer_repeat is None else peer_repeat
        try:
            times = _time_reader(reader, vol, device, n_timed, record, rec, ref,
                                 cold if reader.name == cold_reader else None)
            _record_rate(reader, rec, times, vol.nbytes, log)
        except BenchReaderFailed as exc:
            log(f"  {reader.name:<17} FAILED: {str(exc)[:300]}")
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            record_failure(rec, exc, log, f"{reader.name:<17}")
        finally:
            _free_device_memory(device)
            advance()
    ref.data = None
    _free_device_memory(device)
    record["reference"] = ref.name
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
