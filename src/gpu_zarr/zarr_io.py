"""High-level zarr -> GPU loading with automatic backend selection.

Public entry points:

- :func:`read_zarr_to_gpu` — load an entire zarr array onto the GPU by the fastest path.
- :func:`gpu_zarr_context` — a context in which zarr-python returns cupy arrays and decodes
  zstd with nvCOMP, for tile-by-tile work.
- :func:`choose_backend` — which backend would serve an array here, and why.
- :func:`read_zarr` / :func:`read_selection` — a read with its measurements (backend,
  reason, bytes, seconds, GiB/s, GPU memory), as the CLI and the napari widget show them.

Backends (``prefer``):

- ``"kvikio"`` — the direct engine (:mod:`gpu_zarr.engine`): chunk and shard bytes read by
  many threads (kvikio's pool, GDS native where the system has it, POSIX compat mode
  otherwise), one nvCOMP batched zstd decode per batch, one scatter kernel per batch.
  Uncompressed or zstd arrays, zarr v2 and v3, sharded or not.
- ``"zarr-gpu"`` — zarr-python with ``zarr.config.enable_gpu()`` and our nvCOMP zstd codec;
  reads any array zarr can read.
- ``"cpu"`` — numpy via zarr-python (beyond the seed; for machines with no GPU).
- ``"auto"`` — the direct engine when the array and machine allow, zarr-gpu otherwise, cpu
  when there is no GPU; the choice and its reason are recorded.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_zarr import settings
from gpu_zarr.backends import BACKENDS, Backend, check_backend
from gpu_zarr.capabilities import probe
from gpu_zarr.engine.fit import check_fits
from gpu_zarr.engine.layout import Layout, layout_of
from gpu_zarr.engine.pipeline import EngineOptions
from gpu_zarr.engine.plan import Region, normalize_selection
from gpu_zarr.errors import (
    INSTALL_HINT,
    BackendUnavailable,
    GPUUnavailable,
    GpuZarrError,
    ReadCancelled,
    UnsupportedArrayError,
)
from gpu_zarr.store import open_array

if TYPE_CHECKING:
    from gpu_zarr.progress import ProgressArg

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendChoice",
    "PreparedArray",
    "ReadResult",
    "choose_backend",
    "gpu_zarr_context",
    "last_choice",
    "open_array",
    "prepare",
    "read_region",
    "read_selection",
    "read_zarr",
    "read_zarr_to_gpu",
    "read_zarr_via_zarr_gpu",
]

GiB = 1 << 30


@dataclass(frozen=True)
class BackendChoice:
    """The backend that serves (or would serve) a read, and why."""

    backend: str
    reason: str

    def __str__(self) -> str:
        return f"{self.backend} ({self.reason})"


@dataclass
class ReadResult:
    """A finished read and what was measured.

    Attributes
    ----------
    data : cupy.ndarray or numpy.ndarray
    backend, reason : str
        Backend that served the read and why it was chosen.
    nbytes : int
        Decoded bytes returned.
    seconds : float
        Wall time of the read, device synchronised.
    gib_per_s : float
    gpu_bytes : int
        Device memory the result occupies (0 on the CPU path).
    stats : dict
        Per-stage timings of the direct engine (empty for other backends).
    """

    data: Any
    backend: str
    reason: str
    nbytes: int
    seconds: float
    gib_per_s: float
    gpu_bytes: int
    stats: dict = field(default_factory=dict)

    # notebook display (gpu_zarr.reprs): never touches the data
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from gpu_zarr import reprs

        return reprs.bundle(reprs.read_result_text(self), reprs.read_result_html(self))

    def _repr_html_(self) -> str:
        from gpu_zarr import reprs

        return reprs.read_result_html(self)


_last = threading.local()


def last_choice() -> BackendChoice | None:
    """The backend choice of this thread's most recent read (None before the first)."""
    return getattr(_last, "choice", None)


def _what(lay: Layout) -> str:
    from gpu_zarr.kvikio_zarr import describe

    return describe(lay)


