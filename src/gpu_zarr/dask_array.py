"""Dask arrays whose blocks gpu_zarr reads (and decodes on the worker's GPU).

:func:`to_dask` turns a zarr array, or every level of an OME-Zarr image, into a
``dask.array.Array``. Each block is one call of the project's read path
(:func:`gpu_zarr.zarr_io.read_selection`) on the worker that runs it: cupy blocks read
by the direct engine (kvikio + nvCOMP) on a GPU worker, numpy blocks read by
zarr-python on a worker without a GPU.

The task graph holds only picklable descriptions (:class:`ArraySource`: the array's
path or URL, the remote store's ``storage_options``, OME level, shape, dtype; and each
block's region as ``(start, stop)`` pairs),
never an opened array, a CUDA stream, a codec or a device buffer. A worker process
opens each array once and keeps it in a small per-process cache keyed by path and
level (and the metadata file's modification time), so thousands of blocks cost one open
per worker.

Block size rule (``chunks=None``)
---------------------------------
Blocks are whole storage units: the shard shape of a sharded array, the chunk shape
otherwise. Starting from one unit, each axis from the last (fastest) to the first is
grown to the array's full extent while the block stays within the target decoded size;
the first axis that cannot be filled takes as many whole units as fit (at least one)
and the axes before it keep one unit. Blocks are therefore contiguous C-order slabs
where possible, and never split a storage chunk. Targets: :data:`GPU_BLOCK_BYTES`
(1 GiB) when blocks are read on GPUs: each block is one engine read, whose fetch and decode
stages overlap only within the read (one ~192 MiB batch at each end does not), so a block
must span several batches to run near the engine's streaming rate; :data:`CPU_BLOCK_BYTES`
(128 MiB, dask's own default) for numpy blocks: with the native host path a 128 MiB block reads
faster than zarr-python, and smaller blocks only add per-block costs (2-core machine, 0.5 GiB
volumes, one worker: zstd 1 MiB / Blosc lz4 / zstd 256 KiB chunks at 0.96 / 2.00 / 0.79 GiB/s with
128 MiB blocks, 0.68 / 0.32 / 0.26 with 8 MiB; ``benchmarks/results/2026-12-02-cpu`` in git history at 810935b).
``chunks="1GiB"`` (any byte size) applies the same rule to another
target; any other ``chunks`` value is passed to ``dask.array.core.normalize_chunks``
with the storage unit as ``previous_chunks``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_zarr.backends import check_backend
from gpu_zarr.engine.fit import host_available_bytes, nbytes_of
from gpu_zarr.errors import INSTALL_HINT, GpuZarrError, NotAZarrError, OutOfHostMemory, install_hint

if TYPE_CHECKING:  # pragma: no cover
    import dask.array

__all__ = [
    "CPU_BLOCK_BYTES",
    "GPU_BLOCK_BYTES",
    "ArraySource",
    "WorkerState",
    "block_shape",
    "cache_info",
    "clear_cache",
    "read_block",
    "to_dask",
    "worker_state",
]


log = logging.getLogger("gpu_zarr.dask")

#: default decoded bytes per dask block when blocks are cupy arrays
GPU_BLOCK_BYTES = 1 << 30
#: default decoded bytes per dask block when blocks are numpy arrays
CPU_BLOCK_BYTES = 128 << 20



@dataclass(frozen=True)
class ArraySource:
    """What a worker needs to open one array: plain, picklable values only.

    Attributes
    ----------
    path : str
        The array's own location (local folder or URL), e.g. ``image.ome.zarr/0``.
    level : int or None
        OME-Zarr level the array is (None for a plain array).
    shape : tuple of int
    dtype : str
        numpy dtype string of the blocks (native byte order).
    stamp : int
        Modification time (ns) of the array's metadata file when the graph was built,
        0 when unknown; part of the cache key, so a rewritten store is reopened.
    storage_options : dict
        Options of a remote store (credentials, endpoint, ``anon``...; see
        :mod:`gpu_zarr.location`): they travel in the graph to the workers, which open the
        URL with them. Never shown in the repr.
    """

    path: str
    level: int | None
    shape: tuple[int, ...]
    dtype: str
    stamp: int = 0
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def key(self) -> tuple[str, int | None, int, str]:
        opts = json.dumps(self.storage_options, sort_keys=True, default=str) if self.storage_options else ""
        return (self.path, self.level, self.stamp, opts)


# ------------------------------------------------------------------ per-process cache

_CACHE_SIZE = 32


class WorkerState:
    """What a worker process keeps between blocks, owned by its runtime
    (:func:`gpu_zarr.engine.get_runtime`): prepared arrays (LRU), counts for diagnostics,
    and whether the CPU notice was given."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prepared: OrderedDict[tuple, Any] = OrderedDict()
        self.opens: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        self.said_cpu = False

    def clear(self) -> None:
        with self.lock:
            self.prepared.clear()
            self.opens.clear()
            self.reads.clear()


