"""The readers the benchmark times: ours (gpu_zarr) and the peers.

A whole-array reader is a :class:`Reader`: ``read(path)`` returns the full array
(cupy on the GPU device, numpy on the CPU device). A browsing reader is a
:class:`PlaneReader`: ``open(path)`` prepares it, ``plane(idx)`` returns the 2-D plane
at the leading index ``idx`` (or the tile, when ``idx`` ends with two slices) as host
numpy, ``close()`` releases what it holds.

Every reader opens the store read-only. GPU imports (cupy, kvikio), TensorStore and
czarr are imported inside functions only. czarr runs in a child process (its set-up
changes nvCOMP's process-wide allocator, and it may fail in any way): its result, or the
text of its failure, comes back as JSON.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "Reader",
    "PlaneReader",
    "throughput_readers",
    "browse_readers",
    "select_readers",
    "gpu_available",
    "synchronize",
    "to_host",
    "kvikio_settings",
    "fingerprint",
    "tensorstore_spec",
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


def _is_cupy(a: Any) -> bool:
    return type(a).__module__.startswith("cupy")


def to_host(a: Any) -> np.ndarray:
    """Host numpy view/copy of a cupy or numpy array."""
    if _is_cupy(a):
        return a.get()
    return np.asarray(a)


def fingerprint(a: Any, block: int = 1 << 26) -> list[int]:
    """Two position-weighted sums of ``a``'s values (cupy or numpy), computed in blocks.

    Used to check an array that comes back from another process (czarr's reader)
    against the reference without moving it: equal arrays give equal fingerprints,
    and a value moved or changed almost surely changes them.
    """
    xp: Any = np
    if _is_cupy(a):
        import cupy

        xp = cupy
    flat = a.reshape(-1)
    if flat.dtype.kind not in "biu":
        flat = flat.view(f"u{flat.dtype.itemsize}") if flat.dtype.itemsize in (1, 2, 4, 8) else flat
    s1 = 0
    s2 = 0
    mask = (1 << 64) - 1
    for start in range(0, int(flat.size), block):
        blk = flat[start:start + block].astype(xp.uint64)
        w = (xp.arange(start, start + blk.size, dtype=xp.uint64) % xp.uint64(65521)) + xp.uint64(1)
        s1 = (s1 + int(blk.sum(dtype=xp.uint64))) & mask
        s2 = (s2 + int((blk * w).sum(dtype=xp.uint64))) & mask
    return [s1, s2]


def _zarr_default_codecs() -> contextlib.AbstractContextManager[Any]:
    """zarr's own codec classes, whatever gpu_zarr registered: the peers run stock zarr."""
    import zarr

    return zarr.config.set({"codecs.zstd": "zarr.codecs.zstd.ZstdCodec"})


def _probe_import(module: str, attr: str | None = None) -> str | None:
    try:
        mod = importlib.import_module(module)
    except Exception as exc:
        return f"{module} is not importable ({type(exc).__name__}: {exc})"
    if attr is not None and getattr(mod, attr, None) is None:
        return f"{module}.{attr} does not exist in this version"
    return None


def _not_installed(module: str, hint: str) -> str | None:
    """None when ``module`` is installed (not imported), else why it is skipped."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"{module} is not installed ({hint})"


def _backend_skip(backend: str) -> str | None:
    """Why our backend cannot run here (None when it can)."""
    from gpu_zarr.capabilities import probe

    ok, why = probe().backend_status(backend)
    return None if ok else why


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
    #: when a peer's untimed warm-up runs: once per process (CPU decoders: imports and
    #: thread pools) or once per codec chain (GPU decoders: kernels, nvCOMP handles)
    warmup: str = "process"
    #: a reader that times itself elsewhere (czarr's child process): ``run(path, repeat,
    #: reference_fingerprint)`` returns the record's fields
    external: Callable[[str, int, Callable[[], list[int]]], dict[str, Any]] | None = None


def _ours_gpu(prefer: str) -> Callable[[str], Any]:
    def read(path: str) -> Any:
        from gpu_zarr.zarr_io import read_zarr_to_gpu

        return read_zarr_to_gpu(path, prefer=prefer)  # type: ignore[arg-type]

    return read


def _ours_info(prefer: str) -> Callable[[str], dict[str, Any]]:
    """Backend and reason that ``read_zarr`` reports (called once, untimed)."""

    def info(path: str) -> dict[str, Any]:
        from gpu_zarr.zarr_io import read_zarr

        res = read_zarr(path, prefer=prefer)  # type: ignore[arg-type]
        out: dict[str, Any] = {
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


def _ours_cpu(path: str) -> Any:
    from gpu_zarr.zarr_io import read_zarr

    return read_zarr(path, prefer="cpu").data


def _data(res: Any) -> Any:
    """The array of an engine read (an array, or a result object holding it in ``data``)."""
    return res if isinstance(res, np.ndarray) or _is_cupy(res) else res.data


def _ours_engine_cpu(path: str) -> Any:
    from gpu_zarr.engine import read

    return _data(read(path, device="cpu"))


def _zarr_cpu(path: str) -> Any:
    import zarr

    with _zarr_default_codecs():
        return zarr.open_array(path, mode="r")[...]


def _native_order(a: np.ndarray) -> np.ndarray:
    """``a`` in native byte order (cupy has no other): a peer's copy to the GPU pays the swap."""
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def _zarr_cpu_cupy(path: str) -> Any:
    import cupy

    return cupy.asarray(_native_order(_zarr_cpu(path)))


def _zarrs_numpy(path: str) -> Any:
    """zarr-python with zarrs-python's Rust codec pipeline (the fastest CPU whole-array reader)."""
    import zarr

    with _zarr_default_codecs(), zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}):
        return zarr.open_array(path, mode="r")[...]


