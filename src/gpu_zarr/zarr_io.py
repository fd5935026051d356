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
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from gpu_zarr.capabilities import probe
from gpu_zarr.errors import (
    INSTALL_HINT,
    BackendUnavailable,
    GPUUnavailable,
    NotAZarrError,
    ReadCancelled,
    UnsupportedArrayError,
)

__all__ = [
    "Backend",
    "BackendChoice",
    "ReadResult",
    "choose_backend",
    "gpu_zarr_context",
    "last_choice",
    "open_array",
    "read_selection",
    "read_zarr",
    "read_zarr_to_gpu",
    "read_zarr_via_zarr_gpu",
]

Backend = Literal["auto", "kvikio", "zarr-gpu", "cpu"]
_BACKENDS = ("auto", "kvikio", "zarr-gpu", "cpu")
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


def open_array(path_or_array):
    """Open a zarr array read-only, with an error that helps when the path is not one.

    Parameters
    ----------
    path_or_array : str, os.PathLike or zarr.Array

    Raises
    ------
    NotAZarrError
        The path does not exist, is not a zarr array, or is a group (the message lists
        the arrays inside it).
    """
    import zarr

    if not isinstance(path_or_array, (str, os.PathLike)):
        return path_or_array
    path = Path(path_or_array)
    if not path.exists():
        raise NotAZarrError(f"{path} does not exist; expected the directory of a zarr array "
                            "(holding zarr.json or .zarray).")
    markers = [m for m in ("zarr.json", ".zarray", ".zgroup") if (path / m).exists()]
    if not markers:
        raise NotAZarrError(
            f"{path} is not a zarr array: expected a directory holding zarr.json (zarr v3) or .zarray "
            f"(zarr v2), found {'a file' if path.is_file() else 'a directory without either'}."
        )
    try:
        node = zarr.open(store=str(path), mode="r")
    except Exception as exc:
        raise NotAZarrError(f"{path} could not be opened as zarr: {type(exc).__name__}: {exc}") from exc
    if isinstance(node, zarr.Group):
        inside = sorted(k for k, _ in node.arrays())
        hint = f" It holds the arrays {', '.join(inside)}: pass one of those paths." if inside else ""
        raise NotAZarrError(f"{path} is a zarr group, not an array.{hint} For OME-Zarr images use "
                            "gpu_zarr.omezarr.read_omezarr(path, level=0).")
    return node


def choose_backend(array_or_path, prefer: Backend = "auto") -> BackendChoice:
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
    if prefer not in _BACKENDS:
        raise ValueError(f"prefer must be one of {', '.join(_BACKENDS)}; got {prefer!r}")
    if prefer == "cpu":
        return BackendChoice("cpu", "forced: numpy via zarr-python")
    caps = probe()
    if not caps.gpu:
        if prefer == "auto":
            return BackendChoice("cpu", "no usable GPU" + (f" ({caps.notes[0]})" if caps.notes else ""))
        raise GPUUnavailable(f"backend {prefer!r} needs a CUDA GPU, and none is usable here: "
                             f"{caps.backend_status(prefer)[1]}. Use prefer='cpu', or {INSTALL_HINT}.")
    if prefer == "zarr-gpu":
        return BackendChoice("zarr-gpu", "forced: " + caps.backend_status("zarr-gpu")[1])
    from gpu_zarr.engine.layout import layout_of

    arr = open_array(array_or_path)
    try:
        lay = layout_of(arr)
        if arr.ndim == 0:
            raise UnsupportedArrayError("the direct (kvikio) engine reads arrays with at least one "
                                        "dimension; this one is 0-dimensional. Use prefer='zarr-gpu'.")
        if lay.codec == "zstd" and not caps.nvcomp:
            raise UnsupportedArrayError(
                f"this array is zstd-compressed and nvCOMP is not installed, so the direct engine "
                f"cannot decode it on the GPU: {INSTALL_HINT}")
    except UnsupportedArrayError as exc:
        if prefer == "kvikio":
            raise
        return BackendChoice("zarr-gpu", f"direct engine cannot serve: {exc}")
    what = ("zstd" if lay.codec == "zstd" else "uncompressed") + f" zarr v{lay.zarr_format}" + (
        ", sharded" if lay.sharded else "")
    status = caps.backend_status("kvikio")[1]
    tag = "forced" if prefer == "kvikio" else "fastest path"
    return BackendChoice("kvikio", f"{tag}: {what}; {status}")


