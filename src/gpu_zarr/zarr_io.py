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
  Raw, zstd, Blosc, gzip and zlib arrays, zarr v2 and v3, sharded or not.
- ``"zarr-gpu"`` — zarr-python with ``zarr.config.enable_gpu()`` and our codec pipeline
  (:mod:`gpu_zarr.zarr_gpu`: the engine's batched GPU decoders, every chunk's size checked);
  reads any array zarr can read.
- ``"cpu"`` — numpy: the engine's native host path where it serves the array, else zarr-python
  (beyond the seed; for machines with no GPU).
- ``"auto"`` — the direct engine when the array and machine allow, zarr-gpu otherwise, cpu
  when there is no GPU; the choice and its reason are recorded.

Every function that takes a path also takes a URL (``http(s)://``, ``s3://``, ``gs://``) and
the keyword ``storage_options``: the remote store's options (credentials, endpoint, ``anon``,
requests in flight; see :mod:`gpu_zarr.location`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_zarr import capabilities
from gpu_zarr.backends import (
    BACKENDS,
    Backend,
    BackendChoice,
    EngineBackend,
    ReadBackend,
    ZarrGpuBackend,
    check_backend,
    choose,
)
from gpu_zarr.engine.layout import Layout
from gpu_zarr.engine.pipeline import EngineOptions
from gpu_zarr.engine.plan import Region, normalize_selection
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.errors import (
    INSTALL_HINT,
    BackendUnavailable,
    GPUUnavailable,
    NotAZarrError,
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
    "open_image_or_array",
    "prepare",
    "read_region",
    "read_selection",
    "read_zarr",
    "read_zarr_to_gpu",
    "read_zarr_via_zarr_gpu",
]

GiB = 1 << 30


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


def last_choice() -> BackendChoice | None:
    """The backend choice of this thread's most recent read through the process's runtime (None
    before the first)."""
    return getattr(get_runtime().last, "choice", None)


def choose_backend(array_or_path: Any, prefer: Backend = "auto", *,
                   storage_options: Mapping[str, Any] | None = None) -> BackendChoice:
    """Decide which backend serves this array on this machine, and say why.

    Parameters
    ----------
    array_or_path : zarr.Array or path
    prefer : {"auto", "kvikio", "zarr-gpu", "cpu"}
    storage_options : mapping, optional
        Options of a remote store (see :mod:`gpu_zarr.location`).

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
    arr = None if prefer == "zarr-gpu" else open_image_or_array(array_or_path, storage_options)
    return choose(arr, prefer, capabilities.probe())[1]


def open_image_or_array(array_or_path: Any, storage_options: Mapping[str, Any] | None = None) -> Any:
    """A zarr array, read-only; an OME-Zarr image's path gives its full-resolution level (level 0).

    What ``gpu-zarr read IMAGE`` reads, so that the library and the command agree on OME roots;
    :func:`gpu_zarr.omezarr.read_omezarr` picks another level. Any other group is refused by
    :func:`open_array` with the arrays it holds.
    """
    try:
        return open_array(array_or_path, storage_options)
    except NotAZarrError:
        from gpu_zarr.omezarr import is_ome_zarr, open_ome

        if not isinstance(array_or_path, (str, os.PathLike)) or not is_ome_zarr(array_or_path, storage_options):
            raise
        return open_ome(array_or_path, with_labels=False, storage_options=storage_options).open_level(0)


class PreparedArray:
    """An array with its backend chosen once (and, for the direct engine, its layout).

    Lazy arrays and the CLI read many regions of one array: preparing it once spares
    re-choosing the backend and re-parsing the metadata for every tile. The backend is
    chosen when the array is prepared and never changed by a read, so one prepared array
    can serve napari's threads at once.

    Attributes
    ----------
    array : zarr.Array
    prefer : str
    choice : BackendChoice
    backend_impl : ReadBackend
        The backend object that serves the reads.
    layout : Layout or None

    ``storage_options`` are the remote store's options when ``array`` is a URL (see
    :mod:`gpu_zarr.location`).
    """

    def __init__(self, array: Any, prefer: Backend = "auto", *, runtime: Any = None,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.array = open_image_or_array(array, storage_options)
        self.prefer = check_backend(prefer)
        self.backend_impl, self.choice = choose(self.array, self.prefer, capabilities.probe(), runtime)
        self._runtime = runtime
        # what serves a read the engine finds it cannot serve after all ("auto" only)
        self._fallback: ReadBackend | None = ZarrGpuBackend() if (
            self.prefer == "auto" and isinstance(self.backend_impl, EngineBackend)) else None

    @property
    def backend(self) -> str:
        return self.choice.backend

    @property
    def layout(self) -> Layout | None:
        return self.backend_impl.layout

    def __repr__(self) -> str:
        return f"PreparedArray({self.array.store_path}, backend={self.choice})"

    def small_read_bytes(self, region: Region) -> int | None:
        """Decoded bytes of the chunks a read touches when it is small enough to decode on CPU
        threads rather than pay nvCOMP's per-call latency (``settings`` ``small_read``); else None."""
        return self.backend_impl.small_read_bytes(region)

    def read(self, selection: Any = Ellipsis, *, options: EngineOptions | None = None,
             progress: Callable[[int, int], None] | None = None, cancel: Any = None,
             where: str = "device") -> ReadResult:
        """Read ``array[selection]`` with the prepared backend and measure it (see :func:`read_selection`).

        ``where="host"`` says the caller wants host memory (a viewer): a small read then
        returns the CPU-decoded numpy array without a round trip through the GPU.
        """
        arr, choice, impl = self.array, self.choice, self.backend_impl
        region = normalize_selection(tuple(int(s) for s in arr.shape), selection)
        if cancel is not None and cancel.is_set():
            raise ReadCancelled("read cancelled before it started")
        t0 = time.perf_counter()
        kw = {"options": options, "progress": progress, "cancel": cancel, "where": where}
        try:
            data, stats, more = impl.read(arr, region, selection, **kw)
        except UnsupportedArrayError as exc:
            if self._fallback is None:
                raise
            data, stats, more = self._fallback.read(arr, region, selection, **kw)
            choice = BackendChoice(self._fallback.name, f"direct engine cannot serve this read: {exc}")
        if more:
            choice = BackendChoice(choice.backend, choice.reason + more)
        if hasattr(data, "__cuda_array_interface__"):
            import cupy

            cupy.cuda.get_current_stream().synchronize()
            gpu_bytes = int(data.nbytes)
        else:
            gpu_bytes = 0
        seconds = time.perf_counter() - t0
        nbytes = int(data.nbytes)
        (self._runtime or get_runtime()).last.choice = choice
        return ReadResult(data, choice.backend, choice.reason, nbytes, seconds,
                          nbytes / GiB / seconds if seconds > 0 else float("inf"), gpu_bytes, stats)


