"""The backends: their names (defined once), the protocol they share, and the choice.

A backend is an object that owns one read path:

- :class:`EngineBackend` (``"kvikio"``, the seed's name): the direct engine
  (:mod:`gpu_zarr.engine`), with its small-read policy (viewer reads decoded on CPU threads);
- :class:`ZarrGpuBackend` (``"zarr-gpu"``): zarr-python with GPU buffers and our codec
  pipeline (:mod:`gpu_zarr.zarr_gpu`), for any array zarr reads;
- :class:`CpuBackend` (``"cpu"``): host memory, for machines without a GPU.

The two engine backends also read boxes of several arrays of one chunk format in one engine
read (``read_parts_into``: a plate's wells, :mod:`gpu_zarr.plate`).

:func:`choose` picks one for an array (``prefer="auto"`` picks the fastest the array and the
machine allow) and says why. A prepared array (:class:`gpu_zarr.zarr_io.PreparedArray`)
holds the chosen backend for its life: a read never changes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast, get_args

import numpy as np

from gpu_zarr import settings
from gpu_zarr.errors import (
    INSTALL_HINT,
    CorruptChunkError,
    GPUUnavailable,
    GpuZarrError,
    ReadCancelled,
    UnsupportedArrayError,
)

__all__ = ["BACKENDS", "READ_BACKENDS", "Backend", "BackendChoice", "CpuBackend", "CpuEngineBackend", "EngineBackend",
           "ReadBackend", "ZarrGpuBackend", "check_backend", "choose", "nbytes_of"]

Backend = Literal["auto", "kvikio", "zarr-gpu", "cpu"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)
#: the backends that serve reads ("auto" is a policy that picks one of them)
READ_BACKENDS: tuple[Backend, ...] = tuple(b for b in BACKENDS if b != "auto")


def check_backend(name: object) -> Backend:
    """Return ``name`` as a :data:`Backend`, or raise ValueError listing the valid names."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {name!r}")
    return cast(Backend, name)


@dataclass(frozen=True)
class BackendChoice:
    """The backend that serves (or would serve) a read, and why."""

    backend: str
    reason: str

    def __str__(self) -> str:
        return f"{self.backend} ({self.reason})"


def nbytes_of(shape: tuple[int, ...], dtype: Any) -> int:
    """Bytes of an array of ``shape`` and ``dtype``, in Python integers (never wraps)."""
    from gpu_zarr.engine.fit import nbytes_of as _nbytes

    return _nbytes(shape, np.dtype(dtype).itemsize)


class ReadBackend(Protocol):
    """What a prepared array asks of its backend.

    Attributes
    ----------
    name : str
        One of :data:`READ_BACKENDS`.
    layout : Layout or None
        The direct engine's parse of the array (None for the zarr-python backends).
    """

    name: str
    layout: Any

    def small_read_bytes(self, region: Any) -> int | None:
        """Decoded bytes of a read small enough to decode on CPU threads, else None."""
        ...

    def read(self, arr: Any, region: Any, selection: Any, *, options: Any, progress: Callable[[int, int], None] | None,
             cancel: Any, where: str) -> tuple[Any, dict[str, Any], str]:
        """``arr[selection]``: (data, stats, what to add to the choice's reason)."""
        ...