#: zarr-python's own synchronous pipeline (zarr >= 3.3): codecs run in one pass per chunk on threads
_FUSED = "zarr.core.codec_pipeline.FusedCodecPipeline"


def _fused_skip() -> str | None:
    try:
        module = importlib.import_module("zarr.core.codec_pipeline")
    except ImportError as exc:
        return f"zarr is not importable: {exc}"
    return None if hasattr(module, "FusedCodecPipeline") else "this zarr-python (< 3.3) has no FusedCodecPipeline"


def _zarr_fused(path: str) -> Any:
    import zarr

    with _zarr_default_codecs(), zarr.config.set({"codec_pipeline.path": _FUSED}):
        return zarr.open_array(path, mode="r")[...]


def _zarr_fused_cupy(path: str) -> Any:
    import cupy

    return cupy.asarray(_native_order(_zarr_fused(path)))


def _zarrs_cupy(path: str) -> Any:
    import cupy

    return cupy.asarray(_native_order(_zarrs_numpy(path)))


def _zarr_gpu(path: str) -> Any:
    import zarr

    with _zarr_default_codecs(), zarr.config.enable_gpu():
        return zarr.open_array(path, mode="r")[...]


# -- TensorStore


def tensorstore_spec(path: str) -> dict[str, Any]:
    """TensorStore spec of the zarr array at ``path`` (driver ``zarr3`` or ``zarr``)."""
    p = Path(path)
    driver = "zarr3" if (p / "zarr.json").exists() else "zarr"
    return {"driver": driver, "kvstore": {"driver": "file", "path": str(p.resolve())}}


_TS_CONTEXT: Any = None


def _ts_open(path: str) -> Any:
    import tensorstore as ts

    global _TS_CONTEXT
    if _TS_CONTEXT is None:
        _TS_CONTEXT = ts.Context()  # one thread pool, no chunk cache (TensorStore's default)
    return ts.open(tensorstore_spec(path), read=True, write=False, context=_TS_CONTEXT).result()


def _tensorstore_numpy(path: str) -> Any:
    return _ts_open(path).read().result()


def _tensorstore_cupy(path: str) -> Any:
    import cupy

    return cupy.asarray(_native_order(_tensorstore_numpy(path)))


# -- kvikio GDSStore


def _gdsstore_class() -> Any:
    kz = importlib.import_module("kvikio.zarr")
    cls = getattr(kz, "GDSStore", None)
    if cls is None:
        raise ImportError("kvikio.zarr has no GDSStore")
    return cls


