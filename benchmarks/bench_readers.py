"""The readers the benchmark times: ours (gpu_zarr) and the peers.

A whole-array reader is a :class:`Reader`: ``read(path)`` returns the full array
(cupy on the GPU device, numpy on the CPU device). A browsing reader is a
:class:`PlaneReader`: ``open(path)`` prepares it, ``plane(z)`` returns plane ``z`` as
host numpy, ``close()`` releases what it holds.

GPU imports (cupy, kvikio) happen inside functions only.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Reader",
    "PlaneReader",
    "throughput_readers",
    "browse_readers",
    "gpu_available",
    "synchronize",
    "to_host",
    "kvikio_settings",
]


# ---------------------------------------------------------------- device helpers


def gpu_available() -> tuple[bool, str]:
    """Whether cupy and a CUDA device are usable, with the reason when not."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install
        return False, f"cupy is not importable ({type(exc).__name__}: {exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"no CUDA device ({type(exc).__name__}: {exc})"
    if n < 1:
        return False, "no CUDA device"
    return True, f"{n} CUDA device(s)"


def synchronize(device: str) -> None:
    """Wait for all GPU work (every stream) to finish; no-op on the CPU device."""
    if device == "gpu":
        import cupy

        cupy.cuda.runtime.deviceSynchronize()


def to_host(a: Any):
    """Host numpy view/copy of a cupy or numpy array."""
    get = getattr(a, "get", None)
    if callable(get) and type(a).__module__.startswith("cupy"):
        return get()
    import numpy as np

    return np.asarray(a)


def _zarr_default_codecs() -> contextlib.AbstractContextManager:
    """zarr's own codec classes, whatever gpu_zarr registered: the peers run stock zarr."""
    import zarr

    return zarr.config.set({"codecs.zstd": "zarr.codecs.zstd.ZstdCodec"})


# ---------------------------------------------------------------- whole-array readers