class EngineBackend:
    """The direct engine (``"kvikio"``): plan -> fetch -> decode -> place on the GPU.

    Reads that touch little data (a viewer's plane: ``settings`` ``small_read``) decode on
    CPU threads instead, where nvCOMP's per-call latency would cost more than it saves; they
    return host memory when the caller wants it (``where="host"``). So do a remote store's
    reads up to ``remote_host_read``: the host decodes each chunk as its bytes arrive (128 MiB
    of shards at 20 ms a request on the H200: 49-53 ms, against 54-58 in nvCOMP batches that
    wait for whole answers).
    """

    name = "kvikio"

    def __init__(self, layout: Any, runtime: Any = None) -> None:
        self.layout = layout
        self._runtime = runtime

    @property
    def runtime(self) -> Any:
        if self._runtime is None:
            from gpu_zarr.engine.runtime import get_runtime

            self._runtime = get_runtime()
        return self._runtime

    def small_read_bytes(self, region: Any, to_device: bool = True) -> int | None:
        touched, est = self.host_choice(region, to_device)
        return touched if _on_host(touched, est) else None

    def host_choice(self, region: Any, to_device: bool = True) -> tuple[int | None, Any]:
        """(decoded bytes of the chunks the read touches, the executor estimate) when it may
        decode on CPU threads; (None, None) when it decodes on the GPU regardless."""
        return self._weigh(self._touched(region), to_device)

    def _weigh(self, touched: tuple[int, int] | None, to_device: bool) -> tuple[int | None, Any]:
        """:meth:`host_choice` of a read touching ``touched`` (chunks, decoded bytes). A local
        read up to ``small_read`` is weighed (:func:`gpu_zarr.engine.choice.choose`); a remote
        one up to ``remote_host_read`` decodes on the host as the answers arrive (the network,
        not the decoder, bounds it: no estimate)."""
        lay, limit = self.layout, settings.get("small_read")
        if lay.source is not None:
            limit = max(limit, settings.get("remote_host_read"))
        if touched is None or not limit or touched[1] > limit:
            return None, None
        if lay.source is not None:
            return touched[1], None
        return touched[1], self._estimate(*touched, to_device)

    def _touched(self, region: Any) -> tuple[int, int] | None:
        """(chunks, their decoded bytes) a read of ``region`` touches; None when it has nothing
        to decode (raw chunks: read straight to the GPU) or touches nothing."""
        lay = self.layout
        if lay.codec == "raw" and not lay.frames:
            return None
        chunks = 1
        for a, b, c in zip(region.start, region.stop, lay.inner_shape):
            if b <= a:
                return None
            chunks *= (b - 1) // c - a // c + 1
        return chunks, chunks * lay.inner_nbytes

    def _estimate(self, chunks: int, touched: int, to_device: bool) -> Any:
        choice = _choice()
        return choice.choose(choice.decode_rates(self.runtime), choice.codec_key(self.layout), chunks, touched,
                             settings.get("threads"), to_device=to_device, batch_bytes=settings.get("batch_bytes"))

    def read(self, arr: Any, region: Any, selection: Any, *, options: Any, progress: Callable[[int, int], None] | None,
             cancel: Any, where: str) -> tuple[Any, dict[str, Any], str]:
        EngineOptions, engine_read, _ = _engine()
        on_gpu = where != "host"
        small, est = self.host_choice(region, on_gpu)
        if small is None or not _on_host(small, est):
            opts = options or EngineOptions()
            if progress is not None or cancel is not None:
                opts = opts.with_(progress=progress or opts.progress, cancel=cancel or opts.cancel)
            res = engine_read(None, region, device="gpu", options=opts, layout=self.layout, runtime=self.runtime)
            if est is None:
                return res.data, res.stats, ""
            res.stats.update(est.stats())
            return res.data, res.stats, f"; {est.describe()}: decoded on the GPU"
        data, stats, threads = self._read_on_host(region, options, progress, cancel, on_gpu)
        stats["small_read"] = True
        if est is not None:
            stats.update(est.stats())
            self._record(stats, threads)
        kind = "small read" if small <= settings.get("small_read") else "remote read, decoded as the answers arrived,"
        return data, stats, (f"; {kind} ({small / (1 << 20):.1f} MiB of chunks): decoded on {threads} CPU "
                             "threads" + (", one copy to the GPU" if on_gpu else ", returned in host memory")
                             + (f" ({est.describe()})" if est is not None else ""))

    def _read_on_host(self, region: Any, options: Any, progress: Callable[[int, int], None] | None, cancel: Any,
                      on_gpu: bool) -> tuple[Any, dict[str, Any], int]:
        """The read decoded chunkwise on CPU threads: (data, stats, threads); on the GPU after
        one copy when ``on_gpu``. With ``cache`` (viewers) the decoded chunks are kept in the
        runtime's host chunk cache, so the next planes of thick chunks are copies."""
        EngineOptions, engine_read, CpuOps = _engine()
        # the options made once and the CPU ops kept by the runtime: a plane's requests leave
        # sooner. The page-locked box a plane is placed in, then (a remote plane, on the GPU)
        # its copy to the GPU set up while the requests travel, not after the answers
        sent = options.on_sent if options is not None else None
        staged = _Staged(region.out_shape, after=sent) if on_gpu else None
        if staged is not None and all([isinstance(p, int) or p == _WHOLE for p in region.post]):
            # (the result is the whole box, its integer axes dropped: a plane of a volume)
            sent = staged.prepare
        opts = (EngineOptions(reader="threads", progress=progress, cancel=cancel, on_sent=sent) if options is None
                else options.with_(reader="threads", progress=progress, cancel=cancel, on_sent=sent))
        rt = self.runtime
        threads = opts.threads
        ops = rt.resource(("small-read-ops", threads),
                          lambda: CpuOps(rt.pool("cpu-decode", threads), threads, fast=True, runtime=rt))
        if staged is None:
            res = engine_read(None, region, device="cpu", options=opts, layout=self.layout, ops=ops, runtime=rt)
            return res.data, res.stats, threads
        # placed in page-locked staging and copied to the GPU from there (copies from ordinary
        # memory are several times slower)
        dtype = self.layout.out_dtype
        with rt.pinned.lease(nbytes_of(region.box_shape, dtype), 1, rt.pinned_alloc) as (buf,):
            staged.box = buf.view(dtype).reshape(region.box_shape)
            res = engine_read(None, region, device="cpu", options=opts, layout=self.layout, ops=ops, runtime=rt,
                              out=staged.box)
            return staged.to_gpu(res.data), res.stats, threads

    def _record(self, stats: dict[str, Any], threads: int) -> None:
        """Record the host decode rate of a read the native threads decoded (fused executor,
        nothing from the chunk cache): what later reads' estimates use."""
        decoded = int(stats.get("chunkwise_native") or 0)
        if decoded and not stats.get("cache_hits") and stats.get("fused_s"):
            choice = _choice()
            choice.decode_rates(self.runtime).record(choice.codec_key(self.layout),
                                                     decoded * self.layout.inner_nbytes, float(stats["fused_s"]),
                                                     min(threads, decoded))

    def read_parts_into(self, parts: Any, out: np.ndarray, *, options: Any = None) -> tuple[dict[str, Any], str]:
        """Read boxes of several arrays of this one's chunk format into their places in the host
        array ``out`` with ONE engine read (:func:`gpu_zarr.engine.read_many`): on CPU threads
        when all of them together are a small read (``settings`` ``small_read``), else on the
        GPU, then one copy to the host. Returns (stats, what to add to the choice's reason)."""
        touched = [self._touched(p) for p in parts]
        if all(t is not None for t in touched):
            total = tuple(sum(t[k] for t in touched if t is not None) for k in (0, 1))
            small, est = self._weigh((total[0], total[1]), False)
            if _on_host(small, est):
                stats = _read_parts_on_host(self.runtime, parts, out, options)
                if est is not None:
                    stats.update(est.stats())
                return stats, (f"; one engine read of {len(parts)} arrays, decoded on CPU threads (small read"
                               + (f"; {est.describe()})" if est is not None else ")"))
        from gpu_zarr.engine import EngineOptions, read_many

        res = read_many(parts, out.shape, device="gpu", options=options or EngineOptions(), runtime=self.runtime)
        host = res.data.get()
        for p in parts:  # the rest of the device output is undefined: only the parts come back
            box = tuple(slice(a, a + b - s) for a, s, b in zip(p.at, p.start, p.stop))
            out[box] = host[box]
        return res.stats, f"; one engine read of {len(parts)} arrays, decoded on the GPU"


