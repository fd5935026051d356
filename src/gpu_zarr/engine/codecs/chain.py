"""A codec chain as a sequence of steps: parsed from zarr's metadata, decoded as one stage.

:func:`parse_v3` and :func:`parse_v2` split a chain into the steps the engine runs
(:mod:`gpu_zarr.engine.codecs`): checksum frames, one core stage, the element and byte order
-- or, for a chain with a step the engine has no implementation of, the frames and then the
codecs' own decode (:class:`~gpu_zarr.engine.codecs.host.HostChain`). :func:`stage_for` gives
the stage that decodes a layout's chunks: the core stage alone when the chain is just that,
else a :class:`ChainStage` that runs the steps in order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_zarr.engine.binary import align_up
from gpu_zarr.engine.codecs import CodecStage, stage_named, stages
from gpu_zarr.engine.codecs import elements as el
from gpu_zarr.engine.codecs.frames import Frame, frame_of, strip_frames
from gpu_zarr.engine.codecs.host import HostChain, decode_host_batch
from gpu_zarr.errors import UnsupportedArrayError

if TYPE_CHECKING:  # annotations only
    from gpu_zarr.engine.layout import Layout
    from gpu_zarr.engine.ops import Ops
    from gpu_zarr.engine.plan import Batch

__all__ = ["HOST", "Chain", "ChainStage", "parse_v2", "parse_v3", "stage_for", "steps_label"]

HOST = "host"  # Layout.codec of a chain decoded by its codecs' own decode


@dataclass(frozen=True)
class Chain:
    """The steps of one chunk's codec chain, as the engine runs them.

    Attributes
    ----------
    codec : str
        The core stage (a registered stage's name), or :data:`HOST`.
    params : mapping
        The core stage's parameters.
    endian : str or None
        Byte order of the ``bytes`` step (None: one-byte elements or the codecs' own decode).
    transpose : tuple of int or None
        Element order of the stored chunk (placed by the place step); None for C order.
    frames : tuple of Frame
        Checksum frames, outermost first (verified and stripped before the core).
    host : HostChain or None
        The codecs' own decode of everything inside the frames, when the core is :data:`HOST`.
    elements : tuple of ElementStep
        Element steps after the core, in decode order (:mod:`.elements`: v2 filters, v3
        ``numcodecs.*`` array-to-array codecs); the core then decodes to the first step's
        stored dtype.
    """

    codec: str
    params: Mapping[str, Any]
    endian: str | None
    transpose: tuple[int, ...] | None
    frames: tuple[Frame, ...]
    host: HostChain | None
    elements: tuple[el.ElementStep, ...] = ()


def _names(codecs: Sequence[Any]) -> str:
    out = []
    for c in codecs:
        name = getattr(c, "codec_name", None) or getattr(c, "codec_id", None)
        if name is None:
            name = type(c).__name__.removesuffix("Codec").lower()
        out.append(str(name).removeprefix("numcodecs."))
    return ", ".join(out)


def parse_v3(codecs: Sequence[Any], spec: Callable[[], Any], out_dtype: np.dtype) -> Chain:
    """The steps of a zarr v3 chain (``spec()``: zarr's ArraySpec of one chunk of it, asked for
    only when the codecs' own decode needs it).

    Trailing ``crc32c`` codecs become frames; ``[transpose?, bytes, <core>?]`` becomes the core
    stage that recognises ``<core>`` (``raw`` when there is none); ``numcodecs.*``
    array-to-array codecs in place of the transpose, and a ``numcodecs.shuffle`` before the
    core, become element steps after it where they have exact ones (:mod:`.elements`); any
    other chain is decoded by its codecs (:data:`HOST`).
    """
    from zarr.abc.codec import ArrayArrayCodec, ArrayBytesCodec
    from zarr.codecs import BytesCodec

    rest = list(codecs)
    frames: list[Frame] = []
    while rest and (f := frame_of(rest[-1])) is not None:
        frames.append(f)  # the last codec's checksum is the outermost
        rest.pop()
    aa = [c for c in rest if isinstance(c, ArrayArrayCodec)]
    ab = [c for c in rest if isinstance(c, ArrayBytesCodec)]
    bb = [c for c in rest if not isinstance(c, (ArrayArrayCodec, ArrayBytesCodec))]
    perm: tuple[int, ...] | None = None
    plain_aa = not aa or (len(aa) == 1 and type(aa[0]).__name__ == "TransposeCodec")
    steps = () if plain_aa else _v3_elements(aa, ab, spec, out_dtype)
    if steps is not None and len(bb) == 2:  # [bytes, numcodecs.shuffle, <core>]: the unshuffle runs first
        lead = _v3_shuffle(bb[0], ab, steps[0].stored if steps else out_dtype)
        steps, bb = (None, bb) if lead is None else ((*lead, *steps), bb[1:])
    if (plain_aa or steps is not None) and len(ab) == 1 and isinstance(ab[0], BytesCodec) and len(bb) <= 1:
        if aa and plain_aa:
            perm = tuple(int(a) for a in getattr(aa[0], "order"))  # noqa: B009 - a TransposeCodec
            perm = None if perm == tuple(range(len(perm))) else perm
        endian = _endian(ab[0])
        for stage in stages():
            if (params := stage.recognise_v3(tuple(bb))) is not None:
                return Chain(stage.name, params, None if steps else endian, perm, tuple(frames), None, steps or ())
    if not ab:
        raise UnsupportedArrayError(f"a zarr v3 codec chain needs one array-to-bytes codec; this one is [{_names(codecs)}]")
    host = HostChain(tuple(rest), spec(), out_dtype, _names(rest))
    return Chain(HOST, {}, None, None, tuple(frames), host)


def _endian(codec: Any) -> str | None:
    """The byte order a v3 ``bytes`` codec writes ("little", "big"; None for one-byte elements)."""
    endian = getattr(codec, "endian", None)
    return getattr(endian, "value", endian)


def _v3_elements(aa: Sequence[Any], ab: Sequence[Any], spec: Callable[[], Any],
                 out_dtype: np.dtype) -> tuple[el.ElementStep, ...] | None:
    """The element steps of a v3 chain's array-to-array codecs when every one is a
    ``numcodecs.*`` filter with an exact step (no ``transpose``: the steps run in stored
    order), the ``bytes`` step is little-endian or sees one-byte elements, and zarr's bytes
    step decodes the elements the first step reads; else None."""
    if len(ab) != 1 or not all(str(getattr(c, "codec_name", "")).startswith("numcodecs.") for c in aa):
        return None
    try:
        steps = el.element_steps([c._codec for c in aa], out_dtype)
        if not steps:
            return steps
        s = spec()
        for c in aa:  # the spec zarr's bytes step decodes with, as zarr resolves it
            s = c.resolve_metadata(s)
        stored = np.dtype(s.dtype.to_native_dtype())
    except Exception:  # noqa: BLE001 - a filter the steps don't know: the codecs' own decode reads it
        return None
    endian = _endian(ab[0])
    if stored.itemsize != steps[0].stored.itemsize or (stored.itemsize > 1 and endian not in ("little", None)):
        return None
    return steps


def _v3_shuffle(codec: Any, ab: Sequence[Any], after: np.dtype) -> tuple[el.ElementStep, ...] | None:
    """The element step of a v3 ``numcodecs.shuffle`` bytes codec whose elements are ``after``'s
    size, with a little-endian ``bytes`` step; else None."""
    if str(getattr(codec, "codec_name", "")) != "numcodecs.shuffle" or len(ab) != 1:
        return None
    try:
        lead = el.element_steps([codec._codec], after)
    except Exception:  # noqa: BLE001 - the codecs' own decode reads it
        return None
    endian = _endian(ab[0])
    if lead and np.dtype(after).itemsize > 1 and endian not in ("little", None):
        return None
    return lead


def parse_v2(compressor: Any, filters: Sequence[Any] | None, dtype: np.dtype, order: str, shape: Sequence[int],
             spec: Callable[[], Any], out_dtype: np.dtype) -> Chain:
    """The steps of a zarr v2 array: a compressor a core stage recognises, after filters that
    are all element steps (C order, the array's dtype in the machine's byte order); else the
    codecs' own decode of the filters and compressor (:data:`HOST`)."""
    ndim = len(shape)
    perm = tuple(range(ndim))[::-1] if order == "F" and ndim > 1 else None
    steps = el.element_steps(filters, dtype) if filters else ()
    if steps is not None and (not steps or (perm is None and dtype.isnative)):
        stored = steps[0].stored if steps else dtype
        for stage in stages():
            if (params := stage.recognise_v2(compressor, stored)) is not None:
                return Chain(stage.name, params, None, perm, (), None, steps)
    from zarr.codecs._v2 import V2Codec

    codecs = [*(filters or ()), *([compressor] if compressor is not None else [])]
    host = HostChain((V2Codec(filters=tuple(filters) if filters else None, compressor=compressor),), spec(), out_dtype,
                     _names(codecs) or "no compressor")
    return Chain(HOST, {}, None, None, (), host)


def steps_label(lay: Layout, where: str = "") -> str:
    """What decodes a layout's chunks, step by step (for descriptions and reasons), e.g.
    ``"crc32c checked on the host, zstd"``; ``where`` says where the core runs."""
    parts = [f"{f.name} checked on the host" for f in lay.frames]
    if lay.host is not None:
        parts.append(f"{lay.host.label} by the codecs' own decode on CPU threads")
    else:
        stage = stage_named(lay.codec)
        label = stage.label(lay.codec_params) if stage is not None else lay.codec
        parts.append(label + (f" {where}" if where and lay.codec != "raw" else ""))
        if lay.elements:
            parts.append(el.label(lay.elements) + (f" {where}" if where else ""))
    return ", ".join(parts)


@dataclass
class _Prep:
    batch: Batch  # the batch with the frames stripped from its sizes
    core: Any  # the core stage's host half, or None
    host: np.ndarray | None  # the chunks decoded on the host (HOST chains)


class ChainStage:
    """The steps of a chain run as one stage: the frames stripped on the host, then the core
    stage (on the GPU or native threads, as the ops decide) and its element steps on the same
    stream, or the codecs' own decode on the runtime's worker threads, whose output is uploaded
    and placed like any other."""

    v2_names: tuple[str, ...] = ()
    v3_chains: tuple[str, ...] = ()
    native = None  # the native whole-chunk paths know no frames and no host steps
    decodes = True
    native_checks = False  # the host half (frames, host decode) runs on every path
    device_checks = False

    def __init__(self, core: CodecStage | None, runtime: Any = None) -> None:
        self.core = core
        self.name = core.name if core is not None else HOST
        self.nvcomp = bool(core is not None and core.nvcomp)
        self._runtime = runtime

    @staticmethod
    def _core_layout(lay: Layout) -> Layout:
        """What the core stage sees: chunks of the first element step's stored dtype."""
        return replace(lay, disk_dtype=lay.elements[0].stored, elements=()) if lay.elements else lay

    def recognise_v2(self, compressor: Any, dtype: np.dtype) -> dict[str, Any] | None:
        return None

    def recognise_v3(self, chain: Sequence[Any]) -> dict[str, Any] | None:
        return None

    def label(self, params: Mapping[str, Any]) -> str:
        return self.core.label(params) if self.core is not None else HOST

    def _pool(self) -> Any:
        if self._runtime is None:
            return None
        import os

        return self._runtime.pool("host-decode", os.cpu_count() or 1)

    def prepare(self, staging: np.ndarray, batch: Batch, lay: Layout, names: Sequence[str]) -> _Prep:
        sizes = batch.src_sizes
        if lay.frames:
            sizes = strip_frames(staging, batch.src_offsets, batch.src_sizes, lay.frames, names, self._pool())
        inner = replace(batch, src_sizes=sizes)
        if lay.host is not None:
            n, stride = len(sizes), int(align_up(lay.inner_nbytes))
            out = self._runtime.recycled.take(n * stride) if self._runtime is not None else np.empty(n * stride, np.uint8)
            decode_host_batch(lay.host, staging, inner.src_offsets, sizes, out, stride, lay.inner_nbytes, names,
                              self._pool())
            return _Prep(inner, None, out)
        core = self.core
        assert core is not None
        # the core's host check where some path needs it (nvCOMP is undefined on corrupt input)
        checked = core.decodes and not (core.device_checks and core.native_checks)
        return _Prep(inner, core.prepare(staging, inner, self._core_layout(lay), names) if checked else None, None)

    def decode(self, ops: Ops, src: Any, batch: Batch, prep: _Prep, dst: Any, dst_offsets: np.ndarray,
               lay: Layout, names: Sequence[str], slot: int, wait: Any) -> None:
        n = len(batch.pieces)
        sizes = np.full(n, lay.inner_nbytes, np.int64)
        if prep.host is not None:
            stride = int(align_up(lay.inner_nbytes))
            dev = ops.to_device(prep.host[:n * stride], slot)
            ops.copy_spans(dev, np.arange(n, dtype=np.int64) * stride, dst, dst_offsets, sizes, slot, wait=wait)
            return
        core = self.core
        assert core is not None
        if lay.elements:
            self._decode_elements(ops, src, prep, dst, dst_offsets, lay, names, slot, wait)
        elif core.decodes:
            core.decode(ops, src, prep.batch, prep.core, dst, dst_offsets, lay, names, slot, wait)
        else:  # uncompressed inside its frames: the stripped bytes are the chunk
            ops.copy_spans(src, prep.batch.src_offsets, dst, dst_offsets, sizes, slot, wait=wait)

    def _decode_elements(self, ops: Ops, src: Any, prep: _Prep, dst: Any, dst_offsets: np.ndarray, lay: Layout,
                         names: Sequence[str], slot: int, wait: Any) -> None:
        """The core decodes the batch into scratch (the first step's stored dtype), then the
        element steps turn it into the decoded chunks, on the same stream. Every step sees its
        chunks end to end (one array call a step for the whole batch, whatever the chunk size);
        when ``dst`` spaces them otherwise, the last step writes into scratch and one copy
        moves them into place."""
        core, inner = self.core, self._core_layout(lay)
        assert core is not None
        n, m = len(prep.batch.pieces), int(np.prod(lay.inner_shape, dtype=np.int64))
        stored, size = int(inner.inner_nbytes), int(lay.inner_nbytes)
        mid = ops.scratch(n * stored, slot)
        packed = np.arange(n, dtype=np.int64)
        if core.decodes:
            core.decode(ops, src, prep.batch, prep.core, mid, packed * stored, inner, names, slot, wait)
        else:
            ops.copy_spans(src, prep.batch.src_offsets, mid, packed * stored, np.full(n, stored, np.int64), slot,
                           wait=wait)
        dst_offsets = np.asarray(dst_offsets[:n], np.int64)
        in_place = bool((dst_offsets == dst_offsets[0] + packed * size).all()) if n else True
        out = dst[int(dst_offsets[0]):] if in_place and n else ops.scratch(n * size, slot)
        ops.elementwise(lambda xp, lo, hi: el.run(xp, lay.elements, mid, out, lo, hi, m,
                                                  lambda nbytes: ops.scratch(nbytes, slot)), n, slot)
        if not in_place:
            ops.copy_spans(out, packed * size, dst, dst_offsets, np.full(n, size, np.int64), slot)

    def scratch_bytes(self, chunks_per_batch: int, lay: Layout) -> int:
        if self.core is None:  # the decoded batch, uploaded before it is copied into place
            return chunks_per_batch * int(align_up(lay.inner_nbytes))
        inner = self._core_layout(lay)
        # element steps: the core's output, and between two steps, a step's wider working dtype
        # or the last step's output before its copy into place: at most three decoded batches
        steps = (int(inner.inner_nbytes) + 3 * int(lay.inner_nbytes)) if lay.elements else 0
        return self.core.scratch_bytes(chunks_per_batch, inner) + chunks_per_batch * steps


def stage_for(lay: Layout, runtime: Any = None) -> CodecStage:
    """The stage that decodes a layout's chunks: its core stage, composed with the chain's
    frames and host steps when it has any (a :class:`ChainStage`, whose host steps run on
    ``runtime``'s worker threads; on the calling thread without one).

    Raises
    ------
    UnsupportedArrayError
        No stage for the layout's codec.
    """
    if lay.host is not None:
        return ChainStage(None, runtime)
    stage = stage_named(lay.codec)
    if stage is None:
        raise UnsupportedArrayError(f"the direct engine has no decoder for {lay.codec!r} chunks")
    return ChainStage(stage, runtime) if lay.frames or lay.elements else stage
