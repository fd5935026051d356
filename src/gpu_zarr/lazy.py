"""Lazy, GPU-backed array-like for viewers (napari) and headless tile access.

napari calls ``np.asarray`` on whatever ``data[key]`` returns, so a :class:`GpuLazyArray`
reads and decodes the requested region with the chosen backend (on the GPU when there
is one) and returns host numpy; :meth:`GpuLazyArray.get_gpu` returns the device tile.
In GPU-resident mode the whole level lives in device memory and each slice is a device
slice plus one device-to-host copy.
"""

from __future__ import annotations

import operator
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np
import zarr

from . import settings
from .backends import BACKENDS, check_backend
from .engine import EngineOptions, get_runtime
from .engine.fit import check_fits, nbytes_of
from .engine.plan import normalize_key as _normalize
from .engine.plan import normalize_selection
from .errors import GPUUnavailable
from .zarr_io import BackendChoice, PreparedArray, ReadResult

__all__ = ["BACKENDS", "GpuLazyArray", "check_fits_on_gpu", "normalize_key"]


def normalize_key(key: Any, shape: tuple[int, ...]) -> tuple[int | slice, ...] | None:
    """Normalise a basic-indexing key to one int or slice per axis, like numpy.

    The engine's normaliser (:func:`gpu_zarr.engine.plan.normalize_key`), returning None
    instead of raising TypeError when ``key`` is not basic indexing (arrays, booleans,
    ``None``...).

    Raises
    ------
    IndexError
        Too many indices, more than one Ellipsis, or an integer out of range.
    """
    try:
        return _normalize(shape, key)
    except TypeError:
        return None


def _slice_len(s: slice) -> int:
    return len(range(s.start, s.stop, s.step))


def _forward(sel: tuple[int | slice, ...]) -> tuple[tuple[int | slice, ...], tuple[int | slice, ...]]:
    """Split a normalised selection into a positive-step read and a host-side flip."""
    read: list[int | slice] = []
    flip: list[int | slice] = []
    for s in sel:
        if isinstance(s, int):
            read.append(s)
            continue
        if s.step > 0:
            read.append(s)
            flip.append(slice(None))
            continue
        r = range(s.start, s.stop, s.step)
        if len(r) == 0:
            read.append(slice(0, 0, 1))
        else:
            read.append(slice(r[-1], r[0] + 1, -s.step))
        flip.append(slice(None, None, -1))
    return tuple(read), tuple(flip)