def _decide(arr: Any, prefer: str) -> tuple[BackendChoice, Layout | None]:
    """The backend for ``arr`` and, for the direct engine, its layout (parsed once)."""
    check_backend(prefer)
    if prefer == "cpu":
        return BackendChoice("cpu", "forced: numpy via zarr-python"), None
    caps = probe()
    if not caps.gpu:
        if prefer == "auto":
            return BackendChoice("cpu", "no usable GPU" + (f" ({caps.notes[0]})" if caps.notes else "")), None
        raise GPUUnavailable(f"backend {prefer!r} needs a CUDA GPU, and none is usable here: "
                             f"{caps.backend_status(prefer)[1]}. Use prefer='cpu', or {INSTALL_HINT}.")
    if prefer == "zarr-gpu":
        return BackendChoice("zarr-gpu", "forced: " + caps.backend_status("zarr-gpu")[1]), None
    try:
        lay = layout_of(arr)
        if arr.ndim == 0:
            raise UnsupportedArrayError("the direct (kvikio) engine reads arrays with at least one "
                                        "dimension; this one is 0-dimensional. Use prefer='zarr-gpu'.")
        if lay.codec != "raw" and not caps.nvcomp:
            raise UnsupportedArrayError(
                f"this array is {lay.codec}-compressed and nvCOMP is not installed, so the direct engine "
                f"cannot decode it on the GPU: {INSTALL_HINT}")
    except UnsupportedArrayError as exc:
        if prefer == "kvikio":
            raise
        return BackendChoice("zarr-gpu", f"direct engine cannot serve: {exc}"), None
    status = caps.backend_status("kvikio")[1]
    tag = "forced" if prefer == "kvikio" else "fastest path"
    return BackendChoice("kvikio", f"{tag}: {_what(lay)}; {status}"), lay


def choose_backend(array_or_path: Any, prefer: Backend = "auto") -> BackendChoice:
    """Decide which backend serves this array on this machine, and say why.

    Parameters
    ----------
    array_or_path : zarr.Array or path
    prefer : {"auto", "kvikio", "zarr-gpu", "cpu"}

    Returns
    -------
    BackendChoice

    Raises
    ------
    ValueError
        ``prefer`` is not a backend name.
    BackendUnavailable, GPUUnavailable, UnsupportedArrayError
        A forced backend cannot serve (no GPU, kvikio engine cannot read the codec...).
    """
    check_backend(prefer)
    arr = None if prefer in ("cpu", "zarr-gpu") else open_array(array_or_path)
    return _decide(arr, prefer)[0]