#: kvikio's settings before any read of this process (our engine may change them)
_KVIKIO_BASELINE: dict[str, Any] | None = None
_KVIKIO_KEYS = ("num_threads", "task_size")


def _kvikio_get(kd: Any, key: str) -> Any:
    try:
        return kd.get(key)
    except Exception:
        fn = getattr(kd, key, None) or getattr(kd, f"get_{key}", None)
        return fn() if callable(fn) else None


def _kvikio_put(kd: Any, key: str, value: Any) -> None:
    try:
        kd.set({key: value})
    except Exception:
        fn = getattr(kd, f"{key}_reset", None)
        if callable(fn):
            fn(value)


@contextlib.contextmanager
def _kvikio_settings(settings: dict[str, Any] | None) -> Iterator[None]:
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


def _kvikio_gds(path: str) -> Any:
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


# -- czarr, in a child process

#: The child: import czarr, read ``repeat + 1`` times through zarr under
#: ``czarr.configure_gpu()`` (the first read untimed), print one JSON line. Every failure
#: is caught and printed as the result.
_CZARR_CHILD = r"""
import json, sys, time, traceback
path, repeat, planes = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
out = {}
try:
    stage = "import czarr"
    import czarr, cupy, zarr
    out["czarr_version"] = getattr(czarr, "__version__", "?")
    stage = "czarr.configure_gpu()"
    with czarr.configure_gpu():
        stage = "zarr.open_array"
        arr = zarr.open_array(path, mode="r")
        if planes is None:
            stage = "first read (arr[...])"
            a = arr[...]; cupy.cuda.runtime.deviceSynchronize()
            times = []
            for _ in range(repeat):
                del a
                stage = "timed read (arr[...])"
                t0 = time.perf_counter(); a = arr[...]; cupy.cuda.runtime.deviceSynchronize()
                times.append(time.perf_counter() - t0)
            from gpu_zarr.bench.readers import fingerprint
            out.update(times=times, fingerprint=fingerprint(a), type=type(a).__module__ + "." + type(a).__name__)
        else:
            def host(a):
                get = getattr(a, "get", None)
                return get() if callable(get) else a
            def index(key):  # a tile's last two axes come as [start, stop]
                return tuple(slice(*k) if isinstance(k, list) else k for k in key)
            stage = "first plane"
            host(arr[index(planes["warm"])])
            res = {}
            for pattern, idxs in planes["patterns"].items():
                ms, fps = [], []
                for idx in idxs:
                    stage = f"{pattern} plane {idx}"
                    t0 = time.perf_counter(); p = host(arr[index(idx)])
                    ms.append((time.perf_counter() - t0) * 1e3)
                    from gpu_zarr.bench.readers import fingerprint
                    fps.append(fingerprint(p))
                res[pattern] = {"ms": ms, "fingerprints": fps}
            out["patterns"] = res
except BaseException as exc:
    out["error"] = f"{stage}: {type(exc).__name__}: {exc}"[:2000]
    out["traceback"] = traceback.format_exc(limit=6)[-3000:]
print("CZARR_RESULT " + json.dumps(out), flush=True)
"""


def _czarr_child(path: str, repeat: int, planes: dict[str, Any] | None, timeout_s: float) -> dict[str, Any]:
    """Run the czarr child; its JSON, or the way the child itself died."""
    env = dict(os.environ)
    # the child imports gpu_zarr.bench.readers (fingerprint) from wherever we run
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CZARR_CHILD, path, str(repeat), json.dumps(planes)],
            capture_output=True, text=True, timeout=timeout_s, env=env,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"czarr child process did not finish within {timeout_s:.0f} s (killed)"}
    for line in proc.stdout.splitlines():
        if line.startswith("CZARR_RESULT "):
            res: dict[str, Any] = json.loads(line[len("CZARR_RESULT "):])
            return res
    tail = (proc.stderr or proc.stdout or "").strip()[-1500:]
    return {"error": f"czarr child process exited with status {proc.returncode} and no result: {tail}"}


_CZARR_HINT = "pip install czarr[cu13]; it needs an NVIDIA GPU, nvCOMP >= 5.1, rmm and cuFile"