def _on_host(touched: int | None, est: Any) -> bool:
    """Whether a read weighed by :meth:`EngineBackend.host_choice` decodes on CPU threads."""
    return touched is not None and (est is None or est.executor == "cpu")


@functools.cache
def _choice() -> Any:
    """:mod:`gpu_zarr.engine.choice`, imported on first use (the engine is imported lazily)."""
    import gpu_zarr.engine.choice as choice

    return choice


@functools.cache
def _engine() -> tuple[Any, Any, Any]:
    """(EngineOptions, engine.read, CpuOps), imported on first use (an import statement on
    every read ran importlib's Python for each name)."""
    from gpu_zarr.engine import EngineOptions
    from gpu_zarr.engine import read as engine_read
    from gpu_zarr.engine.ops import CpuOps

    return EngineOptions, engine_read, CpuOps


_WHOLE = slice(None)


class _Staged:
    """A small GPU read's page-locked ``box`` (set by the reader) and its copy to the GPU:
    :meth:`prepare` (the read's ``on_sent``: while a remote read's requests travel) runs
    ``after`` (the caller's own ``on_sent``), then sets the copy up (:class:`_Upload`) as the
    result of ``out_shape``; :meth:`to_gpu` runs it, or copies as :func:`_to_gpu` does when it
    was not set up (a local read: no ``on_sent``)."""

    def __init__(self, out_shape: tuple[int, ...], after: Callable[[], None] | None = None) -> None:
        self.box: np.ndarray | None = None
        self.upload: _Upload | None = None
        self._out_shape = out_shape
        self._after = after

    def prepare(self) -> None:
        if self._after is not None:
            self._after()
        if self.box is not None:
            self.upload = _Upload(self.box, self._out_shape)

    def to_gpu(self, data: np.ndarray) -> Any:
        return self.upload.run(data) if self.upload is not None else _to_gpu(data)