def _scroll_target(last: tuple[int | slice, ...], key: tuple[int | slice, ...], shape: tuple[int, ...],
                   inner_shape: tuple[int, ...] | None) -> tuple[int | slice, ...] | None:
    """The plane a viewer that went from plane ``last`` to plane ``key`` shows next, or None
    when that was no one-plane step along one axis.

    With chunks thicker than one plane (``inner_shape``), the next plane's chunks were just
    decoded and cached: the target is the first plane of the next chunk layer instead.
    """
    moved = [a for a, (p, q) in enumerate(zip(last, key)) if p != q]
    if len(moved) != 1:
        return None
    axis = moved[0]
    here, before = key[axis], last[axis]
    if not isinstance(here, int) or not isinstance(before, int) or here - before not in (-1, 1):
        return None
    step = here - before
    nxt = here + step
    depth = inner_shape[axis] if inner_shape is not None else 1
    if depth > 1 and nxt // depth == here // depth:  # same chunk layer: cached already
        nxt = (here // depth + 1) * depth if step > 0 else (here // depth) * depth - 1
    if not 0 <= nxt < shape[axis]:
        return None
    return (*key[:axis], nxt, *key[axis + 1:])


class _Source:
    """State shared by a level array and the channel views taken from it."""

    def __init__(self, array: zarr.Array, backend: str) -> None:
        self.array = array
        self.backend = backend
        self.resident: Any = None  # cupy array of the whole level, or None
        self.lock = threading.RLock()
        self._prepared: PreparedArray | None = None
        self.last_key: tuple[int | slice, ...] | None = None
        self.prefetching: Future[None] | None = None
        self.prefetch_key: tuple[int | slice, ...] | None = None
        self.prefetch_more: tuple[tuple[int | slice, ...], ...] = ()  # read beside prefetch_key
        # when the last plane read ended and what it cost: a prefetch decoded on the CPU only
        # pays off when the viewer leaves it the time (else it takes the request's threads)
        self.last_done: float | None = None
        self.last_cost: float | None = None
        self.last_box: Any = None  # the region of the last read (a Region), for near()

    def near(self, key: tuple[int | slice, ...]) -> bool:
        """Whether the read of ``key`` lies within one (inner) chunk of the read before it (the
        first read counts as near): a viewer scrolling or panning reads the rest of the chunks
        it decoded part of, so they are worth keeping; after a jump, keeping them costs fresh
        memory for chunks no neighbour may ask for (the next read near this one keeps them)."""
        shape = tuple(int(n) for n in self.array.shape)
        try:
            box = normalize_selection(shape, key)
        except (IndexError, TypeError, ValueError):
            return True
        with self.lock:
            last, self.last_box = self.last_box, box
        if last is None:
            return True
        layout = self.prepared().layout
        inner = layout.inner_shape if layout is not None else shape
        return all(a0 < b1 + c and b0 - c < a1
                   for a0, a1, b0, b1, c in zip(box.start, box.stop, last.start, last.stop, inner))

    def prefetch_next(self, key: tuple[int | slice, ...]) -> None:
        """When a plane is asked for, decode the plane the user scrolls to next into the
        chunk cache, beside the request (napari asks for planes one by one; see
        :func:`_scroll_target`)."""
        with self.lock:
            last, self.last_key = self.last_key, key
            busy = self.prefetching is not None and not self.prefetching.done()
        if last is None or busy or not settings.get("cache_bytes"):
            return
        prepared = self.prepared()
        inner = prepared.layout.inner_shape if prepared.layout is not None else None
        ahead = _scroll_target(last, key, tuple(self.array.shape), inner)
        with self.lock:
            if ahead is None or self.prefetch_key == ahead:  # no scroll, or asked for already
                return
            done, cost = self.last_done, self.last_cost
        if done is not None and cost is not None and time.perf_counter() - done < cost:
            # planes asked for back to back: a prefetch on CPU threads would share them with
            # the request and slow both (measured on the H200: 7.0 ms a plane instead of 4.8).
            # GPU reads prefetch anyway: they run on the device, beside the request.
            if prepared.small_read_bytes(normalize_selection(self.array.shape, ahead)) is not None:
                return

        self.prefetch(ahead)

    def prefetch(self, key: tuple[int | slice, ...], *more: tuple[int | slice, ...]) -> bool:
        """Decode ``key`` (a basic selection of the whole level) into the chunk cache on the
        prefetch thread, and each of ``more`` beside it on a thread of its own (regions a
        viewer asks for one after the other: a remote store answers them in one round trip),
        unless a prefetch is running already. Returns whether it started."""
        if not settings.get("cache_bytes"):
            return False
        prepared = self.prepared()

        def one(k: tuple[int | slice, ...]) -> None:
            try:  # into the chunk cache (host memory for small reads); the result is dropped
                prepared.read(k, where="host", options=EngineOptions(cache="all"))
            except Exception:  # noqa: BLE001 - a failed prefetch only means no head start
                pass

        def run() -> None:
            beside = [threading.Thread(target=one, args=(k,), name="gpu-zarr-prefetch", daemon=True) for k in more]
            for t in beside:
                t.start()
            one(key)
            for t in beside:
                t.join()
        with self.lock:
            if self.prefetching is not None and not self.prefetching.done():
                return False
            self.prefetching = get_runtime().pool("prefetch", 1).submit(run)
            self.prefetch_key, self.prefetch_more = key, more
        return True

    def wait_prefetch(self, key: tuple[int | slice, ...]) -> None:
        """Wait for the running prefetch when one of its regions holds ``key``'s (its chunks land
        in the cache: the read that follows copies them rather than fetching them again)."""
        with self.lock:
            pending, ahead = self.prefetching, (self.prefetch_key, *self.prefetch_more)
        if pending is None or ahead[0] is None or pending.done():
            return
        if key not in ahead:
            shape = tuple(int(n) for n in self.array.shape)
            try:
                want = normalize_selection(shape, key)
                boxes = [normalize_selection(shape, a) for a in ahead if a is not None]
            except (IndexError, TypeError, ValueError):
                return
            if not any(all(h0 <= w0 and w1 <= h1 for w0, w1, h0, h1 in zip(want.start, want.stop, have.start, have.stop))
                       for have in boxes):
                return
        try:
            pending.result(timeout=30)
        except Exception:  # noqa: BLE001 - the read below does the work and reports errors
            pass

    def prepared(self) -> PreparedArray:
        """The array with its backend chosen and layout parsed, once (not per tile)."""
        with self.lock:
            if self._prepared is None or self._prepared.prefer != self.backend:
                self._prepared = PreparedArray(self.array, check_backend(self.backend))
            return self._prepared


class GpuLazyArray:
    """Read-on-demand view of a zarr array, decoded on the GPU when one is present.

    Parameters
    ----------
    zarr_array : zarr.Array, str, os.PathLike or gpu_zarr.location.Location
        The array (open it read-only, e.g. with :func:`gpu_zarr.omezarr.read_omezarr`), or
        its path or URL (opened read-only here).
    backend : {"auto", "kvikio", "zarr-gpu", "cpu"}
        How regions are read (see :func:`gpu_zarr.zarr_io.read_region`).
    storage_options : mapping, optional
        Options of a remote store when ``zarr_array`` is a URL (see :mod:`gpu_zarr.location`).

    Attributes
    ----------
    shape, dtype, ndim, size, nbytes
        As for a numpy array of the same data (of this view, if it is a channel view).
    chunks
        The zarr chunk shape along this view's axes.

    Notes
    -----
    Indexing supports numpy basic indexing: integers (negative too), slices with any
    step (negative steps included) and ``...``; the result equals ``zarr_array[key]``
    in dtype, shape and values. Other keys (integer arrays, booleans, ``None``) fall
    back to zarr's own CPU indexing.

    Views from :meth:`index_axis` share the resident level with their parent, so
    loading one channel layer's level makes all channels of that level resident.
    """

    def __init__(self, zarr_array: zarr.Array | _Source | str | os.PathLike[str], backend: str = "auto", *,
                 storage_options: Mapping[str, Any] | None = None,
                 _fixed: tuple[tuple[int, int], ...] = ()) -> None:
        if isinstance(zarr_array, _Source):
            self._src = zarr_array
        else:
            from .location import Location
            from .store import open_array

            if isinstance(zarr_array, (str, os.PathLike, Location)) or storage_options:
                zarr_array = open_array(zarr_array, storage_options)
            if not isinstance(zarr_array, zarr.Array):
                raise TypeError(f"expected a zarr.Array (or its path or URL), got {type(zarr_array).__name__}")
            self._src = _Source(zarr_array, check_backend(backend))
        self._fixed = tuple(sorted(_fixed))  # (axis in the base array, index)
        fixed_axes = {a for a, _ in self._fixed}
        base = tuple(int(s) for s in self._src.array.shape)
        self._free_axes = tuple(i for i in range(len(base)) if i not in fixed_axes)
        self._shape = tuple(base[i] for i in self._free_axes)

    # -- array protocol ------------------------------------------------------------
    @property
    def zarr_array(self) -> zarr.Array:
        """The underlying zarr array (whole level, all channels)."""
        return self._src.array

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._src.array.dtype)

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return nbytes_of(self._shape)  # Python ints: never wraps

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def chunks(self) -> tuple[int, ...]:
        """The chunk shape of this view (zarr's ``chunks``: inner chunks of a sharded array).

        The smallest unit a read decodes. napari 0.9's 2-D multiscale slicing reads it, as it
        reads a zarr array's, and widens the region it asks for to whole chunks: panning then
        stays inside what was read, and no chunk is decoded for a part of it.
        """
        base = tuple(int(c) for c in self._src.array.chunks)
        return tuple(base[i] for i in self._free_axes)

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of unsized object")
        return self._shape[0]

    def __repr__(self) -> str:
        res = ", resident" if self.is_resident else ""
        return (f"GpuLazyArray(shape={self.shape}, dtype={self.dtype}, backend={self.backend!r}"
                f"{res}, store={self._src.array.store_path})")

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self[...]
        return out if dtype is None else out.astype(dtype, copy=False)

    # -- backend -------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """Requested backend (shared with views of the same level); settable."""
        return self._src.backend

    @backend.setter
    def backend(self, value: str) -> None:
        self._src.backend = check_backend(value)

    def backend_choice(self) -> BackendChoice:
        """The concrete backend the core uses for this array, and why."""
        return self._src.prepared().choice

    def prepared(self) -> PreparedArray:
        """The array with its backend chosen and its layout parsed (shared with its views):
        what a read of several arrays at once (a plate's wells) reads through."""
        return self._src.prepared()

    # -- views ---------------------------------------------------------------------
    def index_axis(self, axis: int, index: int) -> GpuLazyArray:
        """A lazy view with ``axis`` fixed at ``index`` (like ``np.take(a, index, axis)``).

        The view shares backend and resident state with this array.
        """
        axis = operator.index(axis)
        if not -self.ndim <= axis < self.ndim:
            raise IndexError(f"axis {axis} out of range for a {self.ndim}-d array")
        axis %= self.ndim
        n = self._shape[axis]
        index = operator.index(index)
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of bounds for axis {axis} with size {n}")
        fixed = (*self._fixed, (self._free_axes[axis], index % n))
        return type(self)(self._src, _fixed=fixed)  # (a subclass keeps its kind: napari's levels)

    def _full_key(self, sel: tuple[int | slice, ...]) -> tuple[int | slice, ...]:
        """Selection on the base array for a normalised selection on this view."""
        if not self._fixed:
            return sel
        full: list[int | slice] = [slice(None)] * len(self._src.array.shape)
        for a, i in self._fixed:
            full[a] = i
        for a, s in zip(self._free_axes, sel, strict=True):
            full[a] = s
        return tuple(full)

    # -- reading -------------------------------------------------------------------
    def prefetch(self, key: Any = Ellipsis, *more: Any) -> bool:
        """Start decoding ``key`` (and each of ``more``, at the same time: regions a viewer
        asks for one after the other) into the chunk cache in the background, for a viewer
        about to ask for them: a read of a region inside one then waits for the prefetch
        rather than fetching the same chunks again.

        Returns whether it started: one prefetch runs at a time per level (views share it),
        and none for a resident level, a key that is not basic indexing, or with the chunk
        cache off (``settings`` ``cache_bytes`` 0). Empty regions among ``more`` are left out.
        """
        if self.is_resident:
            return False
        full: list[tuple[int | slice, ...]] = []
        for k in (key, *more):
            sel = normalize_key(k, self._shape)
            if sel is None:
                return False
            read, _ = _forward(sel)
            if not any(isinstance(s, slice) and _slice_len(s) == 0 for s in read) and self._full_key(read) not in full:
                full.append(self._full_key(read))  # (slices are not hashable before Python 3.12)
        return bool(full) and self._src.prefetch(*full)

    def _read(self, key: Any, *, gpu: bool):
        sel = normalize_key(key, self._shape)
        if sel is None:
            if gpu:
                raise IndexError(f"get_gpu supports basic indexing only (ints, slices, ...), got {key!r}")
            if self._fixed:
                raise IndexError(
                    f"channel views support basic indexing only (ints, slices, ...), got {key!r}"
                )
            return np.asarray(self._src.array[key])  # zarr's own (CPU) fancy indexing
        read, flip = _forward(sel)
        out_shape = tuple(_slice_len(s) for s in read if isinstance(s, slice))
        full = self._full_key(read)
        with self._src.lock:
            resident = self._src.resident
        needs_flip = any(isinstance(f, slice) and f.step == -1 for f in flip)
        if resident is not None:
            tile = resident[full]
            tile = tile[flip] if needs_flip else tile
            return tile if gpu else tile.get()
        if 0 in out_shape:
            if gpu:
                import cupy

                return cupy.empty(out_shape, self.dtype)
            return np.empty(out_shape, self.dtype)
        prepared = self._src.prepared()
        self._src.wait_prefetch(full)  # the plane being prefetched: wait for it rather than decode it twice
        if prepared.backend == "kvikio":
            self._src.prefetch_next(full)  # the next plane decodes beside this one
        t0 = time.perf_counter()
        # keep the chunks this read uses part of only while the reads stay near each other
        cache: bool | str = True if self._src.near(full) else "look"
        res = prepared.read(full, where="device" if gpu else "host", options=EngineOptions(cache=cache))
        with self._src.lock:
            self._src.last_done = time.perf_counter()
            self._src.last_cost = self._src.last_done - t0
        tile = res.data
        if gpu:
            if not hasattr(tile, "__cuda_array_interface__"):
                raise GPUUnavailable(
                    f"get_gpu needs a GPU backend, but backend {self._src.backend!r} "
                    f"served this read on the CPU ({self.backend_choice().reason})"
                )
            return tile[flip] if needs_flip else tile
        tile = tile.get() if hasattr(tile, "__cuda_array_interface__") else np.asarray(tile)
        return tile[flip] if needs_flip else tile

    def __getitem__(self, key: Any) -> np.ndarray:
        """Read ``key`` and return host numpy (decoded on the GPU when there is one)."""
        return self._read(key, gpu=False)

    def get_gpu(self, key: Any = Ellipsis) -> Any:
        """Read ``key`` and return the region as a cupy array, in device memory.

        Raises
        ------
        GPUUnavailable
            The backend serves this array on the CPU (no GPU, or ``backend="cpu"``).
        """
        return self._read(key, gpu=True)

    # -- GPU-resident mode ---------------------------------------------------------
    @property
    def is_resident(self) -> bool:
        """True while the whole level is held in device memory."""
        return self._src.resident is not None

    @property
    def resident_bytes(self) -> int:
        """Device memory held by the resident level (0 when not resident)."""
        r = self._src.resident
        return 0 if r is None else int(r.nbytes)

    def load_resident(self, *, progress: Callable[[int, int], None] | None = None,
                      cancel: Any = None) -> ReadResult:
        """Read the whole level (all channels of it) into GPU memory and keep it there.

        Afterwards ``self[key]`` (and every view of the same level) is a device slice
        plus one device-to-host copy.

        Parameters
        ----------
        progress : callable, optional
            ``progress(done_bytes, total_bytes)``, called from the reading thread.
        cancel : threading.Event, optional
            When set, the read stops with :class:`~gpu_zarr.errors.ReadCancelled`.

        Returns
        -------
        gpu_zarr.zarr_io.ReadResult
            Backend used and why, bytes, seconds, GiB/s, device bytes.

        Raises
        ------
        GPUUnavailable
            No GPU, or the backend serves on the CPU.
        OutOfGPUMemory
            The level plus headroom does not fit in free device memory.
        """
        choice = self.backend_choice()
        if choice.backend == "cpu":
            raise GPUUnavailable(
                "GPU-resident mode needs a GPU backend; backend "
                f"{self._src.backend!r} resolves to the CPU here: {choice.reason}"
            )
        self.release_resident()
        result = self._src.prepared().read(Ellipsis, progress=progress, cancel=cancel)
        if isinstance(result.data, np.ndarray):
            raise GPUUnavailable(f"backend {result.backend!r} returned host memory: {result.reason}")
        with self._src.lock:
            self._src.resident = result.data
        return result

    def release_resident(self) -> None:
        """Drop the resident level (for this array and all its views) and free it."""
        with self._src.lock:
            had = self._src.resident is not None
            self._src.resident = None
        freed = get_runtime().clear_caches()  # decoded chunks kept for browsing go too
        if had or freed:
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()


def check_fits_on_gpu(nbytes: int, *, what: str = "the read") -> None:
    """Raise OutOfGPUMemory unless ``nbytes`` plus headroom fits in free device memory.

    The one fit check of the engine (:func:`gpu_zarr.engine.fit.check_fits`); headroom is
    ``gpu_zarr.settings`` ``headroom_bytes`` (default: 512 MiB or 5 % of the device).
    """
    check_fits(nbytes, 0, device="gpu", what=what)