def _czarr_external(path: str, repeat: int, ref_fp: Callable[[], list[int]]) -> dict[str, Any]:
    res = _czarr_child(path, repeat, None, timeout_s=300)
    if "error" in res:
        return {"error": res["error"], **({"traceback": res["traceback"]} if "traceback" in res else {})}
    times = [float(t) for t in res["times"]]
    want = ref_fp()
    ok = [int(x) for x in res["fingerprint"]] == want
    return {
        "warm_s": times,
        "czarr_version": res.get("czarr_version"),
        "result_type": res.get("type"),
        "correct": ok,
        "correct_detail": "fingerprint equals zarr-cpu's" if ok else "fingerprint differs from zarr-cpu's",
    }


def _czarr_unavailable(_path: str) -> Any:  # pragma: no cover - never called: external
    raise RuntimeError("czarr runs in a child process")


# -- the lists


def throughput_readers(device: str) -> list[Reader]:
    """Readers in the order they run: the reference (zarr CPU) first, czarr last."""
    ts_skip = _not_installed("tensorstore", "pip install tensorstore, or napari-gpu-zarr[bench]")
    cz_skip = _not_installed("czarr", _CZARR_HINT)
    zarrs_skip = _not_installed("zarrs", "pip install zarrs")
    zarrs = Reader("zarrs", "peer", 'zarr-python with zarrs (codec_pipeline.path "zarrs.ZarrsCodecPipeline"), numpy',
                   _zarrs_numpy, skip_reason=zarrs_skip)
    czarr = Reader(
        "czarr", "peer",
        "czarr 0.0.1: with czarr.configure_gpu(): zarr.open_array(path)[...] (in a child process)",
        _czarr_unavailable, skip_reason=cz_skip, external=_czarr_external,
    )
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
            Reader("tensorstore", "peer", "TensorStore read (numpy)", _tensorstore_numpy, skip_reason=ts_skip),
            zarrs,
            Reader("zarr-fused", "peer", f'zarr-python with codec_pipeline.path "{_FUSED}", numpy', _zarr_fused,
                   skip_reason=_fused_skip()),
            czarr,
        ]
    gds_skip = _probe_import("kvikio.zarr", "GDSStore")
    if gds_skip is None:
        capture_kvikio_baseline()
    ours = [
        Reader(
            f"ours-{backend}",
            "ours",
            f'gpu_zarr.zarr_io.read_zarr_to_gpu(path, prefer="{backend}")',
            _ours_gpu(backend),
            skip_reason=_backend_skip(backend),
            info=_ours_info(backend),
        )
        for backend in ("kvikio", "auto", "zarr-gpu")
    ]
    return [
        Reader("zarr-cpu+cupy", "peer", "zarr CPU read, then cupy.asarray", _zarr_cpu_cupy),
        *ours,
        Reader(
            "zarr-gpu",
            "peer",
            "zarr-python with zarr.config.enable_gpu() (stock zstd codec)",
            _zarr_gpu,
            warmup="codec",
        ),
        Reader(
            "kvikio-gds",
            "peer",
            "kvikio.zarr.GDSStore + zarr.config.enable_gpu(), kvikio settings as at start",
            _kvikio_gds,
            skip_reason=gds_skip,
            info=lambda _path: {"kvikio_settings": dict(_KVIKIO_BASELINE or {})},
            warmup="codec",
        ),
        Reader(
            "tensorstore+cupy", "peer", "TensorStore read (numpy), then cupy.asarray",
            _tensorstore_cupy, skip_reason=ts_skip,
        ),
        Reader("zarrs+cupy", "peer", "zarr-python with zarrs (Rust codec pipeline), then cupy.asarray", _zarrs_cupy,
               skip_reason=zarrs_skip),
        Reader("zarr-fused+cupy", "peer", "zarr-python's FusedCodecPipeline, then cupy.asarray", _zarr_fused_cupy,
               skip_reason=_fused_skip()),
        czarr,
    ]


def select_readers(readers: list[Any], device: str, only: list[str] | None) -> list[Any]:
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


