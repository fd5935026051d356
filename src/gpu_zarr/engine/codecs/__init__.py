"""The engine's codec steps, one module each, and the registry of the core codecs.

A zarr codec chain is decoded as a sequence of steps (:mod:`gpu_zarr.engine.codecs.chain` parses
it from the array metadata):

1. **frames** -- checksums that wrap a chunk's bytes (``crc32c``, :mod:`.frames`): verified and
   stripped on the host, natively, before anything else reads the bytes; a mismatch is a
   :class:`~gpu_zarr.errors.CorruptChunkError` naming the chunk.
2. **the core codec** -- one *stage* (:class:`CodecStage`: :mod:`.raw`, :mod:`.zstd`,
   :mod:`.blosc`, :mod:`.deflate`, :mod:`.lz4`), decoded in batches by nvCOMP or small kernels on the GPU,
   or on native threads on the host. Each stage has a host half (:meth:`CodecStage.prepare`:
   validate and parse the batch's encoded bytes in pinned staging before anything reaches
   the GPU, since nvCOMP is undefined on corrupt input) and a device half
   (:meth:`CodecStage.decode`, written once against :class:`~gpu_zarr.engine.ops.Ops`, so
   the GPU path and its CPU twin run the same code).
3. **element steps** -- v2 filters and v3 ``numcodecs.*`` array-to-array codecs whose decode
   numpy and cupy compute exactly alike (Delta, FixedScaleOffset, Quantize, AsType:
   :mod:`.elements`), on the decoded batch, on the GPU or the CPU's threads.
4. **the element order and byte order** (``bytes`` endianness, ``transpose``, v2 ``order``):
   applied by the place step as it scatters chunks into the output.

A chain with any other step (``numcodecs.*`` bytes codecs other than these, BZ2 or LZMA
compressors, other array-to-array codecs) is decoded on the host by **the codecs' own
decode** (:mod:`.host`), in batches on the engine's worker threads, after the frames; the
decoded chunks then take the same upload and place steps.

The core stages live in ONE registry (:func:`stages`, :func:`register`, :func:`unregister`):
the chain parser, descriptions and "expected ..." messages, the native host path's codec set
and the capability report all iterate it, so adding a core codec is one module defining its
stage plus its line in :data:`_BUILTIN` (or a :func:`register` call at run time).
:func:`~gpu_zarr.engine.codecs.chain.stage_for` gives the stage that decodes a layout's chunks: the core stage itself, or
its composition with the chain's other steps (:class:`~gpu_zarr.engine.codecs.chain.ChainStage`).
"""

from __future__ import annotations

import threading

from gpu_zarr.engine.codecs.base import CodecStage
from gpu_zarr.engine.codecs.blosc import BloscStage
from gpu_zarr.engine.codecs.deflate import DeflateStage
from gpu_zarr.engine.codecs.lz4 import Lz4Stage
from gpu_zarr.engine.codecs.raw import RawStage
from gpu_zarr.engine.codecs.zstd import ZstdStage

__all__ = ["CodecStage", "RawStage", "ZstdStage", "register", "stage_named", "stages", "unregister"]


_lock = threading.Lock()
# the codecs the engine reads, in the order the layout tries them (stages are stateless;
# long-lived state lives in the runtime). A new codec: its module, and one line here.
_BUILTIN: tuple[CodecStage, ...] = (RawStage(), ZstdStage(), BloscStage(), DeflateStage("gzip"), DeflateStage("zlib"),
                                    Lz4Stage())
_STAGES: dict[str, CodecStage] = {s.name: s for s in _BUILTIN}


def stages() -> tuple[CodecStage, ...]:
    """Every registered codec stage, in registration order (built-in ones first)."""
    return tuple(_STAGES.values())


def stage_named(name: str) -> CodecStage | None:
    """The registered stage of codec ``name`` (:attr:`Layout.codec`), or None."""
    return _STAGES.get(name)


def register(stage: CodecStage) -> CodecStage:
    """Add a codec stage to the registry (its ``name`` must be new); returns it.

    From then on the layout recognises what the stage declares, descriptions and messages name
    it, and reads of such arrays decode with it.
    """
    global _STAGES
    with _lock:  # copy on write: readers iterate the mapping without the lock
        if stage.name in _STAGES:
            raise ValueError(f"a codec stage named {stage.name!r} is already registered")
        _STAGES = {**_STAGES, stage.name: stage}
    return stage


def unregister(name: str) -> None:
    """Remove the codec stage ``name`` added by :func:`register` (built-in stages stay)."""
    global _STAGES
    with _lock:
        if any(s.name == name for s in _BUILTIN):
            raise ValueError(f"{name!r} is a built-in codec stage; it cannot be unregistered")
        _STAGES = {k: v for k, v in _STAGES.items() if k != name}