def prepare(array_or_path: Any, prefer: Backend = "auto", *,
            storage_options: Mapping[str, Any] | None = None) -> PreparedArray:
    """Open an array read-only and choose its backend once (see :class:`PreparedArray`).

    ``storage_options``: options of a remote store (see :mod:`gpu_zarr.location`)."""
    return PreparedArray(array_or_path, prefer, storage_options=storage_options)


@contextlib.contextmanager
def gpu_zarr_context() -> Iterator[None]:
    """Context manager that puts zarr into GPU mode for arbitrary slice reads.

    Inside it, ``zarr.open_array(...)[...]`` returns ``cupy.ndarray``: the chunk chains the
    engine knows (zstd, Blosc, gzip, zlib, v2 and v3, sharded or not) are decoded by its batched
    codec stages on the GPU (:class:`gpu_zarr.zarr_gpu.GpuCodecPipeline`), every chunk's size and
    every shard index checked first; other numcodecs codecs round-trip through the host.
    Open (or re-open) arrays inside the block: a zarr array keeps the codec pipeline it was
    opened with, so an array opened before the block reads through zarr's own pipeline.
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
    caps = capabilities.probe()
    if not caps.gpu:
        raise GPUUnavailable("gpu_zarr_context needs a CUDA GPU: "
                             f"{caps.backend_status('zarr-gpu')[1]}. Read on the CPU instead, or {INSTALL_HINT}.")
    from gpu_zarr.zarr_gpu import gpu_decoding

    with gpu_decoding():
        yield


def read_zarr_via_zarr_gpu(array_path: Any, *, storage_options: Mapping[str, Any] | None = None) -> Any:
    """Load a zarr array onto the GPU using ``zarr.config.enable_gpu()``.

    Works for any array zarr can read; zstd is decoded by nvCOMP when installed.

    Parameters
    ----------
    array_path : str or pathlib.Path
        Path to the zarr array directory (or its URL).
    storage_options : mapping, optional
        Options of a remote store (see :mod:`gpu_zarr.location`).

    Returns
    -------
    cupy.ndarray
    """
    from gpu_zarr.zarr_gpu import read_on_gpu

    return read_on_gpu(open_array(array_path, storage_options), Ellipsis)


# -- progress and interrupts (gpu_zarr.progress): begin --------------------------------------
def read_selection(array_or_path: Any, selection: Any = Ellipsis, *, prefer: Backend = "auto",
                   options: EngineOptions | None = None, progress: ProgressArg = "auto",
                   cancel: Any = None, storage_options: Mapping[str, Any] | None = None) -> ReadResult:
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
        ``None`` never; the ``progress`` setting "off" (``GPU_ZARR_PROGRESS=0``) turns
        "auto" off (see :mod:`gpu_zarr.progress`).
    cancel : object with ``is_set()``, optional
    storage_options : mapping, optional
        Options of a remote store when ``array_or_path`` is a URL (see :mod:`gpu_zarr.location`).

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
            prep = PreparedArray(array_or_path, prefer, storage_options=storage_options)
            return prep.read(selection, options=options, progress=callback, cancel=cancel)
    except (KeyboardInterrupt, ReadCancelled) as exc:
        release_after_interrupt(exc)
        raise
# -- progress and interrupts: end -------------------------------------------------------------


def read_region(array: Any, selection: Any = Ellipsis, *, backend: Backend = "auto",
                options: EngineOptions | None = None, storage_options: Mapping[str, Any] | None = None) -> Any:
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
    storage_options : mapping, optional
        Options of a remote store when ``array`` is a URL (see :mod:`gpu_zarr.location`).

    Returns
    -------
    cupy.ndarray or numpy.ndarray
        cupy for GPU backends, numpy for "cpu"; equal to ``array[selection]``.
    """
    return read_selection(array, selection, prefer=backend, options=options, progress=None,
                          storage_options=storage_options).data