class _Upload:
    """A copy of the C-contiguous ``host`` to a new cupy array of ``shape`` (its shape with
    axes of extent 1 dropped, or its own), set up ahead (the array, the stream, both
    addresses): :meth:`run` only copies and waits."""

    def __init__(self, host: np.ndarray, shape: tuple[int, ...]) -> None:
        import cupy

        from gpu_zarr.engine.native import address

        self.host = host
        self.dev = cupy.empty(shape, host.dtype)
        if self.dev.nbytes != host.nbytes:
            raise ValueError(f"a {host.shape} box cannot be uploaded as {shape}")
        self.stream = cupy.cuda.get_current_stream()
        self._address = address  # (imported here, while the requests travel, not after the answers)
        self.src, self.dst = address(host), self.dev.data.ptr

    def run(self, data: np.ndarray) -> Any:
        """The GPU copy of ``data``: ``host`` seen in ``shape`` (a view of all of it, as a
        read's result is), or else copied as :func:`_to_gpu` does."""
        import cupy

        if not (data.shape == self.dev.shape and data.dtype == self.host.dtype and data.flags.c_contiguous
                and self._address(data) == self.src):
            return _to_gpu(data)
        cupy.cuda.runtime.memcpyAsync(self.dst, self.src, self.host.nbytes, cupy.cuda.runtime.memcpyHostToDevice,
                                      self.stream.ptr)
        self.stream.synchronize()
        return self.dev


def _to_gpu(host: np.ndarray) -> Any:
    """A cupy copy of ``host``, finished before this returns (``host`` may be reused then)."""
    import cupy

    if host.ndim == 0 or not host.flags.c_contiguous:
        return cupy.asarray(host)
    dev = cupy.empty(host.shape, host.dtype)
    stream = cupy.cuda.get_current_stream()
    dev.set(host, stream=stream)
    stream.synchronize()
    return dev


class _ZarrBackend:
    """zarr-python reads, in chunk-aligned slabs when progress or cancel is asked for."""

    name = ""
    device = "cpu"
    layout = None

    def small_read_bytes(self, region: Any) -> int | None:
        return None

    def _read_all(self, arr: Any, selection: Any) -> Any:
        raise NotImplementedError

    def read(self, arr: Any, region: Any, selection: Any, *, options: Any, progress: Callable[[int, int], None] | None,
             cancel: Any, where: str) -> tuple[Any, dict[str, Any], str]:
        from gpu_zarr.engine.fit import check_fits

        nbytes = nbytes_of(region.box_shape, arr.dtype)
        check_fits(nbytes, 0 if region.is_box else nbytes, device=self.device,
                   what=f"reading {region.out_shape} {arr.dtype} of {arr.store_path}")

        def read(sel: Any) -> Any:
            try:
                return self._read_all(arr, sel)
            except CorruptChunkError as exc:
                if str(arr.store_path) in str(exc):
                    raise
                raise CorruptChunkError(f"{arr.store_path}: {exc}") from exc  # the store, then the chunk
            except GpuZarrError:
                raise
            except Exception as exc:  # noqa: BLE001 - re-raised, with the chunk named when we can
                raise _name_the_chunk(arr, sel, exc) from exc
        if progress is None and cancel is None and _negative_steps(arr.shape, selection):
            # zarr-python takes steps >= 1 only: the bounding box, then numpy's steps (as the slabs do)
            return read(_box(region))[region.post].copy(), {}, ""
        return _in_slabs(arr, region, selection, read, self.device, progress, cancel), {}, ""