class PreparedArray:
    """An array with its backend chosen once (and, for the direct engine, its layout).

    Lazy arrays and the CLI read many regions of one array: preparing it once spares
    re-choosing the backend and re-parsing the metadata for every tile.

    Attributes
    ----------
    array : zarr.Array
    prefer : str
    choice : BackendChoice
    layout : Layout or None
    """

    def __init__(self, array: Any, prefer: Backend = "auto") -> None:
        self.array = open_array(array)
        self.prefer = check_backend(prefer)
        self.choice, self.layout = _decide(self.array, self.prefer)

    @property
    def backend(self) -> str:
        return self.choice.backend

    def __repr__(self) -> str:
        return f"PreparedArray({self.array.store_path}, backend={self.choice})"

    def small_read_bytes(self, region: Region) -> int | None:
        """Decoded bytes of the chunks a read touches when it is small enough to decode on CPU
        threads rather than pay nvCOMP's per-call latency (``settings`` ``small_read``); else None."""
        lay, limit = self.layout, settings.get("small_read")
        if self.choice.backend != "kvikio" or lay is None or lay.codec == "raw" or not limit:
            return None
        chunks = 1
        for a, b, c in zip(region.start, region.stop, lay.inner_shape):
            if b <= a:
                return None
            chunks *= (b - 1) // c - a // c + 1
        touched = chunks * lay.inner_nbytes
        return touched if touched <= limit else None

    def read(self, selection: Any = Ellipsis, *, options: EngineOptions | None = None,
             progress: Callable[[int, int], None] | None = None, cancel: Any = None,
             where: str = "device") -> ReadResult:
        """Read ``array[selection]`` with the prepared backend and measure it (see :func:`read_selection`).

        ``where="host"`` says the caller wants host memory (a viewer): a small read then
        returns the CPU-decoded numpy array without a round trip through the GPU.
        """
        arr, choice = self.array, self.choice
        region = normalize_selection(tuple(int(s) for s in arr.shape), selection)
        if cancel is not None and cancel.is_set():
            raise ReadCancelled("read cancelled before it started")
        stats: dict = {}
        t0 = time.perf_counter()
        small = self.small_read_bytes(region)
        if small is not None:
            from gpu_zarr.engine import read as engine_read
            from gpu_zarr.engine.ops import CpuOps
            from gpu_zarr.engine.runtime import get_runtime

            # decoded chunkwise on CPU threads; with ``cache`` (viewers) the decoded chunks are kept
            # in the runtime's host chunk cache, so the next planes of thick chunks are copies
            opts = (options or EngineOptions()).with_(reader="threads", progress=progress, cancel=cancel)
            ops = CpuOps(get_runtime().pool("cpu-decode", opts.threads), opts.threads, fast=True)
            res = engine_read(arr, selection, device="cpu", options=opts, layout=self.layout, ops=ops)
            data, stats = res.data, res.stats
            on_gpu = where != "host"
            if on_gpu:
                import cupy

                data = cupy.asarray(data)
            choice = BackendChoice(choice.backend, f"{choice.reason}; small read ({small / (1 << 20):.1f} MiB of "
                                   f"chunks): decoded on {opts.threads} CPU threads"
                                   + (", one copy to the GPU" if on_gpu else ", returned in host memory"))
            stats["small_read"] = True
        elif choice.backend == "kvikio":
            from gpu_zarr.kvikio_zarr import read_with_stats

            opts = options or EngineOptions()
            if progress is not None or cancel is not None:
                opts = opts.with_(progress=progress or opts.progress, cancel=cancel or opts.cancel)
            try:
                res = read_with_stats(arr, selection, layout=self.layout, options=opts)
                data, stats = res.data, res.stats
            except UnsupportedArrayError as exc:
                if self.prefer == "kvikio":
                    raise
                # the engine found something it cannot serve: zarr-gpu from now on
                self.choice, self.layout = BackendChoice("zarr-gpu", f"direct engine cannot serve: {exc}"), None
                return self.read(selection, options=options, progress=progress, cancel=cancel, where=where)
        else:
            device = "gpu" if choice.backend == "zarr-gpu" else "cpu"
            nbytes = int(np.prod(region.box_shape, dtype=np.int64)) * np.dtype(arr.dtype).itemsize
            check_fits(nbytes, 0 if region.is_box else nbytes, device=device,
                       what=f"reading {region.out_shape} {arr.dtype} of {arr.store_path}")
            zarr_read = (lambda sel: _zarr_gpu_read(arr, sel)) if device == "gpu" else (
                lambda sel: to_native_order(np.asarray(arr[sel])))

            def read(sel: Any) -> Any:
                try:
                    return zarr_read(sel)
                except GpuZarrError:
                    raise
                except Exception as exc:  # noqa: BLE001 - re-raised, with the chunk named when we can
                    raise _name_the_chunk(arr, sel, exc) from exc
            data = _in_slabs(arr, region, selection, read, device, progress, cancel)
        if hasattr(data, "__cuda_array_interface__"):
            import cupy

            cupy.cuda.get_current_stream().synchronize()
            gpu_bytes = int(data.nbytes)
        else:
            gpu_bytes = 0
        seconds = time.perf_counter() - t0
        nbytes = int(data.nbytes)
        _last.choice = choice
        return ReadResult(data, choice.backend, choice.reason, nbytes, seconds,
                          nbytes / GiB / seconds if seconds > 0 else float("inf"), gpu_bytes, stats)