def worker_state() -> WorkerState:
    """This process's :class:`WorkerState`."""
    from gpu_zarr.engine.runtime import get_runtime

    return get_runtime().resource(("dask", "worker-state"), WorkerState, close=lambda s: s.clear())


def _prepared(source: ArraySource, backend: str) -> Any:
    """This process's :class:`~gpu_zarr.zarr_io.PreparedArray` of ``source``: opened and its
    backend (and engine layout) chosen once, then reused by every block."""
    from gpu_zarr.zarr_io import PreparedArray

    key = (*source.key, backend)
    st = worker_state()
    with st.lock:
        prep = st.prepared.get(key)
        if prep is not None:
            st.prepared.move_to_end(key)
            return prep
        prep = PreparedArray(source.path, backend,  # type: ignore[arg-type]
                             storage_options=source.storage_options or None)
        arr = prep.array
        if tuple(arr.shape) != tuple(source.shape) or np.dtype(arr.dtype).newbyteorder("=") != np.dtype(source.dtype):
            raise GpuZarrError(
                f"{source.path} changed since the dask graph was built: expected shape {source.shape} "
                f"dtype {source.dtype}, found shape {tuple(arr.shape)} dtype {arr.dtype}. "
                "Build the dask array again with gpu_zarr.to_dask().")
        st.prepared[key] = prep
        st.opens[source.path] += 1
        while len(st.prepared) > _CACHE_SIZE:
            st.prepared.popitem(last=False)
        return prep


def cache_info() -> dict[str, Any]:
    """This process's prepared arrays: opens and block reads per array path (diagnostics)."""
    st = worker_state()
    with st.lock:
        return {"pid": os.getpid(), "cached": len(st.prepared), "opens": dict(st.opens), "reads": dict(st.reads)}


def clear_cache() -> None:
    """Forget this process's prepared arrays and counts."""
    worker_state().clear()


# ------------------------------------------------------------------ block read (on the worker)


def read_block(source: ArraySource, region: tuple[tuple[int, int], ...], backend: str = "auto") -> Any:
    """Read one block: ``array[start:stop, ...]`` through the project's read path.

    This is the function every task of a :func:`to_dask` graph calls, in the worker: the
    array is opened and its backend chosen once per process
    (:class:`gpu_zarr.zarr_io.PreparedArray`, as :func:`gpu_zarr.zarr_io.read_selection`
    does for one read), then each block is one read.

    Parameters
    ----------
    source : ArraySource
        Which array (opened once per process and cached).
    region : tuple of (int, int)
        ``(start, stop)`` per axis.
    backend : {"auto", "kvikio", "zarr-gpu", "cpu"}
        The ``prefer`` of the read.

    Returns
    -------
    cupy.ndarray or numpy.ndarray
        cupy on a GPU backend, numpy on the CPU backend; native byte order.
    """
    prep = _prepared(source, backend)
    res = prep.read(tuple(slice(a, b) for a, b in region))
    st = worker_state()
    with st.lock:
        st.reads[source.path] += 1
        say = res.backend == "cpu" and backend == "auto" and not st.said_cpu
        if say:
            st.said_cpu = True
    if say:
        log.warning("gpu_zarr dask worker (pid %d): %s; blocks are numpy arrays read by zarr-python "
                    "on the CPU.", os.getpid(), res.reason)
    return res.data


# ------------------------------------------------------------------ graph building (on the client)