class ZarrGpuBackend(_ZarrBackend):
    """zarr-python with GPU buffers and our codec pipeline (:func:`gpu_zarr.zarr_gpu.read_on_gpu`)."""

    name = "zarr-gpu"
    device = "gpu"

    def _read_all(self, arr: Any, selection: Any) -> Any:
        from gpu_zarr.zarr_gpu import read_on_gpu

        return read_on_gpu(arr, selection)


class CpuBackend(_ZarrBackend):
    """Host memory (numpy) through zarr-python with our codec pipeline (every chunk's size
    checked: :func:`gpu_zarr.zarr_gpu.read_on_host`), in native byte order."""

    name = "cpu"
    device = "cpu"

    def _read_all(self, arr: Any, selection: Any) -> Any:
        from gpu_zarr.zarr_gpu import read_on_host

        return read_on_host(arr, selection)


class CpuEngineBackend:
    """``"cpu"`` through the engine's native host path: chunks read, decoded and placed on
    native threads (:mod:`gpu_zarr.engine.native`), no Python per chunk; with the host chunk
    cache for viewers. Used where the native library is loaded and the engine reads the layout."""

    name = "cpu"

    def __init__(self, layout: Any, runtime: Any = None) -> None:
        self.layout = layout
        self._engine = EngineBackend(layout, runtime)

    def small_read_bytes(self, region: Any) -> int | None:
        return None

    def read(self, arr: Any, region: Any, selection: Any, *, options: Any, progress: Callable[[int, int], None] | None,
             cancel: Any, where: str) -> tuple[Any, dict[str, Any], str]:
        from gpu_zarr.engine import EngineOptions
        from gpu_zarr.engine import read as engine_read
        from gpu_zarr.engine.ops import CpuOps

        rt = self._engine.runtime
        opts = options or EngineOptions()
        if cancel is not None:  # (seen by the fetch too: a remote slab's transfers stop when it is set)
            opts = opts.with_(cancel=cancel)
        ops = CpuOps(rt.pool("cpu-decode", opts.threads), opts.threads, fast=True, runtime=rt)
        stats: dict[str, Any] = {}

        def read(sel: Any) -> Any:
            res = engine_read(None, sel, device="cpu", options=opts, layout=self.layout, ops=ops, runtime=rt)
            stats.update(res.stats)
            return res.data
        # progress and cancel between chunk-aligned slabs, as for zarr-python reads
        return _in_slabs(arr, region, selection, read, "cpu", progress, cancel), stats, ""


    def read_parts_into(self, parts: Any, out: np.ndarray, *, options: Any = None) -> tuple[dict[str, Any], str]:
        """Read boxes of several arrays of this one's chunk format into their places in ``out``
        with ONE engine read on native threads (see :meth:`EngineBackend.read_parts_into`)."""
        return (_read_parts_on_host(self._engine.runtime, parts, out, options),
                f"; one engine read of {len(parts)} arrays on native threads")


def _read_parts_on_host(rt: Any, parts: Any, out: np.ndarray, options: Any) -> dict[str, Any]:
    """The host half of ``read_parts_into``: one engine read on the small-read path (chunks
    read, decoded and placed on native threads), straight into ``out``."""
    from gpu_zarr.engine import EngineOptions, read_many
    from gpu_zarr.engine.ops import CpuOps

    opts = (options or EngineOptions()).with_(reader="threads")
    ops = CpuOps(rt.pool("cpu-decode", opts.threads), opts.threads, fast=True, runtime=rt)
    return read_many(parts, device="cpu", options=opts, ops=ops, runtime=rt, out=out).stats

def _name_the_chunk(arr: Any, selection: Any, exc: Exception) -> Exception:
    """zarr-python's own message names no chunk ("Zstd decompression error: invalid input
    data"): find the chunk with the engine's CPU twin, which checks and decodes chunk by
    chunk and names the first bad one. Anything else is wrapped with the store path."""
    from gpu_zarr.engine import EngineOptions
    from gpu_zarr.engine import read as engine_read
    from gpu_zarr.errors import CorruptChunkError

    try:
        engine_read(arr, selection, device="cpu", options=EngineOptions(reader="threads"))
    except CorruptChunkError as found:
        return CorruptChunkError(f"{arr.store_path}: {found} (zarr-python reported: {type(exc).__name__}: {exc})")
    except Exception:  # noqa: BLE001 - the twin cannot tell either (e.g. a codec it has no stage for)
        pass
    if isinstance(exc, MemoryError):
        return exc
    return CorruptChunkError(f"{arr.store_path}: zarr-python could not decode this array's chunks: "
                             f"{type(exc).__name__}: {exc}. Expected chunks that decode to the array's chunk "
                             "shape and dtype; the store may be damaged or written by an incompatible writer.")


