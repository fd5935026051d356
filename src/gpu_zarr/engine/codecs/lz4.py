"""numcodecs' LZ4 chunks: a 4-byte little-endian decoded size, then one raw LZ4 block.

The zarr v2 ``lz4`` compressor and zarr v3's ``numcodecs.lz4`` write this (numcodecs' ``LZ4``:
``LZ4_compress_fast`` behind the size). The host half reads the sizes (each must be the chunk's
decoded size) and points past them; the decode is ONE batched call of raw LZ4 blocks: nvCOMP
LZ4 on the GPU (as for Blosc's LZ4 streams), the native library's LZ4 on CPU threads, numcodecs
in the pure-Python twin. The CPU's fused path reads, decodes and places whole chunks natively
(``lz4-sized``: the same size check in C). Every decoder bounds its writes by the chunk's size
and reports a block that does not decode to exactly that size.

nvCOMP never sees a block that has not been walked (LZ4's safe decoder's rules, copying
nothing: a block must decode to exactly its size). :func:`walk_blocks` decides where, here and
for Blosc's LZ4 streams: the GPU walks each block on one thread (``lz4_sanitize`` in
:mod:`gpu_zarr.engine.nvcomp_batch`), so its time is the longest block's, at a few dependent
loads from device memory per LZ4 sequence; the native library (``gz_lz4_check``) walks them
all on the host's threads, so its time is their total over the threads: long blocks (numcodecs'
LZ4 puts a whole chunk in one) walk on the host, batches of many short ones on the GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_zarr.engine.binary import le_uints
from gpu_zarr.errors import CorruptChunkError

if TYPE_CHECKING:  # annotations only
    from gpu_zarr.engine.layout import Layout
    from gpu_zarr.engine.ops import Ops
    from gpu_zarr.engine.plan import Batch

__all__ = ["Lz4Stage"]


#: decoded bytes a second one GPU thread walks (``lz4_sanitize``: one thread per block)
GPU_WALK_RATE = 16e6
#: decoded bytes a second one host thread walks (``gz_lz4_check``) beside a read's file reads
#: and its other lanes' walks (a free core walks about four times as fast)
HOST_WALK_RATE = float(1 << 30)


@dataclass(frozen=True)
class Lz4Blocks:
    """Where each chunk's raw LZ4 block lies in the staging buffer; ``walked``: all were
    walked on the host (:func:`walk_blocks`), so the GPU need not walk them again."""

    offsets: np.ndarray
    sizes: np.ndarray
    walked: bool = False


def walk_blocks(buf: np.ndarray, offsets: Any, sizes: Any, dsizes: Any, names: Sequence[str]) -> bool:
    """Walk the LZ4 blocks ``buf[offsets[k]:+sizes[k]]`` on the host's native threads where that
    is estimated faster than the GPU's walk (see the module docstring): True when they were
    walked here (each decodes to exactly ``dsizes[k]`` bytes), False when they are left to the
    GPU (the native library is not loaded, or the GPU walks them sooner).

    Raises
    ------
    CorruptChunkError
        Naming the first block that does not decode to exactly its size.
    """
    import gpu_zarr.engine.native as native
    from gpu_zarr import settings
    from gpu_zarr.engine.decode import lz4_walk_error

    dsizes = np.asarray(dsizes, np.int64)
    if len(dsizes) == 0 or not native.available():
        return False
    threads = int(settings.get("threads"))
    if float(dsizes.sum()) / (threads * HOST_WALK_RATE) > float(dsizes.max()) / GPU_WALK_RATE:
        return False
    status = native.lz4_check(buf, offsets, sizes, dsizes, threads)
    if status is None:
        return False
    bad = np.flatnonzero(status != native.OK)
    if len(bad):
        k = int(bad[0])
        raise lz4_walk_error(names[k], int(dsizes[k]), native.describe(int(status[k])))
    return True


def parse_blocks(buf: np.ndarray, offsets: Any, sizes: Any, expected: int, names: Sequence[str]) -> Lz4Blocks:
    """Check every chunk's 4-byte size header against ``expected`` (the chunk's decoded size);
    the raw blocks after them.

    Raises
    ------
    CorruptChunkError
        Naming the first chunk too short for a header and a block, or whose header states
        another decoded size.
    """
    buf = buf.view(np.uint8).reshape(-1)
    offsets, sizes = np.asarray(offsets, np.int64), np.asarray(sizes, np.int64)
    short = np.flatnonzero(sizes < 5)  # the size, and a block of at least its token
    if len(short):
        k = int(short[0])
        raise CorruptChunkError(f"chunk {names[k]}: {int(sizes[k])} bytes is too short for a numcodecs LZ4 chunk (a "
                                "4-byte size and an LZ4 block). It is truncated or corrupt; rewrite or delete it.")
    stated = le_uints(buf, offsets, 4) if len(offsets) else np.zeros(0, np.int64)
    bad = np.flatnonzero(stated != expected)
    if len(bad):
        k = int(bad[0])
        raise CorruptChunkError(f"chunk {names[k]}: its LZ4 header says {int(stated[k])} decoded bytes; a chunk of "
                                f"this array holds {expected}. It is corrupt or was written with other metadata.")
    return Lz4Blocks(offsets + 4, sizes - 4)


class Lz4Stage:
    """numcodecs' LZ4 chunks (see the module docstring and ``CodecStage``)."""

    name = "lz4"
    v2_names = ("lz4",)
    v3_chains = ("[bytes, numcodecs.lz4]",)
    native = "lz4-sized"  # the native library's whole-chunk decode: the size checked, then the block
    nvcomp = True
    decodes = True
    native_checks = False  # the header is read on every path: it says where the block starts
    device_checks = False

    def recognise_v2(self, compressor: Any, dtype: np.dtype) -> dict[str, Any] | None:
        return {} if getattr(compressor, "codec_id", None) == "lz4" else None

    def recognise_v3(self, chain: Sequence[Any]) -> dict[str, Any] | None:
        return {} if len(chain) == 1 and str(getattr(chain[0], "codec_name", "")) == "numcodecs.lz4" else None

    def label(self, params: Mapping[str, Any]) -> str:
        return "lz4"

    def prepare(self, staging: np.ndarray, batch: Batch, lay: Layout, names: Sequence[str]) -> Lz4Blocks:
        """The size headers, then the blocks walked here where the host walks them sooner
        (:func:`walk_blocks`; else by the decoder)."""
        size = int(lay.inner_nbytes)
        blocks = parse_blocks(staging, batch.src_offsets, batch.src_sizes, size, names)
        walked = walk_blocks(staging, blocks.offsets, blocks.sizes, np.full(len(blocks.offsets), size, np.int64), names)
        return Lz4Blocks(blocks.offsets, blocks.sizes, walked)

    def decode(self, ops: Ops, src: Any, batch: Batch, prep: Lz4Blocks, dst: Any, dst_offsets: np.ndarray,
               lay: Layout, names: Sequence[str], slot: int, wait: Any) -> None:
        n = len(prep.offsets)
        if n:
            ops.decode_batch("lz4", src, prep.offsets, prep.sizes, dst, np.asarray(dst_offsets[:n], np.int64),
                             np.full(n, int(lay.inner_nbytes), np.int64), names, slot, wait=wait, walked=prep.walked)

    def scratch_bytes(self, chunks_per_batch: int, lay: Layout) -> int:
        """nvCOMP's LZ4 decode needs no scratch; at most a gathered copy of the blocks, should
        its input alignment not hold after the 4-byte headers (LZ4's bound, plus alignment)."""
        size = int(lay.inner_nbytes)
        return int(chunks_per_batch) * (size + size // 255 + 16 + 16)