@dataclass
class Reader:
    """One way to read a whole array."""

    name: str
    kind: str  # "ours" or "peer"
    description: str
    read: Callable[[str], Any]
    #: ``None`` when usable, else why it is skipped
    skip_reason: str | None = None
    #: extra facts to record (e.g. the backend ``auto`` chose)
    info: Callable[[str], dict[str, Any]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def _ours_gpu(prefer: str) -> Callable[[str], Any]:
    def read(path: str):
        from gpu_zarr.zarr_io import read_zarr_to_gpu

        return read_zarr_to_gpu(path, prefer=prefer)

    return read


def _ours_info(prefer: str) -> Callable[[str], dict[str, Any]]:
    """Backend and reason that ``read_zarr`` reports (called once, untimed)."""

    def info(path: str) -> dict[str, Any]:
        from gpu_zarr.zarr_io import read_zarr

        res = read_zarr(path, prefer=prefer)
        out = {
            "backend": getattr(res, "backend", None),
            "reason": getattr(res, "reason", None),
        }
        for key in ("seconds", "gib_per_s", "gpu_bytes"):
            val = getattr(res, key, None)
            if isinstance(val, (int, float)):
                out[f"read_zarr_{key}"] = val
        del res
        return out

    return info


def _ours_cpu(path: str):
    from gpu_zarr.zarr_io import read_zarr

    return read_zarr(path, prefer="cpu").data


def _ours_engine_cpu(path: str):
    from gpu_zarr.engine import read

    return read(path, device="cpu").data


def _zarr_cpu(path: str):
    import zarr

    with _zarr_default_codecs():
        return zarr.open_array(path, mode="r")[...]


def _zarr_cpu_cupy(path: str):
    import cupy
    import zarr

    with _zarr_default_codecs():
        host = zarr.open_array(path, mode="r")[...]
    return cupy.asarray(host)


def _zarr_gpu(path: str):
    import zarr

    with _zarr_default_codecs(), zarr.config.enable_gpu():
        return zarr.open_array(path, mode="r")[...]


def _gdsstore_class():
    kz = importlib.import_module("kvikio.zarr")
    cls = getattr(kz, "GDSStore", None)
    if cls is None:
        raise ImportError("kvikio.zarr has no GDSStore")
    return cls


#: kvikio's settings before any read of this process (our engine may change them)
_KVIKIO_BASELINE: dict[str, Any] | None = None
_KVIKIO_KEYS = ("num_threads", "task_size")


def _kvikio_get(kd, key: str):
    try:
        return kd.get(key)
    except Exception:
        fn = getattr(kd, key, None) or getattr(kd, f"get_{key}", None)
        return fn() if callable(fn) else None


def _kvikio_put(kd, key: str, value) -> None:
    try:
        kd.set({key: value})
    except Exception:
        fn = getattr(kd, f"{key}_reset", None)
        if callable(fn):
            fn(value)


@contextlib.contextmanager
def _kvikio_settings(settings: dict[str, Any] | None):
    """kvikio's global settings set to ``settings`` for the block, then restored."""
    if not settings:
        yield
        return
    import kvikio.defaults as kd

    old = {k: _kvikio_get(kd, k) for k in settings}
    for k, v in settings.items():
        if v is not None and v != old.get(k):
            _kvikio_put(kd, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is not None and v != _kvikio_get(kd, k):
                _kvikio_put(kd, k, v)


def capture_kvikio_baseline() -> dict[str, Any] | None:
    """Remember kvikio's settings now (call before any read); returns them."""
    global _KVIKIO_BASELINE
    if _KVIKIO_BASELINE is None:
        try:
            import kvikio.defaults as kd

            _KVIKIO_BASELINE = {k: _kvikio_get(kd, k) for k in _KVIKIO_KEYS}
        except Exception:
            _KVIKIO_BASELINE = {}
    return _KVIKIO_BASELINE


def _kvikio_gds(path: str):
    """GDSStore with kvikio's settings as they were before our engine ran (its defaults)."""
    import zarr

    cls = _gdsstore_class()
    try:
        store = cls(path, read_only=True)
    except TypeError:  # an older GDSStore without read_only
        store = cls(path)
    with _kvikio_settings(_KVIKIO_BASELINE), _zarr_default_codecs(), zarr.config.enable_gpu():
        return zarr.open_array(store, mode="r")[...]


def kvikio_settings() -> dict[str, Any]:
    """kvikio's global settings now (thread count, compat mode, task size)."""
    try:
        import kvikio.defaults as kd
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {}
    for key in ("num_threads", "compat_mode", "task_size", "gds_threshold", "bounce_buffer_size"):
        val = None
        try:
            val = kd.get(key)
        except Exception:
            fn = getattr(kd, key, None)
            try:
                val = fn() if callable(fn) else None
            except Exception:
                val = None
        out[key] = val if isinstance(val, (int, float, bool, str)) or val is None else str(val)
    return out


def _probe_import(module: str, attr: str | None = None) -> str | None:
    try:
        mod = importlib.import_module(module)
    except Exception as exc:
        return f"{module} is not importable ({type(exc).__name__}: {exc})"
    if attr is not None and getattr(mod, attr, None) is None:
        return f"{module}.{attr} does not exist in this version"
    return None


def throughput_readers(device: str) -> list[Reader]:
    """Readers in the order they run: the reference (zarr CPU) first."""
    if device == "cpu":
        return [
            Reader("zarr-cpu", "peer", "zarr-python CPU read (numpy)", _zarr_cpu),
            Reader(
                "ours-cpu",
                "ours",
                'gpu_zarr.zarr_io.read_zarr(path, prefer="cpu").data',
                _ours_cpu,
                info=_ours_info("cpu"),
            ),
            Reader(
                "ours-engine-cpu",
                "ours",
                'gpu_zarr.engine.read(path, device="cpu"): the CPU twin of the GPU engine',
                _ours_engine_cpu,
            ),
        ]
    gds_skip = _probe_import("kvikio.zarr", "GDSStore")
    if gds_skip is None:
        capture_kvikio_baseline()
    return [
        Reader("zarr-cpu+cupy", "peer", "zarr CPU read, then cupy.asarray", _zarr_cpu_cupy),
        Reader(
            "ours-kvikio",
            "ours",
            'gpu_zarr.zarr_io.read_zarr_to_gpu(path, prefer="kvikio")',
            _ours_gpu("kvikio"),
            info=_ours_info("kvikio"),
        ),
        Reader(
            "ours-auto",
            "ours",
            'gpu_zarr.zarr_io.read_zarr_to_gpu(path, prefer="auto")',
            _ours_gpu("auto"),
            info=_ours_info("auto"),
        ),
        Reader(
            "zarr-gpu",
            "peer",
            "zarr-python with zarr.config.enable_gpu() (stock zstd codec)",
            _zarr_gpu,
        ),
        Reader(
            "kvikio-gds",
            "peer",
            "kvikio.zarr.GDSStore + zarr.config.enable_gpu(), kvikio settings as at start",
            _kvikio_gds,
            skip_reason=gds_skip,
            info=lambda _path: {"kvikio_settings": dict(_KVIKIO_BASELINE or {})},
        ),
    ]


# ---------------------------------------------------------------- plane readers


class PlaneReader:
    """Reads single z-planes of one array; ``plane(z)`` returns host numpy."""

    name = "?"
    kind = "peer"
    description = ""
    skip_reason: str | None = None

    def __init__(self) -> None:
        self.info: dict[str, Any] = {}
        self._stack = contextlib.ExitStack()

    def open(self, path: str) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def plane(self, z: int):  # pragma: no cover - overridden
        raise NotImplementedError

    def close(self) -> None:
        self._stack.close()


class _ZarrCpuPlanes(PlaneReader):
    name = "zarr-cpu"
    description = "zarr-python CPU: arr[z]"

    def open(self, path: str) -> None:
        import zarr

        self._stack.enter_context(_zarr_default_codecs())
        self.arr = zarr.open_array(path, mode="r")

    def plane(self, z: int):
        return self.arr[z]


class _ZarrGpuPlanes(PlaneReader):
    name = "zarr-gpu"
    description = "zarr-python with enable_gpu(): arr[z].get()"

    def open(self, path: str) -> None:
        import zarr

        self._stack.enter_context(_zarr_default_codecs())
        self._stack.enter_context(zarr.config.enable_gpu())
        self.arr = zarr.open_array(path, mode="r")

    def plane(self, z: int):
        return to_host(self.arr[z])


class _DaskPlanes(PlaneReader):
    name = "dask-zarr"
    description = "napari-ome-zarr's path: dask.array.from_zarr(arr)[z].compute()"

    def __init__(self) -> None:
        super().__init__()
        self.skip_reason = _probe_import("dask.array")

    def open(self, path: str) -> None:
        import dask.array as da
        import zarr

        self._stack.enter_context(_zarr_default_codecs())
        self.arr = da.from_zarr(zarr.open_array(path, mode="r"))

    def plane(self, z: int):
        return self.arr[z].compute()


class _OursLazyPlanes(PlaneReader):
    kind = "ours"

    def __init__(self, backend: str, device: str) -> None:
        super().__init__()
        self.backend = backend
        self.device = device
        self.name = f"ours-lazy-{backend}"
        self.description = (
            f'gpu_zarr.zarr_io.read_region(arr, (z, :, :), backend="{backend}")'
            + (".get()" if device == "gpu" else "")
        )

    def open(self, path: str) -> None:
        import zarr

        self.arr = zarr.open_array(path, mode="r")

    def plane(self, z: int):
        from gpu_zarr.zarr_io import read_region

        out = read_region(self.arr, (z, slice(None), slice(None)), backend=self.backend)
        return to_host(out)


class _OursEngineCpuPlanes(PlaneReader):
    kind = "ours"
    name = "ours-engine-cpu"
    description = 'gpu_zarr.engine.read(arr, (z, :, :), device="cpu"): the engine\'s CPU twin'

    def open(self, path: str) -> None:
        import zarr

        self.arr = zarr.open_array(path, mode="r")

    def plane(self, z: int):
        from gpu_zarr.engine import read

        return read(self.arr, (z, slice(None), slice(None)), device="cpu").data


class _OursResidentPlanes(PlaneReader):
    kind = "ours"

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device = device
        self.name = "ours-resident" if device == "gpu" else "ours-resident-cpu"
        self.description = (
            'whole volume read once with read_zarr_to_gpu(path, prefer="auto"), then vol[z].get()'
            if device == "gpu"
            else 'whole volume read once with read_zarr(path, prefer="cpu"), then vol[z] copied'
        )

    def open(self, path: str) -> None:
        import time

        t0 = time.perf_counter()
        if self.device == "gpu":
            from gpu_zarr.zarr_io import read_zarr_to_gpu

            self.vol = read_zarr_to_gpu(path, prefer="auto")
        else:
            from gpu_zarr.zarr_io import read_zarr

            self.vol = read_zarr(path, prefer="cpu").data
        synchronize(self.device)
        dt = time.perf_counter() - t0
        nbytes = int(self.vol.nbytes)
        self.info["load_s"] = dt
        self.info["load_gib_per_s"] = nbytes / dt / 2**30 if dt > 0 else None

    def plane(self, z: int):
        if self.device == "gpu":
            return self.vol[z].get()
        import numpy as np

        return np.array(self.vol[z])

    def close(self) -> None:
        self.vol = None
        super().close()


def browse_readers(device: str) -> list[PlaneReader]:
    """Plane readers in the order they run: the reference (zarr CPU) first."""
    if device == "cpu":
        return [
            _ZarrCpuPlanes(),
            _OursLazyPlanes("cpu", "cpu"),
            _OursEngineCpuPlanes(),
            _OursResidentPlanes("cpu"),
            _DaskPlanes(),
        ]
    return [
        _ZarrCpuPlanes(),
        _OursLazyPlanes("kvikio", "gpu"),
        _OursLazyPlanes("auto", "gpu"),
        _OursResidentPlanes("gpu"),
        _ZarrGpuPlanes(),
        _DaskPlanes(),
    ]