# ---------------------------------------------------------------- plane readers


class PlaneReader:
    """Reads single 2-D planes (or tiles) of one array; ``plane(idx)`` returns host numpy.

    ``idx`` is a tuple of ints over the leading axes (all but the last two), optionally
    followed by two slices (a tile of the plane: ``gpu_zarr.bench.browse.index_of``).
    """

    name = "?"
    kind = "peer"
    description = ""
    skip_reason: str | None = None

    def __init__(self) -> None:
        self.info: dict[str, Any] = {}
        self._stack = contextlib.ExitStack()

    def open(self, path: str) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def plane(self, idx: tuple[int | slice, ...]) -> np.ndarray:  # pragma: no cover - overridden
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

    def plane(self, idx: tuple[int | slice, ...]) -> np.ndarray:
        return np.asarray(self.arr[idx])


class _ZarrFusedPlanes(_ZarrCpuPlanes):
    name = "zarr-fused"
    description = f'zarr-python with codec_pipeline.path "{_FUSED}": arr[z]'

    def __init__(self) -> None:
        super().__init__()
        self.skip_reason = _fused_skip()

    def open(self, path: str) -> None:
        import zarr

        self._stack.enter_context(zarr.config.set({"codec_pipeline.path": _FUSED}))
        super().open(path)


class _ZarrGpuPlanes(PlaneReader):
    name = "zarr-gpu"
    description = "zarr-python with enable_gpu(): arr[z].get()"

    def open(self, path: str) -> None:
        import zarr

        self._stack.enter_context(_zarr_default_codecs())
        self._stack.enter_context(zarr.config.enable_gpu())
        self.arr = zarr.open_array(path, mode="r")

    def plane(self, idx: tuple[int | slice, ...]) -> np.ndarray:
        return to_host(self.arr[idx])


class _TensorStorePlanes(PlaneReader):
    name = "tensorstore"
    description = "TensorStore: ts_array[z].read().result() (numpy)"

    def __init__(self) -> None:
        super().__init__()
        self.skip_reason = _not_installed("tensorstore", "pip install tensorstore, or napari-gpu-zarr[bench]")

    def open(self, path: str) -> None:
        self.arr = _ts_open(path)

    def plane(self, idx: tuple[int | slice, ...]) -> np.ndarray:
        return np.asarray(self.arr[idx].read().result())


class _ZarrsPlanes(PlaneReader):
    name = "zarrs"
    description = 'zarr-python with zarrs (codec_pipeline.path "zarrs.ZarrsCodecPipeline"): arr[z]'

    def __init__(self) -> None:
        super().__init__()
        self.skip_reason = _not_installed("zarrs", "pip install zarrs")

    def open(self, path: str) -> None:
        import zarr

        self._stack.enter_context(_zarr_default_codecs())
        self._stack.enter_context(zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}))
        self.arr = zarr.open_array(path, mode="r")
        pipeline = type(getattr(getattr(self.arr, "_async_array", None), "codec_pipeline", None))
        self.info["codec_pipeline"] = f"{pipeline.__module__}.{pipeline.__qualname__}"
        try:
            self.info["zarrs_version"] = importlib.import_module("zarrs").__version__
        except Exception:
            pass

    def plane(self, idx: tuple[int | slice, ...]) -> np.ndarray:
        return np.asarray(self.arr[idx])


class _DaskPlanes(PlaneReader):
    name = "dask-zarr"
    description = "napari-ome-zarr's path: dask.array.from_zarr(arr)[z].compute()"

    def __init__(self) -> None:
        super().__init__()
        self.skip_reason = _not_installed("dask", "pip install dask")

    def open(self, path: str) -> None:
        import dask.array as da
        import zarr

        self._stack.enter_context(_zarr_default_codecs())
        self.arr = da.from_zarr(zarr.open_array(path, mode="r"))

    def plane(self, idx: tuple[int | slice, ...]) -> np.ndarray:
        return np.asarray(self.arr[idx].compute())