def _name_the_chunk(arr: Any, selection: Any, exc: Exception) -> Exception:
    """zarr-python's own message names no chunk ("Zstd decompression error: invalid input
    data"): find the chunk with the engine's CPU twin, which checks and decodes chunk by
    chunk and names the first bad one. Anything else is returned as it was."""
    from gpu_zarr.engine import read as engine_read
    from gpu_zarr.errors import CorruptChunkError

    try:
        engine_read(arr, selection, device="cpu", options=EngineOptions(reader="threads"))
    except CorruptChunkError as found:
        return CorruptChunkError(f"{arr.store_path}: {found} (zarr-python reported: {type(exc).__name__}: {exc})")
    except Exception:  # noqa: BLE001 - the twin cannot tell either (e.g. a codec it has no stage for)
        pass
    return exc


def prepare(array_or_path: Any, prefer: Backend = "auto") -> PreparedArray:
    """Open an array read-only and choose its backend once (see :class:`PreparedArray`)."""
    return PreparedArray(array_or_path, prefer)


@contextlib.contextmanager
def gpu_zarr_context() -> Iterator[None]:
    """Context manager that puts zarr into GPU mode for arbitrary slice reads.

    Inside it, ``zarr.open_array(...)[...]`` returns ``cupy.ndarray``; zstd chunks of zarr v3
    arrays are decoded by nvCOMP (:class:`gpu_zarr.nvcomp_zstd.NvcompZstdCodec`) and zarr v2
    chunks (zstd, Blosc, gzip, zlib) by the engine's codec stages on the GPU
    (:mod:`gpu_zarr.zarr_v2_gpu`); other numcodecs codecs round-trip through the host with
    one warning that names them.
    The previous zarr configuration is restored on exit, on exceptions and when nested.

    Examples
    --------
    >>> from gpu_zarr.zarr_io import gpu_zarr_context
    >>> from gpu_zarr.omezarr import read_omezarr
    >>> with gpu_zarr_context():
    ...     vol, _ = read_omezarr(path, level=0)
    ...     for tile_region in regions:
    ...         tile_gpu = vol[tile_region]  # already cupy

    Raises
    ------
    RuntimeError
        If zarr is unavailable (:class:`GPUUnavailable`, a RuntimeError, without a GPU).
    """
    try:
        import zarr
    except ImportError as exc:
        raise RuntimeError("gpu_zarr_context needs zarr-python: pip install 'zarr>=3.1'") from exc
    caps = probe()
    if not caps.gpu:
        raise GPUUnavailable("gpu_zarr_context needs a CUDA GPU: "
                             f"{caps.backend_status('zarr-gpu')[1]}. Read on the CPU instead, or {INSTALL_HINT}.")
    from gpu_zarr.nvcomp_zstd import gpu_zstd_config, register_nvcomp_zstd
    from gpu_zarr.zarr_v2_gpu import gpu_v2_decoding

    overrides = gpu_zstd_config() if register_nvcomp_zstd() else {}
    with zarr.config.enable_gpu(), zarr.config.set(overrides), gpu_v2_decoding():
        yield


def read_zarr_via_zarr_gpu(array_path: Any) -> Any:
    """Load a zarr array onto the GPU using ``zarr.config.enable_gpu()``.

    Works for any array zarr can read; zstd is decoded by nvCOMP when installed.

    Parameters
    ----------
    array_path : str or pathlib.Path
        Path to the zarr array directory.

    Returns
    -------
    cupy.ndarray
    """
    return _zarr_gpu_read(open_array(array_path), Ellipsis)


