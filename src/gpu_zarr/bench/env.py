"""Machine facts for the benchmark record, page-cache control (cold reads, the disk's
own rate) and GPU memory probes."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

from gpu_zarr.memory import GpuMemory  # the one definition (the writer reports it too)

__all__ = [
    "environment",
    "ColdCache",
    "store_files",
    "warm_files",
    "GpuMemory",
]

_DISTRIBUTIONS = {"nvidia.nvcomp": "nvidia-nvcomp-cu13", "gpu_zarr": "napari-gpu-zarr"}


def _version(mod: str) -> str | None:
    """Installed version of ``mod`` (metadata first: importing cupy or czarr is not needed)."""
    from importlib import metadata

    for dist in (_DISTRIBUTIONS.get(mod, mod), mod.replace("_", "-"), f"{mod}-cuda13x", f"{mod}-cu13"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        except Exception:
            break
    return None


def environment(device: str) -> dict[str, Any]:
    """Versions, CPU count, GPU name and gpu_zarr's capability report."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": {
            m: _version(m)
            for m in ("numpy", "zarr", "numcodecs", "cupy", "kvikio", "nvidia.nvcomp", "tensorstore", "czarr",
                      "dask", "gpu_zarr")
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
        from gpu_zarr.bench.readers import kvikio_settings

        env["kvikio_settings_at_start"] = kvikio_settings()
    env["kvikio_env"] = {k: v for k, v in os.environ.items() if k.startswith("KVIKIO_")}
    return env


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def store_files(path: Path) -> list[str]:
    """Every file under ``path``, sorted."""
    return sorted(os.path.join(r, f) for r, _d, fs in os.walk(path) for f in fs)


def _drop_system() -> tuple[bool, str]:
    """The whole page cache: kvikio's ``drop_system_page_cache``, else ``drop_caches``.

    kvikio's function is called only as root: otherwise it retries with ``sudo``, which
    could stop at a password prompt.
    """
    why = ""
    drop_system_page_cache = None
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        try:
            from kvikio.cufile import drop_system_page_cache  # type: ignore[no-redef]
        except Exception:
            drop_system_page_cache = None
    if drop_system_page_cache is not None:
        try:
            if drop_system_page_cache(reclaim_dentries_and_inodes=True, sync_first=True):
                return True, "kvikio.cufile.drop_system_page_cache()"
            why = "kvikio.cufile.drop_system_page_cache() returned False; "
        except Exception as exc:
            why = f"kvikio.cufile.drop_system_page_cache(): {type(exc).__name__}: {exc}; "
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as exc:
        detail = f"{type(exc).__name__}: {exc.strerror or exc}"
        return False, why + f"writing /proc/sys/vm/drop_caches: not permitted ({detail})"
    return True, "sync; echo 3 > /proc/sys/vm/drop_caches"


def _drop_files(path: Path) -> tuple[bool, str]:
    """Each file under ``path``: ``posix_fadvise(POSIX_FADV_DONTNEED)`` (no privilege needed)."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return False, "os.posix_fadvise is not available on this platform"
    try:
        for name in store_files(path):
            fd = os.open(name, os.O_RDONLY)
            try:
                advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    except OSError as exc:
        return False, f"posix_fadvise(DONTNEED) failed: {exc}"
    return True, "posix_fadvise(DONTNEED) on each file of the array"


class ColdCache:
    """Drops the page cache before a cold read, and knows the disk's own rate.

    :meth:`drop` tries the whole system's page cache first (kvikio's
    ``drop_system_page_cache`` when kvikio is installed, else ``sync; echo 3 >
    /proc/sys/vm/drop_caches``); when that is not permitted it drops the array's own
    files from the cache with ``posix_fadvise(DONTNEED)``, and says so. Files are only
    opened for reading.
    """

    def __init__(self) -> None:
        self._system: tuple[bool, str] | None = None
        self.disk: dict[str, Any] = {}

    @property
    def disk_gib_per_s(self) -> float | None:
        v = self.disk.get("gib_per_s")
        return float(v) if isinstance(v, (int, float)) else None

    def drop(self, path: Path) -> tuple[bool, str]:
        """Drop the page cache (at least ``path``'s files); returns (done, how or why not)."""
        if self._system is None or self._system[0]:
            self._system = _drop_system()
            if self._system[0]:
                return self._system
        done, how = _drop_files(Path(path))
        if done:
            return True, f"{how} (system-wide drop: {self._system[1]})"
        return False, f"{self._system[1]}; {how}"

    def measure_disk(self, path: Path, cap_bytes: int = 2 << 30, threads: int = 16) -> dict[str, Any]:
        """The disk's own read rate, once: drop, then read ``path``'s files cold.

        Up to ``cap_bytes`` of the array's files are read whole, ``threads`` files at a
        time in 16 MiB reads (as a parallel reader would); GiB/s of stored bytes.
        """
        if self.disk:
            return self.disk
        files = store_files(Path(path))
        chosen, total = [], 0
        for f in files:
            if total >= cap_bytes:
                break
            size = os.path.getsize(f)
            chosen.append(f)
            total += size
        done, how = self.drop(Path(path))
        if not done:
            self.disk = {"error": how}
            return self.disk
        from concurrent.futures import ThreadPoolExecutor

        def read(p: str) -> int:
            n = 0
            buf = bytearray(16 << 20)
            with open(p, "rb", buffering=0) as fh:
                while k := fh.readinto(buf):
                    n += k
            return n

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            nbytes = sum(pool.map(read, chosen))
        dt = time.perf_counter() - t0
        self.disk = {
            "gib_per_s": nbytes / dt / 2**30 if dt > 0 else None,
            "bytes": nbytes,
            "files": len(chosen),
            "threads": threads,
            "seconds": dt,
            "drop": how,
            "source": str(path),
        }
        return self.disk


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