def block_shape(shape: tuple[int, ...], unit: tuple[int, ...], itemsize: int, target: int) -> tuple[int, ...]:
    """Block shape of the default rule (see the module docstring).

    Parameters
    ----------
    shape : tuple of int
        Array shape.
    unit : tuple of int
        Storage unit: shard shape of a sharded array, chunk shape otherwise.
    itemsize : int
        Bytes per element.
    target : int
        Target decoded bytes per block.

    Returns
    -------
    tuple of int
        Per axis a multiple of ``unit`` or the full extent; at least one unit.
    """
    block = [max(1, min(u, s)) for u, s in zip(unit, shape)]
    nbytes = itemsize * math.prod(block)
    for ax in reversed(range(len(shape))):
        if block[ax] >= shape[ax]:
            continue
        step = nbytes // block[ax]  # bytes of one index along this axis
        k = max(1, target // max(1, step * block[ax]))
        new = min(shape[ax], k * block[ax])
        nbytes = step * new
        block[ax] = new
        if new < shape[ax]:
            break
    return tuple(block)


def _storage_unit(arr: Any) -> tuple[int, ...]:
    shards = getattr(arr, "shards", None)
    return tuple(int(c) for c in (shards or arr.chunks))


def _stamp(path: str) -> int:
    if "://" in path:
        return 0
    for name in ("zarr.json", ".zarray"):
        try:
            return os.stat(os.path.join(path, name)).st_mtime_ns
        except OSError:
            continue
    return 0


def _array_path(arr: Any) -> tuple[str, dict[str, Any]]:
    """A path (or URL, with its storage options) a worker can reopen ``arr`` from: local
    stores, and remote stores opened by gpu_zarr (which know their URL)."""
    store = getattr(arr, "store", None)
    sub = str(getattr(arr, "path", "") or "")
    loc = getattr(store, "_gpu_zarr_location", None)
    if loc is not None:
        return loc.url.rstrip("/") + ("/" + sub if sub else ""), dict(loc.storage_options)
    root = getattr(store, "root", None)
    if root is None:
        raise NotAZarrError(
            f"to_dask needs an array that each worker can reopen by path; this one lives in a "
            f"{type(store).__name__}, which cannot travel to other processes. Pass the array's "
            "folder or URL (a string) instead.")
    return (os.path.join(os.fspath(root), sub) if sub else os.fspath(root)), {}


def _client_uses_gpu(backend: str) -> bool:
    if backend == "cpu":
        return False
    from gpu_zarr.capabilities import probe

    caps = probe()
    if caps.gpu:
        return True
    st = worker_state()
    if backend == "auto" and not st.said_cpu:
        st.said_cpu = True
        why = caps.notes[0] if caps.notes else "cupy sees no CUDA device"
        hint = "" if "pip install" in why else f" For GPU blocks: {INSTALL_HINT}."
        log.warning("gpu_zarr.to_dask: no usable GPU here (%s); the dask arrays have numpy blocks "
                    "read by zarr-python on the CPU.%s", why, hint)
    return False


#: most blocks a graph may hold: the graph is one dict entry per block, built on the client
MAX_BLOCKS = 10_000_000


def _check_blocks(shape: tuple[int, ...], block: tuple[int, ...], itemsize: int, path: str) -> None:
    """Refuse, in Python integers and before dask builds anything, a graph of absurdly many blocks
    (a hostile or mistaken shape such as [2**32, 2**32] would exhaust memory or hang)."""
    n = math.prod(-(-max(s, 0) // max(b, 1)) for s, b in zip(shape, block))
    if n > MAX_BLOCKS:
        raise OutOfHostMemory(
            f"{path}: a dask array of shape {shape} in blocks of {block} has {n:,} blocks; its graph (one "
            f"entry per block, built in this process) would not fit in memory (at most {MAX_BLOCKS:,}). "
            "Pass larger chunks=, or read a region with gpu_zarr.zarr_io.read_region.")
    block_bytes = nbytes_of(block, itemsize)
    avail = host_available_bytes()
    if block_bytes > (avail if avail is not None else 1 << 62):
        raise OutOfHostMemory(
            f"{path}: one block of {block} ({block_bytes / (1 << 30):,.2f} GiB) is larger than this machine's "
            f"available memory, so no block could ever be computed (the storage chunks are {block} or larger). "
            "Read a region with gpu_zarr.zarr_io.read_region instead.")


def _chunks_for(arr: Any, shape: tuple[int, ...], dtype: np.dtype, chunks: Any, gpu: bool, path: str = "") -> tuple:
    from dask.array.core import normalize_chunks
    from dask.utils import parse_bytes

    unit = _storage_unit(arr)
    if chunks is None or isinstance(chunks, str) and chunks != "auto":
        target = (GPU_BLOCK_BYTES if gpu else CPU_BLOCK_BYTES) if chunks is None else parse_bytes(chunks)
        if target <= 0:
            raise ValueError(f"chunks as a byte size must be positive, got {chunks!r}")
        chunks = block_shape(tuple(shape), unit, dtype.itemsize, int(target))
    if isinstance(chunks, int) and not isinstance(chunks, bool):
        _check_blocks(shape, (chunks,) * len(shape), dtype.itemsize, path or str(arr.store_path))
    elif isinstance(chunks, tuple) and all(isinstance(c, int) for c in chunks) and len(chunks) == len(shape):
        _check_blocks(shape, tuple(c if c > 0 else s for c, s in zip(chunks, shape)), dtype.itemsize,
                      path or str(arr.store_path))
    return normalize_chunks(chunks, tuple(shape), dtype=dtype, previous_chunks=unit)


def _one(arr: Any, path: str, level: int | None, chunks: Any, backend: str, gpu: bool,
         opts: Mapping[str, Any]) -> dask.array.Array:
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    dtype = np.dtype(arr.dtype).newbyteorder("=")
    shape = tuple(int(s) for s in arr.shape)
    source = ArraySource(path, level, shape, dtype.str, _stamp(path), dict(opts))
    norm = _chunks_for(arr, shape, dtype, chunks, gpu, path)
    name = "gpu-zarr-" + tokenize(source, norm, backend)
    starts = [np.concatenate([[0], np.cumsum(c)]).astype(int).tolist() for c in norm]
    dsk: dict = {}
    for idx in np.ndindex(*[len(c) for c in norm]):
        region = tuple((starts[ax][i], starts[ax][i + 1]) for ax, i in enumerate(idx))
        dsk[(name, *idx)] = (read_block, source, region, backend)
    if gpu:
        import cupy

        meta = cupy.empty((0,) * len(shape), dtype)
    else:
        meta = np.empty((0,) * len(shape), dtype)
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    return da.Array(graph, name, norm, meta=meta)


def _plain(arr: Any, path: str, opts: Mapping[str, Any], level: int | None, chunks: Any,
           backend: str) -> dask.array.Array:
    """A plain zarr array (not an OME-Zarr image: ``level`` may only be None or 0)."""
    if level not in (None, 0):
        raise ValueError(f"level={level} was given, but {path} is a plain zarr array, not an OME-Zarr "
                         "image with levels; pass level=None (or 0).")
    return _one(arr, path, None, chunks, backend, _client_uses_gpu(backend), opts)


def _from_path(where: Any, storage_options: Mapping[str, Any] | None, level: int | None, chunks: Any,
               backend: str) -> dask.array.Array | list[dask.array.Array]:
    """A path or URL: an OME-Zarr image's levels (every one, or ``level``), or a plain array."""
    import zarr

    from gpu_zarr.location import path_and_options
    from gpu_zarr.omezarr import open_ome
    from gpu_zarr.store import open_node

    path, opts = path_and_options(where, storage_options)
    node = open_node(path, opts)
    if not isinstance(node, zarr.Group):
        return _plain(node, path, opts, level, chunks, backend)
    image = open_ome(path, with_labels=False, storage_options=opts)
    n = len(image.levels)
    if level is not None:
        image.level_path(level)  # IndexError / TypeError for a level that does not exist
    gpu = _client_uses_gpu(backend)
    out = [_one(image.open_level(i), image.level_path(i), i, chunks, backend, gpu, opts)
           for i in (range(n) if level is None else [level % n])]
    return out if level is None else out[0]


def _from_array(arr: Any, storage_options: Mapping[str, Any] | None, level: int | None, chunks: Any,
                backend: str) -> dask.array.Array:
    """An opened zarr array, which the workers reopen by its path."""
    if not hasattr(arr, "shape") or not hasattr(arr, "chunks"):
        raise NotAZarrError(f"to_dask expects a zarr array or a path to one (or to an OME-Zarr "
                            f"image), got {type(arr).__name__}")
    if storage_options:
        raise ValueError("storage_options apply to a path or URL; this is an opened zarr array (its store "
                         "has its own options): pass the URL instead, or leave storage_options out")
    path, opts = _array_path(arr)
    return _plain(arr, path, opts, level, chunks, backend)


def to_dask(path_or_array: Any, *, level: int | None = None, chunks: Any = None,
            backend: str = "auto", storage_options: Mapping[str, Any] | None = None,
            ) -> dask.array.Array | list[dask.array.Array]:
    """A dask array (or one per OME-Zarr level) whose blocks gpu_zarr reads on the workers.

    Parameters
    ----------
    path_or_array : str, os.PathLike or zarr.Array
        A zarr array (v2 or v3, sharded or not, any codec zarr-python reads), or an
        OME-Zarr image group (OME-NGFF 0.4 or 0.5). A ``zarr.Array`` must live in a local
        store, so that workers can reopen it by path.
    level : int, optional
        OME-Zarr level to return (negative counts from the smallest). None (default)
        returns every level of an OME-Zarr image as a list, highest resolution first,
        and the array itself for a plain zarr array.
    chunks : None, str, int, tuple or dict, optional
        None (default): whole storage chunks (shards) grouped into blocks of about
        :data:`GPU_BLOCK_BYTES` (cupy blocks) or :data:`CPU_BLOCK_BYTES` (numpy blocks),
        see the module docstring. A byte size such as ``"1GiB"``: the same rule with that
        target. Anything else: as ``dask.array.from_array`` (aligned to storage chunks
        by ``normalize_chunks``; blocks that split storage chunks read those chunks twice).
    backend : {"auto", "kvikio", "zarr-gpu", "cpu"}
        Backend each block is read with on its worker (``read_selection``'s ``prefer``).
        ``"auto"``: the direct engine where the worker has a GPU and the array allows it,
        zarr-python on the CPU where the worker has no GPU.
    storage_options : mapping, optional
        Options of a remote store when ``path_or_array`` is a URL (credentials, endpoint,
        ``anon``...; see :mod:`gpu_zarr.location`). They travel in the graph to the workers
        (other processes open the URL with them): putting credentials there is your choice;
        they are never shown in reprs or messages.

    Returns
    -------
    dask.array.Array or list of dask.array.Array
        Its meta is ``cupy.empty((0,) * ndim, dtype)`` when this (client) process has a
        usable GPU and ``backend != "cpu"``, ``numpy.empty`` otherwise; the repr shows
        ``chunktype=cupy.ndarray`` for the former.

    Raises
    ------
    ImportError
        dask is not installed (the message names the extra).
    NotAZarrError, gpu_zarr.omezarr.NotOmeZarrError, gpu_zarr.omezarr.InvalidOmeMetadata
        The path holds no zarr array or OME-Zarr image.
    IndexError
        ``level`` out of range.
    ValueError
        Unknown ``backend``, or ``level`` given for a plain array.

    Notes
    -----
    The graph holds only the array's path, level, shape, dtype and each block's region
    (see :class:`ArraySource`); no zarr handle, CUDA stream, codec or device memory is
    created on the client beyond the meta. Each worker process opens each array once
    and reuses it. On a dask-cuda cluster (one worker per GPU, each seeing its GPU as
    device 0 through ``CUDA_VISIBLE_DEVICES``) every worker reads onto its own GPU.
    The meta is decided on the client: build the array on a client of the same kind
    (GPU or not) as the workers, or pass ``backend="cpu"`` for numpy everywhere.

    Examples
    --------
    >>> from distributed import Client                       # doctest: +SKIP
    >>> client = Client()                                     # doctest: +SKIP
    >>> levels = to_dask("image.ome.zarr")                    # doctest: +SKIP
    >>> levels[0].mean().compute()                            # doctest: +SKIP
    """
    try:
        import dask.array  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"gpu_zarr.to_dask needs dask: {install_hint('dask')} (dask-cuda for one worker "
                          "per GPU: the extra [dask-cuda13] or [dask-cuda12])") from exc
    check_backend(backend)

    from gpu_zarr.location import Location

    if isinstance(path_or_array, (str, os.PathLike, Location)):
        return _from_path(path_or_array, storage_options, level, chunks, backend)
    return _from_array(path_or_array, storage_options, level, chunks, backend)
