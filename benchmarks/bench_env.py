"""Machine facts for the benchmark record, page-cache control and GPU memory probes."""

from __future__ import annotations

import importlib
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

__all__ = [
    "environment",
    "drop_caches",
    "can_drop_caches",
    "warm_files",
    "GpuMemory",
]


def _version(mod: str) -> str | None:
    try:
        m = importlib.import_module(mod)
    except Exception:
        return None
    return str(getattr(m, "__version__", "?"))


def environment(device: str) -> dict[str, Any]:
    """Versions, CPU count, GPU name and gpu_zarr's capability report."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": {
            m: _version(m)
            for m in ("numpy", "zarr", "numcodecs", "cupy", "kvikio", "nvidia.nvcomp", "dask", "gpu_zarr")
        },
    }
    try:
        import zarr

        env["zarr_config"] = {
            k: zarr.config.get(k, None)
            for k in ("async.concurrency", "threading.max_workers", "codec_pipeline.path", "codecs.zstd")
        }
    except Exception:
        pass
    try:
        from gpu_zarr.capabilities import probe

        caps = probe()
        env["capabilities"] = {
            k: _jsonable(getattr(caps, k, None)) for k in ("gpu", "kvikio", "nvcomp", "device_name")
        }
        report = getattr(caps, "report", None)
        if callable(report):
            env["capabilities"]["report"] = str(report())
    except Exception as exc:
        env["capabilities"] = {"error": f"{type(exc).__name__}: {exc}"}
    if device == "gpu":
        try:
            import cupy

            dev = cupy.cuda.Device()
            props = cupy.cuda.runtime.getDeviceProperties(dev.id)
            name = props.get("name", b"")
            env["gpu"] = {
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "total_bytes": int(dev.mem_info[1]),
                "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
            }
        except Exception as exc:
            env["gpu"] = {"error": f"{type(exc).__name__}: {exc}"}
    if device == "gpu":
        from bench_readers import kvikio_settings

        env["kvikio_settings_at_start"] = kvikio_settings()
    env["kvikio_env"] = {k: v for k, v in os.environ.items() if k.startswith("KVIKIO_")}
    return env


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def drop_caches() -> tuple[bool, str]:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``; returns (done, reason)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as exc:
        return False, f"not permitted ({type(exc).__name__}: {exc.strerror or exc})"
    return True, "dropped"


_CAN_DROP: tuple[bool, str] | None = None


def can_drop_caches() -> tuple[bool, str]:
    """Try once per process whether the page cache can be dropped."""
    global _CAN_DROP
    if _CAN_DROP is None:
        _CAN_DROP = drop_caches()
    return _CAN_DROP


def warm_files(path: Path, threads: int = 16) -> int:
    """Read every file under ``path`` once so it sits in the page cache."""
    from concurrent.futures import ThreadPoolExecutor

    files = [os.path.join(r, f) for r, _d, fs in os.walk(path) for f in fs]

    def read(p: str) -> int:
        n = 0
        with open(p, "rb", buffering=0) as fh:
            while chunk := fh.read(64 << 20):
                n += len(chunk)
        return n

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return sum(pool.map(read, files))


class GpuMemory:
    """Peak GPU memory of one read.

    Two measures:

    * ``pool``: growth of cupy's default memory pool during the read, after
      ``free_all_blocks()`` before it. The pool keeps freed blocks until told, so its
      size after the read is its high-water mark: an upper bound of the peak bytes
      in use through cupy (nvCOMP scratch included when routed through the pool).
    * ``device`` (optional, ``sample=True``): lowest free device memory seen by a
      thread polling ``cudaMemGetInfo`` every ~1 ms, relative to the start. It sees
      allocations outside cupy too, but can miss short spikes.
    """

    def __init__(self, sample: bool = False, interval_s: float = 0.001) -> None:
        self.sample = sample
        self.interval_s = interval_s
        self.result: dict[str, Any] = {}

    def __enter__(self) -> GpuMemory:
        import cupy

        self._cupy = cupy
        self._pool = cupy.get_default_memory_pool()
        self._pool.free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
        self._used0 = self._pool.used_bytes()
        self._total0 = self._pool.total_bytes()
        self._free0 = cupy.cuda.runtime.memGetInfo()[0]
        self._min_free = self._free0
        self._stop = threading.Event()
        self._thread = None
        if self.sample:
            dev = cupy.cuda.Device().id

            def poll() -> None:
                cupy.cuda.runtime.setDevice(dev)
                while not self._stop.is_set():
                    free = cupy.cuda.runtime.memGetInfo()[0]
                    if free < self._min_free:
                        self._min_free = free
                    time.sleep(self.interval_s)

            self._thread = threading.Thread(target=poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        cupy = self._cupy
        cupy.cuda.runtime.deviceSynchronize()
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        free = cupy.cuda.runtime.memGetInfo()[0]
        self._min_free = min(self._min_free, free)
        self.result = {
            "pool_peak_bytes": int(self._pool.total_bytes() - self._total0),
            "pool_held_before_bytes": int(self._used0),
        }
        if self.sample:
            self.result["device_peak_bytes_sampled"] = int(self._free0 - self._min_free)