def _zarr_gpu_read(arr: Any, selection: Any) -> Any:
    import zarr

    meta = arr.metadata
    if (meta.zarr_format == 2 and (meta.compressor is not None or meta.filters)) or _big_endian(arr):
        # zarr-python 3.4's GPU buffers fail here: v2 compressors get device buffers numcodecs
        # cannot read, and big-endian data come back with their bytes unswapped.
        # Decode on the host, then one copy to the device.
        import cupy

        return cupy.asarray(to_native_order(np.asarray(arr[selection])))
    with gpu_zarr_context():
        a = zarr.open_array(store=arr.store, path=arr.path, mode="r") if arr.store is not None else arr
        out = a[selection]
    import cupy

    if not isinstance(out, cupy.ndarray):
        out = cupy.asarray(to_native_order(np.asarray(out)))
    elif not out.dtype.isnative:
        out = out.astype(out.dtype.newbyteorder("="))
    return out


def _big_endian(arr: Any) -> bool:
    if arr.dtype.byteorder == ">":
        return True
    for codec in getattr(arr.metadata, "codecs", ()):
        inner = getattr(codec, "codecs", ())  # sharding
        for c in (codec, *inner):
            if type(c).__name__ == "BytesCodec" and getattr(c.endian, "value", c.endian) == "big":
                return True
    return False


def to_native_order(a: np.ndarray) -> np.ndarray:
    """``a`` with its values in native byte order (a copy only when it is not)."""
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


# -- progress and interrupts (gpu_zarr.progress): begin --------------------------------------
def read_selection(array_or_path: Any, selection: Any = Ellipsis, *, prefer: Backend = "auto",
                   options: EngineOptions | None = None, progress: ProgressArg = "auto",
                   cancel: Any = None) -> ReadResult:
    """Read ``array[selection]`` with the chosen backend and measure it.

    Parameters
    ----------
    array_or_path : zarr.Array or path
    selection : basic index
    prefer : {"auto", "kvikio", "zarr-gpu", "cpu"}
    options : gpu_zarr.engine.EngineOptions, optional
    progress : callable, bool, "auto" or None
        ``progress(done_bytes, total_bytes)``; ``"auto"`` (default) shows a bar (notebook
        or terminal) for reads longer than about a second, ``True`` always, ``False`` /
        ``None`` never; ``GPU_ZARR_PROGRESS=0`` turns "auto" off (see :mod:`gpu_zarr.progress`).
    cancel : object with ``is_set()``, optional

    Returns
    -------
    ReadResult

    Raises
    ------
    OutOfGPUMemory, OutOfHostMemory
        The result does not fit (checked before anything is allocated, on every backend).

    Notes
    -----
    An interrupted read (KeyboardInterrupt, e.g. a notebook's kernel interrupt, or a cancel)
    stops at its next batch, waits for the reads in flight, frees its partial buffers and
    re-raises.
    """
    from gpu_zarr.progress import progress_callback, release_after_interrupt

    try:
        with progress_callback(progress) as callback:
            return PreparedArray(array_or_path, prefer).read(selection, options=options, progress=callback,
                                                             cancel=cancel)
    except (KeyboardInterrupt, ReadCancelled) as exc:
        release_after_interrupt(exc)
        raise
# -- progress and interrupts: end -------------------------------------------------------------


def read_region(array: Any, selection: Any = Ellipsis, *, backend: Backend = "auto",
                options: EngineOptions | None = None) -> Any:
    """Read ``array[selection]`` through a backend.

    Parameters
    ----------
    array : zarr.Array or path
        Opened read-only (a path is opened read-only).
    selection : basic index
        Integers, slices (any step) and Ellipsis, as numpy.
    backend : {"auto", "kvikio", "zarr-gpu", "cpu"}
        "kvikio" is the direct engine; "auto" picks as :func:`choose_backend`.
    options : EngineOptions, optional
        Engine knobs (direct engine only).

    Returns
    -------
    cupy.ndarray or numpy.ndarray
        cupy for GPU backends, numpy for "cpu"; equal to ``array[selection]``.
    """
    return read_selection(array, selection, prefer=backend, options=options, progress=None).data