def _negative_steps(shape: tuple[int, ...], selection: Any) -> bool:
    """Whether a basic selection has a slice with a negative step."""
    from gpu_zarr.engine.plan import normalize_key

    return any(isinstance(s, slice) and s.step < 0 for s in normalize_key(tuple(shape), selection))


def _box(region: Any) -> tuple[slice, ...]:
    """The step-1 bounding box of a region, as a selection."""
    return tuple(slice(a, b) for a, b in zip(region.start, region.stop))


def _in_slabs(arr: Any, region: Any, selection: Any, read: Callable[[Any], Any], device: str,
              progress: Callable[[int, int], None] | None, cancel: Any, parts: int = 16) -> Any:
    """``read(selection)`` in chunk-aligned slabs along the first axis, so that zarr-python
    reads report progress and can be cancelled between slabs. Without a progress callback
    or cancel event it is one plain read."""
    if progress is None and cancel is None or arr.ndim == 0:
        return read(selection)
    box = region.box_shape
    total = nbytes_of(region.out_shape, arr.dtype)
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


def _cpu(arr: Any, why: str, runtime: Any) -> tuple[ReadBackend, BackendChoice]:
    """The CPU backend: the engine's native host path where it serves the array, else zarr-python."""
    from gpu_zarr.engine import native
    from gpu_zarr.engine.metadata import describe, layout_of

    if arr is None or not native.available():
        how = "numpy via zarr-python" + ("" if arr is None else f" (native host path not loaded: {native.status().reason})")
        return CpuBackend(), BackendChoice("cpu", f"{why}: {how}")
    try:
        lay = layout_of(arr)
    except UnsupportedArrayError as exc:
        return CpuBackend(), BackendChoice("cpu", f"{why}: numpy via zarr-python (the native host path cannot: {exc})")
    how = "chunks read and placed on native threads" if lay.host is not None else \
        "chunks read, decoded and placed on native threads"
    return CpuEngineBackend(lay, runtime), BackendChoice("cpu", f"{why}: native host path ({describe(lay)}; {how})")


def choose(arr: Any, prefer: str, caps: Any, runtime: Any = None) -> tuple[ReadBackend, BackendChoice]:
    """The backend for ``arr`` (opened) under ``prefer`` on a machine that offers ``caps``
    (:func:`gpu_zarr.capabilities.probe`), and why.

    Raises
    ------
    ValueError
        ``prefer`` is not a backend name.
    GPUUnavailable, UnsupportedArrayError
        A forced backend cannot serve here.
    """
    check_backend(prefer)
    if prefer == "cpu":
        return _cpu(arr, "forced", runtime)
    if not caps.gpu:
        if prefer == "auto":
            return _cpu(arr, "no usable GPU" + (f" ({caps.notes[0]})" if caps.notes else ""), runtime)
        raise GPUUnavailable(f"backend {prefer!r} needs a CUDA GPU, and none is usable here: "
                             f"{caps.backend_status(prefer)[1]}. Use prefer='cpu', or {INSTALL_HINT}.")
    if prefer == "zarr-gpu":
        return ZarrGpuBackend(), BackendChoice("zarr-gpu", "forced: " + caps.backend_status("zarr-gpu")[1])
    from gpu_zarr.engine.codecs.chain import stage_for
    from gpu_zarr.engine.metadata import describe, layout_of

    try:
        lay = layout_of(arr)
        if stage_for(lay).nvcomp and not caps.nvcomp:  # the stage's GPU decode calls nvCOMP
            raise UnsupportedArrayError(
                f"this array is {lay.codec}-compressed and nvCOMP is not installed, so the direct engine "
                f"cannot decode it on the GPU: {INSTALL_HINT}")
    except UnsupportedArrayError as exc:
        if prefer == "kvikio":
            raise
        return ZarrGpuBackend(), BackendChoice("zarr-gpu", f"direct engine cannot serve: {exc}")
    tag = "forced" if prefer == "kvikio" else "fastest path"
    return EngineBackend(lay, runtime), BackendChoice(
        "kvikio", f"{tag}: {describe(lay)}; {caps.backend_status('kvikio')[1]}")