@contextlib.contextmanager
def gpu_zarr_context() -> Iterator[None]:
    """Context manager that puts zarr into GPU mode for arbitrary slice reads.

    Inside it, ``zarr.open_array(...)[...]`` returns ``cupy.ndarray`` and zstd chunks are
    decoded by nvCOMP (:class:`gpu_zarr.nvcomp_zstd.NvcompZstdCodec`) when it is installed.
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

    overrides = gpu_zstd_config() if register_nvcomp_zstd() else {}
    with zarr.config.enable_gpu(), zarr.config.set(overrides):
        yield


def read_zarr_via_zarr_gpu(array_path):
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


def _zarr_gpu_read(arr, selection):
    import zarr

    meta = arr.metadata
    if (meta.zarr_format == 2 and (meta.compressor is not None or meta.filters)) or _big_endian(arr):
        # zarr-python 3.4's GPU buffers fail here: v2 compressors get device buffers numcodecs
        # cannot read, and big-endian data come back with their bytes unswapped.
        # Decode on the host, then one copy to the device.
        import cupy

        return cupy.asarray(_native(np.asarray(arr[selection])))
    with gpu_zarr_context():
        a = zarr.open_array(store=arr.store, path=arr.path, mode="r") if arr.store is not None else arr
        out = a[selection]
    import cupy

    if not isinstance(out, cupy.ndarray):
        out = cupy.asarray(_native(np.asarray(out)))
    elif not out.dtype.isnative:
        out = out.astype(out.dtype.newbyteorder("="))
    return out


def _big_endian(arr) -> bool:
    if arr.dtype.byteorder == ">":
        return True
    for codec in getattr(arr.metadata, "codecs", ()):
        inner = getattr(codec, "codecs", ())  # sharding
        for c in (codec, *inner):
            if type(c).__name__ == "BytesCodec" and getattr(c.endian, "value", c.endian) == "big":
                return True
    return False


def _native(a: np.ndarray) -> np.ndarray:
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


# -- progress and interrupts (gpu_zarr.progress): begin --------------------------------------
def read_selection(array_or_path, selection=Ellipsis, *, prefer: Backend = "auto", options=None,
                   progress="auto", cancel=None) -> ReadResult:
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

    Notes
    -----
    An interrupted read (KeyboardInterrupt, e.g. a notebook's kernel interrupt, or a cancel)
    stops at its next batch, waits for the reads in flight, frees its partial buffers and
    re-raises.
    """
    from gpu_zarr.progress import progress_callback, release_after_interrupt

    try:
        with progress_callback(progress) as callback:
            return _read_selection(array_or_path, selection, prefer=prefer, options=options,
                                   progress=callback, cancel=cancel)
    except (KeyboardInterrupt, ReadCancelled) as exc:
        release_after_interrupt(exc)
        raise
# -- progress and interrupts: end -------------------------------------------------------------


def _read_selection(array_or_path, selection=Ellipsis, *, prefer: Backend = "auto", options=None,
                    progress=None, cancel=None) -> ReadResult:
    arr = open_array(array_or_path)
    choice = choose_backend(arr, prefer)
    if cancel is not None and cancel.is_set():
        raise ReadCancelled("read cancelled before it started")
    stats: dict = {}
    t0 = time.perf_counter()
    if choice.backend == "kvikio":
        from gpu_zarr.engine import EngineOptions, last_read_stats, read

        opts = options or EngineOptions()
        if progress is not None or cancel is not None:
            opts = EngineOptions(**{**opts.__dict__, "progress": progress or opts.progress,
                                    "cancel": cancel or opts.cancel})
        try:
            data = read(arr, selection, device="gpu", options=opts)
            stats = last_read_stats() or {}
        except UnsupportedArrayError as exc:
            if prefer == "kvikio":
                raise
            choice = BackendChoice("zarr-gpu", f"direct engine cannot serve: {exc}")
            data = _zarr_gpu_read(arr, selection)
    elif choice.backend == "zarr-gpu":
        data = _in_slabs(arr, selection, lambda sel: _zarr_gpu_read(arr, sel), "gpu", progress, cancel)
    else:
        data = _in_slabs(arr, selection, lambda sel: _native(np.asarray(arr[sel])), "cpu", progress, cancel)
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


def _in_slabs(arr, selection, read, device: str, progress, cancel, parts: int = 16):
    """``read(selection)`` in chunk-aligned slabs along the first axis, so that zarr-python
    reads report progress and can be cancelled between slabs. Without a progress callback
    or cancel event it is one plain read."""
    if progress is None and cancel is None or arr.ndim == 0:
        return read(selection)
    from gpu_zarr.engine.plan import normalize_selection

    region = normalize_selection(tuple(arr.shape), selection)
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


def read_zarr(array_or_path, *, prefer: Backend = "auto", options=None, progress="auto", cancel=None) -> ReadResult:
    """Read a whole array with the chosen backend and measure it (see :func:`read_selection`)."""
    return read_selection(array_or_path, Ellipsis, prefer=prefer, options=options, progress=progress,
                          cancel=cancel)


def read_zarr_to_gpu(array_path, *, prefer: Backend = "auto"):
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