class _CzarrPlanes(PlaneReader):
    """czarr in a child process: :meth:`run_all` times every plane there."""

    name = "czarr"
    description = "czarr 0.0.1: with czarr.configure_gpu(): arr[z].get() (in a child process)"
    external = True

    def __init__(self) -> None:
        super().__init__()
        self.skip_reason = _not_installed("czarr", _CZARR_HINT)

    def run_all(self, path: str, warm: tuple[int, ...], patterns: dict[str, list[tuple[Any, ...]]]) -> dict[str, Any]:
        def key(i: tuple[Any, ...]) -> list[Any]:
            return [list(k) if isinstance(k, tuple) else k for k in i]

        plan = {"warm": list(warm), "patterns": {k: [key(i) for i in v] for k, v in patterns.items()}}
        return _czarr_child(path, 0, plan, timeout_s=300)


class _OursLazyPlanes(PlaneReader):
    kind = "ours"

    def __init__(self, backend: str) -> None:
        super().__init__()
        self.backend = backend
        self.name = f"ours-lazy-{backend}"
        self.description = f'gpu_zarr.lazy.GpuLazyArray(arr, backend="{backend}")[z] (what napari slices)'
        if backend != "cpu":
            self.skip_reason = _backend_skip(backend)

    def open(self, path: str) -> None:
        import zarr

        from gpu_zarr.lazy import GpuLazyArray

        self.arr = GpuLazyArray(zarr.open_array(path, mode="r"), backend=self.backend)

    def plane(self, idx: tuple[int | slice, ...]) -> np.ndarray:
        return np.asarray(self.arr[idx])


class _OursEngineCpuPlanes(PlaneReader):
    kind = "ours"
    name = "ours-engine-cpu"
    description = 'gpu_zarr.engine.read(arr, (z, :, :), device="cpu"): the engine\'s CPU twin'

    def open(self, path: str) -> None:
        import zarr

        self.arr = zarr.open_array(path, mode="r")

    def plane(self, idx: tuple[int | slice, ...]) -> np.ndarray:
        from gpu_zarr.engine import read

        sel = (*idx, *(slice(None),) * (self.arr.ndim - len(idx)))
        return np.asarray(_data(read(self.arr, sel, device="cpu")))


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

    def plane(self, idx: tuple[int | slice, ...]) -> np.ndarray:
        if self.device == "gpu":
            return to_host(self.vol[idx])
        return np.array(self.vol[idx])

    def close(self) -> None:
        self.vol = None
        super().close()


def browse_readers(device: str) -> list[PlaneReader]:
    """Plane readers in the order they run: the reference (zarr CPU) first, czarr last."""
    if device == "cpu":
        return [
            _ZarrCpuPlanes(),
            _OursLazyPlanes("cpu"),
            _OursEngineCpuPlanes(),
            _OursResidentPlanes("cpu"),
            _TensorStorePlanes(),
            _ZarrsPlanes(),
            _ZarrFusedPlanes(),
            _DaskPlanes(),
            _CzarrPlanes(),
        ]
    return [
        _ZarrCpuPlanes(),
        _OursLazyPlanes("kvikio"),
        _OursLazyPlanes("auto"),
        _OursResidentPlanes("gpu"),
        _ZarrGpuPlanes(),
        _TensorStorePlanes(),
        _ZarrsPlanes(),
        _ZarrFusedPlanes(),
        _DaskPlanes(),
        _CzarrPlanes(),
    ]


def error_text(exc: BaseException) -> str:
    """A failure as one line for the records: type and message, at most 2000 characters."""
    return f"{type(exc).__name__}: {exc}".strip()[:2000]


def record_failure(rec: dict[str, Any], exc: BaseException, log: Callable[[str], None], label: str) -> None:
    """Write a reader's failure into its record and the log: our backend declining an array
    (BackendUnavailable) is said, not counted as a failure; anything else is a failure."""
    import traceback

    from gpu_zarr.errors import BackendUnavailable

    if isinstance(exc, BackendUnavailable):
        rec["declined"] = error_text(exc)
        log(f"  {label} declined: {rec['declined'][:300]}")
        return
    rec["error"] = error_text(exc)
    rec["traceback"] = traceback.format_exc(limit=8)[-4000:]
    log(f"  {label} FAILED: {rec['error'][:300]}")