def _in_slabs(arr: Any, region: Region, selection: Any, read: Callable[[Any], Any], device: str,
              progress: Callable[[int, int], None] | None, cancel: Any, parts: int = 16) -> Any:
    """``read(selection)`` in chunk-aligned slabs along the first axis, so that zarr-python
    reads report progress and can be cancelled between slabs. Without a progress callback
    or cancel event it is one plain read."""
    if progress is None and cancel is None or arr.ndim == 0:
        return read(selection)
    box = region.box_shape
    total = int(np.prod(region.out_shape, dtype=np.int64)) * np.dtype(arr.dtype).itemsize
    outer = (getattr(arr, "shards", None) or arr.chunks)[0]
    z0, z1 = region.start[0], region.stop[0]
    step = max(outer, -(-(z1 - z0) // parts) // outer * outer)
    rest = tuple(slice(a, b) for a, b in zip(region.start[1:], region.stop[1:]))
    out = None
    edges = [z0] + [e for e in range((z0 // step + 1) * step, z1, step)] + [z1]
    for a, b in zip(edges[:-1], edges[1:]):
        if cancel is not None and cancel.is_set():
            raise ReadCancelled("read cancelled: the partial result was discarded")
        slab = read((slice(a, b),) + rest)
        if out is None:
            if device == "gpu":
                import cupy

                out = cupy.empty(box, slab.dtype)
            else:
                out = np.empty(box, slab.dtype)
        out[a - z0:b - z0] = slab
        if progress is not None:
            progress(min(total, total * (b - z0) // max(z1 - z0, 1)), total)
    if out is None:  # empty selection
        return read(selection)
    return out if region.is_box else out[region.post].copy()


def read_zarr(array_or_path: Any, *, prefer: Backend = "auto", options: EngineOptions | None = None,
              progress: ProgressArg = "auto", cancel: Any = None) -> ReadResult:
    """Read a whole array with the chosen backend and measure it (see :func:`read_selection`)."""
    return read_selection(array_or_path, Ellipsis, prefer=prefer, options=options, progress=progress,
                          cancel=cancel)


def read_zarr_to_gpu(array_path: Any, *, prefer: Backend = "auto") -> Any:
    """Load a zarr array onto the GPU using the fastest available path.

    Parameters
    ----------
    array_path : str or pathlib.Path
        Path to the zarr array directory (a ``zarr.Array`` is accepted too).
    prefer : {"auto", "kvikio", "zarr-gpu"}
        ``"auto"`` (default) picks the direct engine when the array and machine allow and
        zarr-gpu otherwise; forcing a path raises if it cannot serve this array.

    Returns
    -------
    cupy.ndarray
        Device-resident array of the array's shape; dtype as zarr's, in native byte order.

    Raises
    ------
    GPUUnavailable
        No usable CUDA GPU (the message says how to install one's libraries, or to read
        with ``read_zarr(path, prefer="cpu")``).
    BackendUnavailable
        A forced backend cannot serve this array.
    OutOfGPUMemory
        The array does not fit in free GPU memory (nothing is allocated).

    Notes
    -----
    The choice made is available from :func:`last_choice` and beforehand from
    :func:`choose_backend`. On a machine without nvidia-fs, kvikio runs in POSIX compat
    mode; the direct engine is still the fastest path there because it reads with many
    threads and decodes on the GPU.
    """
    if prefer == "cpu":
        raise BackendUnavailable("read_zarr_to_gpu returns a GPU array; for numpy use "
                                 "gpu_zarr.zarr_io.read_zarr(path, prefer='cpu').")
    caps = probe()
    if not caps.gpu:
        raise GPUUnavailable(
            "read_zarr_to_gpu needs a CUDA GPU, and none is usable here ("
            + (caps.notes[0] if caps.notes else "no device") + f"). Install the GPU libraries with {INSTALL_HINT}, "
            "or read into host memory with gpu_zarr.zarr_io.read_zarr(path, prefer='cpu')."
        )
    return read_selection(array_path, Ellipsis, prefer=prefer).data
