"""The public write functions: :func:`write_zarr` and :func:`write_ome_zarr`.

The flow (DESIGN.md, "Writing"): plan units and levels -> downsample (on the GPU when the
data is there) -> encode in batches (nvCOMP, or numcodecs: the CPU twin) -> write files
into a temporary folder -> rename it into place.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_zarr import settings
from gpu_zarr.errors import INSTALL_HINT, GPUUnavailable, UsageError
from gpu_zarr.memory import PeakSampler
from gpu_zarr.write.codecs import CodecSpec, codec_spec
from gpu_zarr.write.encode import GPU_CODECS, CpuEncoder, GpuEncoder
from gpu_zarr.write.metadata import array_documents
from gpu_zarr.write.output import open_destination
from gpu_zarr.write.plan import WritePlan, make_plan
from gpu_zarr.write.source import Source, as_source, is_cupy, is_dask
from gpu_zarr.write.writer import Progress, Stages, write_array

__all__ = ["ENCODERS", "ArrayJob", "WriteResult", "choose_encoder", "measured", "run_jobs",
           "write_zarr"]

ENCODERS = ("auto", "gpu", "cpu")


@dataclass
class WriteResult:
    """A finished write and what was measured.

    Attributes
    ----------
    path : str
        The array or group written.
    arrays : list of str
        Paths of the arrays written, relative to ``path`` ("" for a lone array).
    nbytes : int
        Decoded bytes written (every level and label included).
    stored_bytes : int
        Bytes of the chunk and shard files (metadata excluded).
    seconds : float
        Wall time, from the call to the final rename.
    gib_per_s : float
        ``nbytes`` per second, in GiB/s.
    encoder, reason : str
        "gpu" (nvCOMP) or "cpu" (numcodecs), and why.
    stages : dict of str to float
        Seconds per stage (read, transfer, downsample, gather, encode, copy: a GPU batch's
        frames to the host and walked, write, metadata, commit), summed over lanes:
        overlapping lanes can add up past ``seconds``.
    host_peak_bytes : int or None
        Peak growth of the process's resident host memory during the call, above its value
        when the call began, sampled every 2 ms (:class:`gpu_zarr.memory.PeakSampler`): the
        blocks read, gathered and encoded chunks of the batches in flight, a pyramid computed
        in host memory (a GPU write's frames pass through the runtime's pinned staging, which
        it keeps: counted by the write that first needs it). None where it cannot be measured.
    device_peak_bytes : int or None
        Peak growth of the bytes in use in cupy's memory pool during the call, sampled alike:
        the GPU copy of host data, pyramid levels, gathered chunks and packed frames. None when
        the GPU took no part.
    memory : str
        How the two were measured.

    Notes
    -----
    The memory figures are process-wide: other work running beside the write counts too.
    nvCOMP allocates its encode outputs and scratch itself, outside cupy's pool, so
    ``device_peak_bytes`` leaves them out (``gpu-zarr bench --mode write`` samples the
    device's free memory as well, which sees them). Measuring changes nothing in the
    process (no reset of its high-water mark, no freeing of cupy's cached blocks).
    """

    path: str
    arrays: list[str]
    nbytes: int
    stored_bytes: int
    seconds: float
    gib_per_s: float
    encoder: str
    reason: str
    stages: dict[str, float] = field(default_factory=dict)
    host_peak_bytes: int | None = None
    device_peak_bytes: int | None = None
    memory: str = ""

    @property
    def ratio(self) -> float:
        """Compression ratio (decoded bytes over stored bytes)."""
        return self.nbytes / self.stored_bytes if self.stored_bytes else math.inf


def _gpu_takes_part(data: Any, encoder: str) -> bool:
    """Whether a write of ``data`` may use the GPU (its data is there, or it may encode there)."""
    if is_cupy(data) or (isinstance(data, Source) and data.on_gpu):
        return True
    if is_dask(data) and is_cupy(getattr(data, "_meta", None)):
        return True
    return encoder != "cpu" and _gpu_ready()[0]


def measured(data: Any, encoder: str, write: Callable[[], WriteResult]) -> WriteResult:
    """Run ``write()`` (a whole public write) and return its result with its peak memory,
    sampled (:class:`gpu_zarr.memory.PeakSampler`: nothing of the caller's process is reset,
    freed or synchronised)."""
    on_gpu = _gpu_takes_part(data, encoder)
    with PeakSampler(gpu=on_gpu) as mem:
        res = write()
    res.host_peak_bytes, res.device_peak_bytes = mem.host_bytes, mem.gpu_bytes if on_gpu else None
    res.memory = f"host resident set, {mem.method}" + ("; GPU: cupy's pool in use" if on_gpu else "")
    return res


@dataclass
class ArrayJob:
    """One array of a write: its data, plan, place in the tree and metadata attributes."""

    source: Source
    plan: WritePlan
    prefix: str
    fill_value: Any = 0
    attributes: Mapping[str, Any] | None = None
    dimension_names: Sequence[str] | None = None


def _gpu_ready() -> tuple[bool, str]:
    from gpu_zarr.capabilities import probe

    caps = probe()
    if not caps.gpu:
        return False, "no usable CUDA GPU (cupy missing or no device)"
    if not caps.nvcomp:
        return False, "nvCOMP is not usable here"
    return True, ""


def choose_encoder(spec: CodecSpec, encoder: str, threads: int) -> tuple[Any, str]:
    """The encoder for ``spec`` (``"auto"``, ``"gpu"`` or ``"cpu"``) and the reason for it.

    Raises
    ------
    UsageError
        An unknown encoder name, or ``"gpu"`` for a codec nvCOMP does not write.
    GPUUnavailable
        ``"gpu"`` on a machine without a usable GPU or nvCOMP.
    """
    if encoder not in ENCODERS:
        raise UsageError(f"encoder={encoder!r}: expected one of {', '.join(ENCODERS)}")
    if encoder == "cpu":
        return CpuEncoder(spec, threads), "asked for the CPU encoder (numcodecs)"
    if spec.name not in GPU_CODECS:
        if encoder == "gpu":
            raise UsageError(f"encoder='gpu' writes {', '.join(GPU_CODECS)}; codec {spec.name!r} is encoded on "
                             "the CPU (encoder='cpu' or 'auto')")
        return CpuEncoder(spec, threads), f"{spec.name} is encoded by numcodecs on CPU threads"
    ok, why = _gpu_ready()
    if not ok:
        if encoder == "gpu":
            raise GPUUnavailable(f"encoder='gpu' needs a CUDA GPU with nvCOMP: {why}. Fix: {INSTALL_HINT}, "
                                 "or encoder='cpu'")
        return CpuEncoder(spec, threads), f"CPU twin (numcodecs): {why}"
    from gpu_zarr.engine.runtime import get_runtime

    return GpuEncoder(spec, get_runtime()), "nvCOMP batched zstd encode on the GPU"


def encode_batch_bytes(on_gpu: bool, lanes: int) -> int:
    """Data bytes a lane encodes at once: ``batch_bytes`` on the CPU; on the GPU
    ``write_batch_bytes``, or (0) as much as a quarter of the free GPU memory holds with each
    lane's batch counted three times (the chunks, nvCOMP's output, the packed frames; on the host
    once: the blocks read, the frames passing through a fixed staging buffer), between
    ``batch_bytes`` and 2 GiB: nvCOMP's batched encode costs about the same per call whatever
    it holds, so fewer, bigger calls write faster (``benchmarks/README.md``, the writer)."""
    base = int(settings.get("batch_bytes"))
    if not on_gpu:
        return base
    fixed = int(settings.get("write_batch_bytes"))
    if fixed:
        return fixed
    from gpu_zarr.engine.fit import device_memory, host_available_bytes

    free, _ = device_memory()
    host = host_available_bytes() or free  # the blocks read of each lane, on the host
    return int(max(base, min(2 << 30, free // 4 // (3 * max(1, lanes)), host // 4 // max(1, lanes))))


def _array_documents(job: ArrayJob, spec: CodecSpec) -> dict[str, bytes]:
    """The metadata documents of ``job``'s array.

    Raises
    ------
    UsageError
        zarr-python refuses the fill value for the array's dtype (out of range, NaN for an
        integer dtype, a complex or text value it cannot convert).
    """
    try:
        return array_documents(job.plan, spec, fill_value=job.fill_value, attributes=job.attributes,
                               dimension_names=job.dimension_names)
    except (TypeError, ValueError, OverflowError) as exc:
        raise UsageError(f"fill_value={job.fill_value!r} is not a value of the array's dtype {job.plan.dtype}: "
                         f"{exc}") from exc


def run_jobs(path: str | os.PathLike[str], jobs: list[ArrayJob], groups: Mapping[str, dict[str, bytes]],
             spec: CodecSpec, *, encoder: str, overwrite: bool, stages: Stages | None = None,
             t0: float | None = None, storage_options: Mapping[str, Any] | None = None) -> WriteResult:
    """Write ``jobs`` (arrays) and ``groups`` (prefix -> group documents) as one tree at ``path``
    (a local folder, or a remote store with ``storage_options``).

    The metadata goes last, the arrays' and then the groups' (deepest first, the root last):
    a remote write, which has no final rename, never shows a node before its data is there.
    """
    t0 = time.perf_counter() if t0 is None else t0
    stages = stages or Stages()
    # made first (in memory): a fill value zarr refuses for the dtype fails before anything is written
    docs = [_array_documents(job, spec) for job in jobs]
    dest = open_destination(path, overwrite=overwrite, storage_options=storage_options)
    threads = int(settings.get("threads"))
    enc, reason = choose_encoder(spec, encoder, threads)
    progress = Progress(sum(j.source.nbytes for j in jobs))
    stored = 0
    try:
        from gpu_zarr.engine.runtime import get_runtime

        writers = get_runtime().pool("write-files", threads)  # kept: no threads started per write
        lanes = int(settings.get("lanes"))
        batch = encode_batch_bytes(enc.xp_name == "cupy", lanes)
        for job in jobs:
            stored += write_array(job.source, job.plan, enc, dest, job.prefix, fill_value=job.fill_value,
                                  stages=stages, progress=progress, batch_bytes=batch, lanes=lanes, writers=writers)
        with stages.time("metadata"):
            for job, job_docs in zip(jobs, docs, strict=True):
                dest.write_documents(job.prefix, job_docs)
            for prefix in sorted(groups, key=lambda p: -len([s for s in p.split("/") if s])):
                dest.write_documents(prefix, groups[prefix])
        with stages.time("commit"):
            dest.commit()
    except BaseException:
        dest.abort()
        raise
    finally:
        enc.close()
    seconds = time.perf_counter() - t0
    nbytes = sum(j.source.nbytes for j in jobs)
    return WriteResult(str(dest.path), [j.prefix for j in jobs], nbytes, stored, seconds,
                       nbytes / seconds / 2**30 if seconds > 0 else 0.0, enc.name, reason, dict(stages.seconds))


def write_zarr(data: Any, path: str | os.PathLike[str], *, chunks: Sequence[int] | int,
               shards: Sequence[int] | int | bool | None = None, codec: str | None = "zstd",
               level: int | None = None, zarr_format: int = 3, fill_value: Any = 0, overwrite: bool = False,
               encoder: str = "auto", storage_options: Mapping[str, Any] | None = None) -> WriteResult:
    """Write an array (numpy, cupy, or dask of either) as a zarr array.

    Parameters
    ----------
    data : numpy.ndarray, cupy.ndarray or dask.array.Array
        A dask array is written block by block as its blocks are computed: at most
        ``settings.get("lanes")`` batches of about ``batch_bytes`` are in memory at once.
    path : str or path
        A local folder, or a remote store's URL (``s3://``, ``gs://``, ``http(s)://``); it
        must not hold a zarr unless ``overwrite=True``.
    chunks : int or sequence of int
        Chunk shape (the inner chunks of a sharded array).
    shards : sequence of int, None or False
        Shard shape (a multiple of ``chunks``); None: sharded, shards of about
        ``settings.get("shard_bytes")``; False: no shards. v2 arrays have none.
    codec : {"zstd", "blosc-lz4", "blosc-zstd", "gzip", None}
        Compression (Blosc with byte shuffle); None writes raw bytes.
    level : int, optional
        Compression level (default: zstd 3, Blosc 5, gzip 5).
    zarr_format : {3, 2}
    fill_value : scalar or None
        Stored in the metadata and used to pad edge chunks; None is zarr-python's default
        (0, False). It must be a value of the dtype (zarr-python's rules).
    overwrite : bool
        Replace an existing zarr at ``path`` (never a folder, or objects, that are not a zarr).
    encoder : {"auto", "gpu", "cpu"}
        Where chunks are encoded: nvCOMP on the GPU (zstd), or numcodecs on CPU threads.
    storage_options : mapping, optional
        Options of a remote ``path`` (credentials, endpoint, ``requests`` in flight: as the
        reader's, :mod:`gpu_zarr.location`).

    Returns
    -------
    WriteResult

    Raises
    ------
    UsageError
        A bad argument (chunk/shard shape, codec, level, data type, a fill value the dtype cannot hold).
    DestinationExists
        ``path`` exists and ``overwrite`` is False.
    WriteError
        The file system or store refused (read-only, full, permissions) or there is not
        enough free space; nothing that looks complete is left at ``path``.
    GPUUnavailable
        ``encoder="gpu"`` without a usable GPU and nvCOMP.

    Notes
    -----
    A local write goes into a temporary folder beside ``path``, renamed into place once
    complete; a remote one puts the metadata last (:mod:`gpu_zarr.write.remote`). Either way
    an interrupted write never leaves an array that looks complete. ``host_peak_bytes`` and
    ``device_peak_bytes`` of the result say what memory the write took beyond its input: on the
    host about ``lanes`` batches (``batch_bytes``, or one shard when a shard is bigger) of
    blocks, gathered chunks and encoded chunks, whatever the array's size.
    """
    return measured(data, encoder, lambda: _write_zarr(
        data, path, chunks=chunks, shards=shards, codec=codec, level=level, zarr_format=zarr_format,
        fill_value=fill_value, overwrite=overwrite, encoder=encoder, storage_options=storage_options))


def _write_zarr(data: Any, path: str | os.PathLike[str], *, chunks: Sequence[int] | int,
                shards: Sequence[int] | int | bool | None, codec: str | None, level: int | None, zarr_format: int,
                fill_value: Any, overwrite: bool, encoder: str,
                storage_options: Mapping[str, Any] | None) -> WriteResult:
    """:func:`write_zarr`'s work, inside its memory measurement."""
    t0 = time.perf_counter()
    source = as_source(data)
    dtype = source.dtype.newbyteorder("<") if source.dtype.byteorder == ">" else source.dtype
    spec = codec_spec(codec, level, dtype.itemsize)
    plan = make_plan(source.shape, dtype, chunks, shards, zarr_format,
                     shard_bytes=int(settings.get("shard_bytes")))
    return run_jobs(path, [ArrayJob(source, plan, "", fill_value)], {}, spec, encoder=encoder,
                    overwrite=overwrite, t0=t0, storage_options=storage_options)