def read_zarr(array_or_path: Any, *, prefer: Backend = "auto", options: EngineOptions | None = None,
              progress: ProgressArg = "auto", cancel: Any = None,
              storage_options: Mapping[str, Any] | None = None) -> ReadResult:
    """Read a whole array with the chosen backend and measure it (see :func:`read_selection`).

    ``storage_options``: options of a remote store when ``array_or_path`` is a URL."""
    return read_selection(array_or_path, Ellipsis, prefer=prefer, options=options, progress=progress,
                          cancel=cancel, storage_options=storage_options)


def read_zarr_to_gpu(array_path: Any, *, prefer: Backend = "auto",
                     storage_options: Mapping[str, Any] | None = None) -> Any:
    """Load a zarr array onto the GPU using the fastest available path.

    Parameters
    ----------
    array_path : str or pathlib.Path
        Path to the zarr array directory (a ``zarr.Array`` is accepted too).
    prefer : {"auto", "kvikio", "zarr-gpu"}
        ``"auto"`` (default) picks the direct engine when the array and machine allow and
        zarr-gpu otherwise; forcing a path raises if it cannot serve this array.
    storage_options : mapping, optional
        Options of a remote store when ``array_path`` is a URL (see :mod:`gpu_zarr.location`).

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
    caps = capabilities.probe()
    if not caps.gpu:
        raise GPUUnavailable(
            "read_zarr_to_gpu needs a CUDA GPU, and none is usable here ("
            + (caps.notes[0] if caps.notes else "no device") + f"). Install the GPU libraries with {INSTALL_HINT}, "
            "or read into host memory with gpu_zarr.zarr_io.read_zarr(path, prefer='cpu')."
        )
    return read_selection(array_path, Ellipsis, prefer=prefer, storage_options=storage_options).data
