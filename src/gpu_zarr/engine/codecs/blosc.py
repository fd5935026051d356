"""Blosc (c-blosc 1.x) chunks: host parse of headers and block-offset tables into a stream table.

A c-blosc 1.x chunk is a 16-byte header, a table of ``nblocks`` int32 block offsets, then
per block one stream (or ``typesize`` streams when the block is split), each an int32
compressed size followed by its bytes (see ``shared/reference/blosc.md``). :func:`parse_batch`
reads every header, block table and stream size of a whole batch with numpy (no Python loop
per chunk or per block: one vectorised step per split index, at most 16), checks all of it
against each chunk's byte count and the decoded size the metadata promises, and returns a
:class:`BloscPlan`:

- a stream table: for every stream its place in the staging buffer, its place in a per-batch
  "shuffled" buffer, and its kind (LZ4, zstd, deflate with the zlib wrapper stripped, or a copy
  for streams stored raw);
- a block table for the unshuffle (:mod:`gpu_zarr.engine.codecs.shuffle`): per block its place in the
  shuffled buffer, its offset in the decoded chunk, size, typesize and mode;
- memcpyed chunks (copied whole, no shuffle);
- chunks the GPU cannot decode (blosclz, snappy, Blosc2-format chunks), decoded here on the
  host with numcodecs.

Everything checkable is checked here, on the host, before nvCOMP sees a byte: nvCOMP is
undefined on corrupt input. Failures raise :class:`~gpu_zarr.errors.CorruptChunkError`
naming the chunk and what was wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_zarr.engine.binary import align_up, le_ints
from gpu_zarr.engine.plan import LazyNames
from gpu_zarr.errors import CorruptChunkError

if TYPE_CHECKING:
    from gpu_zarr.engine.ops import Ops

__all__ = [
    "KIND_COPY",
    "KIND_DEFLATE",
    "KIND_LZ4",
    "KIND_NAMES",
    "KIND_ZSTD",
    "MODE_BIT",
    "MODE_BYTE",
    "MODE_NONE",
    "BloscPlan",
    "BloscStage",
    "blosc_params",
    "decode_plan",
    "parse_batch",
]

KIND_COPY, KIND_LZ4, KIND_ZSTD, KIND_DEFLATE = 0, 1, 2, 3
KIND_NAMES = MappingProxyType({KIND_COPY: "copy", KIND_LZ4: "lz4", KIND_ZSTD: "zstd", KIND_DEFLATE: "deflate"})
MODE_NONE, MODE_BYTE, MODE_BIT = 0, 1, 2

_HEADER = 16
_MAX_SPLITS = 16
_MIN_BUFFERSIZE = 128
_F_SHUFFLE, _F_MEMCPY, _F_BITSHUFFLE, _F_NOSPLIT = 0x01, 0x02, 0x04, 0x10
# compressor code (flags >> 5) -> stream kind; blosclz (0) and snappy (2) have none on the GPU
_COMP_KIND = MappingProxyType({1: KIND_LZ4, 3: KIND_DEFLATE, 4: KIND_ZSTD})
_COMP_NAME = MappingProxyType({0: "blosclz", 1: "lz4", 2: "snappy", 3: "zlib", 4: "zstd"})
_DEFLATE_ALIGN = 8  # nvCOMP's Deflate decompression alignment is at most 4 (deflate.h); 8 is safe


def _empty(dtype: Any = np.int64) -> np.ndarray:
    return np.zeros(0, dtype)


@dataclass
class BloscPlan:
    """The parsed layout of one batch of Blosc chunks.

    Offsets ``*_src`` are into the staging buffer (the device copy of it has the same layout);
    ``s_dst`` into the per-batch buffer of ``shuffled_bytes`` bytes that the compressed streams
    decode into (each at an aligned slot; streams stored raw are read in place, ``s_dst = -1``);
    ``b_off`` is within the decoded chunk, whose place in the output is only known at decode
    time (``dst_offsets[chunk]``).

    Attributes
    ----------
    s_src, s_size, s_dst, s_dsize : ndarray of int64
        Per stream: encoded offset and size, decoded offset (-1 when stored raw) and exact size.
    s_kind : ndarray of int8
        ``KIND_COPY``, ``KIND_LZ4``, ``KIND_ZSTD`` or ``KIND_DEFLATE``.
    s_chunk : ndarray of int64
        Chunk (position in the batch) each stream belongs to.
    b_first, b_off : ndarray of int64
        Per block: its first stream (a block's streams are consecutive), offset in the decoded chunk.
    b_nsplit : ndarray of int32
        Streams per block (typesize when split, else 1); stream i holds the block's shuffled
        bytes ``[i * size / nsplit, (i + 1) * size / nsplit)``.
    b_size, b_ts, b_mode : ndarray of int32
        Per block: bytes, typesize, ``MODE_NONE``/``MODE_BYTE``/``MODE_BIT`` (a bitshuffled
        block whose element count is not a multiple of 8 is ``MODE_NONE``: c-blosc 1.x left it).
    b_chunk : ndarray of int64
    m_chunk, m_src : ndarray of int64
        Memcpyed chunks: position in the batch, offset of their bytes in staging.
    h_chunk : ndarray of int64
        Chunks decoded on the host; ``h_data`` holds them back to back, chunk i at
        ``i * nbytes``.
    h_data : ndarray of uint8 or None
    h_reasons : dict
        Why chunks went to the host (e.g. ``{"blosclz": 3}``).
    nbytes : int
        Decoded size of every chunk.
    shuffled_bytes : int
        Size of the buffer the compressed streams decode into.
    lz4_walked : bool
        The LZ4 streams were walked on the host (:func:`gpu_zarr.engine.codecs.lz4.walk_blocks`).
    """

    nbytes: int
    s_src: np.ndarray = field(default_factory=_empty)
    s_size: np.ndarray = field(default_factory=_empty)
    s_dst: np.ndarray = field(default_factory=_empty)
    s_dsize: np.ndarray = field(default_factory=_empty)
    s_kind: np.ndarray = field(default_factory=lambda: _empty(np.int8))
    s_chunk: np.ndarray = field(default_factory=_empty)
    b_first: np.ndarray = field(default_factory=_empty)
    b_nsplit: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    b_off: np.ndarray = field(default_factory=_empty)
    b_size: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    b_ts: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    b_mode: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    b_chunk: np.ndarray = field(default_factory=_empty)
    m_chunk: np.ndarray = field(default_factory=_empty)
    m_src: np.ndarray = field(default_factory=_empty)
    h_chunk: np.ndarray = field(default_factory=_empty)
    h_data: np.ndarray | None = None
    h_reasons: dict[str, int] = field(default_factory=dict)
    lz4_walked: bool = False
    shuffled_bytes: int = 0
    s_adler: np.ndarray = field(default_factory=lambda: _empty(np.uint32))

    def stats(self) -> dict[str, int]:
        """Counts for the read's stats: streams per kind, blocks per mode, memcpyed/host chunks."""
        kinds, counts = np.unique(self.s_kind, return_counts=True)
        out = {f"blosc_streams_{KIND_NAMES[int(k)]}": int(c) for k, c in zip(kinds, counts)}
        out["blosc_blocks"] = len(self.b_off)
        out["blosc_memcpyed_chunks"] = len(self.m_chunk)
        out["blosc_host_chunks"] = len(self.h_chunk)
        for why, n in self.h_reasons.items():
            out[f"blosc_host_{why}"] = n
        return out


def _name(names: Sequence[str] | None, k: Any) -> str:
    return names[int(k)] if names is not None else f"#{int(k)}"


def _stream_names(names: Sequence[str] | None, chunks: np.ndarray) -> Sequence[str]:
    """Stream -> its chunk's name, looked up only when an error message needs one."""
    return LazyNames(len(chunks), lambda i: _name(names, chunks[i]))


def _fail(names: Sequence[str] | None, k: int, what: str) -> CorruptChunkError:
    return CorruptChunkError(
        f"chunk {_name(names, k)}: not a valid Blosc chunk: {what}. The chunk is corrupt or truncated; "
        "rewrite or delete it (zarr-python's own read fails on it too)."
    )


def _check(bad: np.ndarray, names: Sequence[str] | None, chunk_of: np.ndarray, what: Callable[[int], str]) -> None:
    """Raise for the first True in ``bad``; ``what(i)`` describes element i."""
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _fail(names, chunk_of[i], what(i))


def _host_decode(staging: np.ndarray, offs: np.ndarray, sizes: np.ndarray, idx: np.ndarray, nbytes: int,
                 names: Sequence[str] | None, versions: np.ndarray) -> np.ndarray:
    """numcodecs' c-blosc decodes the chunks ``idx`` (a Python loop: the slow path)."""
    from numcodecs import Blosc

    out = np.empty(len(idx) * nbytes, np.uint8)
    codec = Blosc()
    for i, k in enumerate(idx.tolist()):
        enc = staging[int(offs[k]):int(offs[k]) + int(sizes[k])]
        try:
            dec = np.frombuffer(codec.decode(enc), np.uint8)
        except Exception as exc:
            v = int(versions[k])
            if v >= 3:
                raise CorruptChunkError(
                    f"chunk {_name(names, k)}: a Blosc2-format chunk (header version {v}), which numcodecs' c-blosc 1.x "
                    f"cannot decode ({exc}); zarr-python cannot read it either. Rewrite the array with c-blosc "
                    "1.x (numcodecs) or Blosc2's Blosc1-compatible writer, or delete the chunk if it is damaged."
                ) from exc
            raise _fail(names, k, f"numcodecs could not decode it: {exc}") from exc
        if dec.nbytes != nbytes:
            raise _fail(names, k, f"it decodes to {dec.nbytes} bytes, the array's chunks hold {nbytes}")
        out[i * nbytes:(i + 1) * nbytes] = dec
    return out


@dataclass
class _Headers:
    """The 16-byte Blosc headers of a batch's chunks, one array entry per chunk."""

    version: np.ndarray
    flags: np.ndarray
    typesize: np.ndarray
    blocksize: np.ndarray
    cbytes: np.ndarray
    comp: np.ndarray  # compressor code (flags >> 5)
    blosc2: np.ndarray  # a Blosc2-format chunk (version >= 3, or both shuffle bits set)


def _read_headers(staging: np.ndarray, offs: np.ndarray, sizes: np.ndarray, nbytes: int,
                  names: Sequence[str] | None) -> _Headers:
    """Read every chunk's header and check what holds whatever the compressor."""
    all_k = np.arange(len(offs))
    _check(sizes < _HEADER, names, all_k,
           lambda i: f"it has {sizes[i]} bytes, fewer than the 16-byte Blosc header")
    hdr = staging[offs[:, None] + np.arange(_HEADER)]
    version = hdr[:, 0].astype(np.int64)
    flags = hdr[:, 2].astype(np.int64)
    ts = hdr[:, 3].astype(np.int64)
    ints = le_ints(staging, offs[:, None] + np.array([4, 8, 12]), 4)  # nbytes, blocksize, cbytes
    c_nbytes, c_block, c_cbytes = ints[:, 0], ints[:, 1], ints[:, 2]

    _check(version == 0, names, all_k, lambda i: "header version byte is 0 (not a Blosc header)")
    _check(c_nbytes != nbytes, names, all_k,
           lambda i: f"header says it decodes to {c_nbytes[i]} bytes, the array's chunks hold {nbytes}")
    _check((c_cbytes < _HEADER) | (c_cbytes > sizes), names, all_k,
           lambda i: f"header says it has {c_cbytes[i]} bytes, the chunk has {sizes[i]}")
    blosc2 = (version >= 3) | ((flags & (_F_SHUFFLE | _F_BITSHUFFLE)) == (_F_SHUFFLE | _F_BITSHUFFLE))
    return _Headers(version, flags, ts, c_block, c_cbytes, flags >> 5, blosc2)


def _routes(h: _Headers, nbytes: int, names: Sequence[str] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each chunk is decoded, as masks: memcpyed (copied whole, never shuffled), on the
    host (Blosc2, or a compressor with no GPU decoder) or on the GPU; with the checks that
    depend on it."""
    all_k = np.arange(len(h.flags))
    blosc2 = h.blosc2
    memcpy = ((h.flags & _F_MEMCPY) != 0) & ~blosc2
    known = np.isin(h.comp, list(_COMP_NAME))
    _check(~blosc2 & ~memcpy & ~known, names, all_k, lambda i: f"unknown compressor code {h.comp[i]} in the flags")
    host = ~memcpy & (blosc2 | ~np.isin(h.comp, list(_COMP_KIND)))
    gpu = ~memcpy & ~host
    _check(memcpy & (h.cbytes != nbytes + _HEADER), names, all_k,
           lambda i: f"a memcpyed chunk must hold {nbytes + _HEADER} bytes, its header says {h.cbytes[i]}")
    # c-blosc refuses a typesize of 0 whatever the shuffle: so must we (else its data would pass)
    _check(h.typesize < 1, names, all_k, lambda i: "typesize 0 in the header")
    _check(gpu & (h.blocksize < 1), names, all_k, lambda i: f"block size {h.blocksize[i]} in the header")
    return memcpy, host, gpu


def parse_batch(staging: np.ndarray, src_offsets: np.ndarray, src_sizes: np.ndarray, nbytes: int,
                names: Sequence[str] | None = None, *, align: int = 16) -> BloscPlan:
    """Parse and check every Blosc chunk of a batch; lay out its streams and blocks.

    Chunk k is ``staging[src_offsets[k] : src_offsets[k] + src_sizes[k]]`` (host memory), each
    decoding to ``nbytes`` (from the metadata; zarr stores edge chunks whole); ``names`` are
    looked up only for an error; each decoded stream's slot in the per-batch buffer is
    ``align``-ed. Raises CorruptChunkError when a header, block table or stream size is
    inconsistent or points past the chunk's end, or a host-decoded chunk fails.
    """
    offs = np.asarray(src_offsets, np.int64)
    sizes = np.asarray(src_sizes, np.int64)
    plan = BloscPlan(nbytes=int(nbytes))
    if len(offs) == 0:
        return plan
    h = _read_headers(staging, offs, sizes, nbytes, names)
    memcpy, host, gpu = _routes(h, nbytes, names)
    # memcpyed chunks: copied whole, never shuffled
    plan.m_chunk = np.flatnonzero(memcpy)
    plan.m_src = offs[plan.m_chunk] + _HEADER
    hk = np.flatnonzero(host)
    if len(hk):  # host chunks: decoded here, with the reasons counted
        why = np.where(h.blosc2[hk], "blosc2", np.array([_COMP_NAME.get(int(c), "?") for c in h.comp[hk]]))
        u, cnt = np.unique(why, return_counts=True)
        plan.h_reasons = {str(a): int(b) for a, b in zip(u, cnt)}
        plan.h_chunk = hk
        plan.h_data = _host_decode(staging, offs, sizes, hk, int(nbytes), names, h.version)

    gk = np.flatnonzero(gpu)
    if len(gk) == 0:
        return plan
    _parse_streams(plan, staging, offs[gk], h.cbytes[gk], h.blocksize[gk], h.typesize[gk], h.flags[gk], h.comp[gk],
                   gk, int(nbytes), names, align)
    return plan


def _parse_streams(plan: BloscPlan, staging: np.ndarray, offs: np.ndarray, cbytes: np.ndarray, block: np.ndarray,
                   ts: np.ndarray, flags: np.ndarray, comp: np.ndarray, chunk_ids: np.ndarray, nbytes: int,
                   names: Sequence[str] | None, align: int) -> None:
    g = len(offs)
    nblocks = -(-nbytes // block)
    leftover = nbytes % block
    _check(_HEADER + 4 * nblocks > cbytes, names, chunk_ids,
           lambda i: f"its table of {nblocks[i]} block offsets does not fit in {cbytes[i]} bytes")
    # one row per block of every chunk
    nb_total = int(nblocks.sum())
    bc = np.repeat(np.arange(g), nblocks)  # chunk (position among gk) of each block
    first = np.cumsum(nblocks) - nblocks
    j = np.arange(nb_total, dtype=np.int64) - np.repeat(first, nblocks)
    base = offs[bc]
    bstart = le_ints(staging, base + _HEADER + 4 * j, 4)
    chunk_of_block = chunk_ids[bc]
    _check((bstart < _HEADER + 4 * nblocks[bc]) | (bstart + 4 > cbytes[bc]), names, chunk_of_block,
           lambda i: f"block {j[i]} starts at byte {bstart[i]}, outside the chunk's streams "
                     f"[{_HEADER + 4 * nblocks[bc][i]}, {cbytes[bc][i]})")
    last_partial = (j == nblocks[bc] - 1) & (leftover[bc] > 0)
    bsize = np.where(last_partial, leftover[bc], block[bc])
    tsb = ts[bc]
    split = (((flags[bc] & _F_NOSPLIT) == 0) & (tsb <= _MAX_SPLITS) & (bsize // tsb >= _MIN_BUFFERSIZE)
             & ~last_partial)
    nsplit = np.where(split, tsb, 1)
    _check(bsize % nsplit != 0, names, chunk_of_block,
           lambda i: f"block {j[i]} of {bsize[i]} bytes cannot be split into {nsplit[i]} streams")
    neblock = bsize // nsplit

    # streams: one vectorised step per split index (at most 16)
    ns_total = int(nsplit.sum())
    s_first = np.cumsum(nsplit) - nsplit
    s_src = np.empty(ns_total, np.int64)
    s_size = np.empty(ns_total, np.int64)
    s_dsize = np.empty(ns_total, np.int64)
    s_block = np.empty(ns_total, np.int64)
    cur = bstart.copy()  # relative to the chunk
    kind_of_comp = np.zeros(8, np.int8)
    for c, kd in _COMP_KIND.items():
        kind_of_comp[c] = kd
    for s in range(int(nsplit.max())):
        act = np.flatnonzero(nsplit > s)
        pos = cur[act]
        cb = cbytes[bc[act]]
        csize = _stream_sizes(staging, base[act], pos, cb, neblock[act], j[act], chunk_of_block[act], s, names)
        ne = neblock[act]
        out = s_first[act] + s
        s_src[out] = base[act] + pos + 4
        s_size[out] = csize
        s_dsize[out] = ne
        s_block[out] = act
        cur[act] = pos + 4 + csize

    kind = np.where(s_size == s_dsize, KIND_COPY, kind_of_comp[comp[bc[s_block]]]).astype(np.int8)
    s_chunk = chunk_of_block[s_block]
    _check_zstd(staging, s_src, s_size, s_dsize, kind, s_chunk, names)
    s_src, s_size, plan.s_adler = _strip_zlib(staging, s_src, s_size, kind, s_chunk, names)
    # decoded streams get their own aligned slot in the per-batch buffer (nvCOMP wants aligned
    # outputs); streams stored raw are read where they are by the unshuffle
    slot = np.where(kind == KIND_COPY, 0, -(-s_dsize // align) * align)
    s_dst = np.where(kind == KIND_COPY, -1, np.cumsum(slot) - slot)

    plan.s_src, plan.s_size, plan.s_dst, plan.s_dsize = s_src, s_size, s_dst, s_dsize
    plan.s_kind, plan.s_chunk = kind, s_chunk

    shuffle = (flags[bc] & _F_SHUFFLE) != 0
    bit = (flags[bc] & _F_BITSHUFFLE) != 0
    nel = bsize // tsb
    mode = np.where(shuffle & (tsb > 1), MODE_BYTE,
                    np.where(bit & (nel % 8 == 0), MODE_BIT, MODE_NONE))
    plan.b_first = s_first
    plan.b_nsplit = nsplit.astype(np.int32)
    plan.b_off = j * block[bc]
    plan.b_size = bsize.astype(np.int32)
    plan.b_ts = tsb.astype(np.int32)
    plan.b_mode = mode.astype(np.int32)
    plan.b_chunk = chunk_of_block
    plan.shuffled_bytes = int(slot.sum())


def _stream_sizes(staging: np.ndarray, base: np.ndarray, pos: np.ndarray, cb: np.ndarray, ne: np.ndarray,
                  blk: np.ndarray, chunk_of: np.ndarray, s: int, names: Sequence[str] | None) -> np.ndarray:
    """Read and check the size prefix of split ``s`` of some blocks (positions relative to the chunk)."""
    _check(pos + 4 > cb, names, chunk_of,
           lambda i: f"stream {s} of block {blk[i]} starts at byte {pos[i]}, past the chunk's end ({cb[i]} bytes)")
    csize = le_ints(staging, base + pos, 4)
    _check((csize <= 0) | (csize > ne), names, chunk_of,
           lambda i: f"stream {s} of block {blk[i]} says {csize[i]} compressed bytes for {ne[i]} decoded bytes")
    _check(pos + 4 + csize > cb, names, chunk_of,
           lambda i: f"stream {s} of block {blk[i]} ({csize[i]} bytes at byte {pos[i] + 4}) runs past the "
                     f"chunk's end ({cb[i]} bytes)")
    return csize


def _check_zstd(staging: np.ndarray, s_src: np.ndarray, s_size: np.ndarray, s_dsize: np.ndarray, kind: np.ndarray,
                s_chunk: np.ndarray, names: Sequence[str] | None) -> None:
    """Walk every zstd frame (header, block headers, end) as the plain zstd stage does: nvCOMP
    must never see a malformed frame. One vectorised walk per distinct decoded size (full
    blocks, the last partial block, split streams: a few per batch)."""
    from gpu_zarr.engine.codecs.zstd_frames import check_frames

    z = np.flatnonzero(kind == KIND_ZSTD)
    if len(z) == 0:
        return
    for ds in np.unique(s_dsize[z]).tolist():
        g = z[s_dsize[z] == ds]
        check_frames(staging, s_src[g], s_size[g], int(ds), _stream_names(names, s_chunk[g]))


def _strip_zlib(staging: np.ndarray, s_src: np.ndarray, s_size: np.ndarray, kind: np.ndarray, s_chunk: np.ndarray,
                names: Sequence[str] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """zlib streams -> raw deflate: drop the 2-byte header and the 4-byte Adler-32 (returned, one
    per stream, 0 for other kinds: the decode checks it, as c-blosc's zlib does)."""
    z = np.flatnonzero(kind == KIND_DEFLATE)
    adler = np.zeros(len(s_src), np.uint32)
    if len(z) == 0:
        return s_src, s_size, adler
    _check(s_size[z] < 7, names, s_chunk[z], lambda i: f"a zlib stream of {s_size[z][i]} bytes is too short")
    cmf = staging[s_src[z]].astype(np.int64)
    flg = staging[s_src[z] + 1].astype(np.int64)
    bad = ((cmf & 0x0F) != 8) | (((cmf << 8) | flg) % 31 != 0) | ((flg & 0x20) != 0)
    _check(bad, names, s_chunk[z], lambda i: f"a zlib stream has header bytes {cmf[i]:#04x} {flg[i]:#04x} "
                                             "(expected deflate, no preset dictionary)")
    end = s_src[z] + s_size[z]
    adler[z] = sum(staging[end - 4 + i].astype(np.uint32) << np.uint32(8 * (3 - i)) for i in range(4))
    s_src = s_src.copy()
    s_size = s_size.copy()
    s_src[z] += 2
    s_size[z] -= 6
    return s_src, s_size, adler


_ALGO = MappingProxyType({KIND_LZ4: "lz4", KIND_ZSTD: "zstd", KIND_DEFLATE: "deflate"})


def decode_plan(ops: Ops, src: Any, plan: BloscPlan, dst: Any, dst_offsets: np.ndarray,
                names: Sequence[str] | None = None, slot: int = 0, wait: Any = None) -> None:
    """Decode a parsed batch through ``ops`` (GPU or its CPU twin): streams, then one unshuffle.

    Chunk k of the batch lands in ``dst[dst_offsets[k] : dst_offsets[k] + plan.nbytes]``.
    One ``ops.decode_batch`` per inner algorithm present decodes the compressed streams into
    aligned slots of a per-batch buffer; then ONE unshuffle over every block reads each
    block's streams where they are (decoded slot, or in ``src`` for streams stored raw: no
    copy pass) and writes the block to ``dst`` (a kernel launch on the slot's work stream; on
    the CPU twin, after the queued work has finished). Memcpyed and host-decoded chunks are copied
    with ``ops.copy_spans``. Every call waits for ``wait`` (the upload of ``src``).
    """
    dst_offsets = np.asarray(dst_offsets, np.int64)
    nb = plan.nbytes

    if len(plan.s_src):
        # on the slot's lane: decode_batch and copy_spans run there, so do the scratch allocations
        dec = ops.scratch(plan.shuffled_bytes, slot)
        for kind, algo in _ALGO.items():
            sel = np.flatnonzero(plan.s_kind == kind)
            if len(sel) == 0:
                continue
            buf, s_src, s_size = src, plan.s_src[sel], plan.s_size[sel]
            if kind == KIND_DEFLATE and (s_src % _DEFLATE_ALIGN).any():
                # nvCOMP Deflate wants aligned inputs; zlib payloads start anywhere: one copy kernel
                pad = align_up(s_size)
                offs = np.cumsum(pad) - pad
                buf = ops.scratch(int(pad.sum()), slot)
                ops.copy_spans(src, s_src, buf, offs, s_size, slot=slot, wait=wait)
                s_src = offs
            ops.decode_batch(algo, buf, s_src, s_size, dec, plan.s_dst[sel], plan.s_dsize[sel],
                             _stream_names(names, plan.s_chunk[sel]), slot=slot, wait=wait,
                             walked=kind == KIND_LZ4 and plan.lz4_walked,
                             **({"adler32": plan.s_adler[sel]} if kind == KIND_DEFLATE else {}))
        ops.unshuffle(src, dec, plan.s_kind == KIND_COPY, plan.s_src, plan.s_dst, plan.b_first, plan.b_nsplit,
                      plan.b_size, plan.b_ts, plan.b_mode, dst, dst_offsets[plan.b_chunk] + plan.b_off,
                      slot=slot, wait=wait)
    if len(plan.m_chunk):
        ops.copy_spans(src, plan.m_src, dst, dst_offsets[plan.m_chunk], np.full(len(plan.m_chunk), nb, np.int64),
                       slot=slot, wait=wait)
    if len(plan.h_chunk):
        assert plan.h_data is not None  # host-decoded chunks come with their bytes
        host = ops.to_device(plan.h_data, slot)
        ops.copy_spans(host, np.arange(len(plan.h_chunk), dtype=np.int64) * nb, dst, dst_offsets[plan.h_chunk],
                       np.full(len(plan.h_chunk), nb, np.int64), slot=slot, wait=wait)


def _decode_native(ops: Ops, src: np.ndarray, batch: Any, dst: np.ndarray, dst_offsets: np.ndarray, nbytes: int,
                   names: Sequence[str], *, checked: bool = True) -> None:
    """Whole chunks on the CPU: ONE call into our native library (every chunk on its threads;
    it checks headers, tables and sizes itself), numcodecs' c-blosc for the chunks it leaves
    (blosclz, snappy, Blosc2) or for all of them without it. c-blosc trusts its block table:
    unless the batch was ``checked`` by :func:`parse_batch` already, the chunks it gets are
    parsed (and refused when corrupt) first."""
    from numcodecs import blosc

    import gpu_zarr.engine.native as native

    so, ss, do = batch.src_offsets.tolist(), batch.src_sizes.tolist(), np.asarray(dst_offsets).tolist()
    todo = list(range(len(so)))
    if native.codec_available("blosc") and isinstance(dst, np.ndarray) and dst.flags.c_contiguous:
        st, det = native.decode("blosc", src, so, ss, dst, do, nbytes, ops.native_threads)
        bad = np.flatnonzero((st != native.OK) & ~np.isin(st, list(native.UNSUPPORTED)))
        if len(bad):
            k = int(bad[0])
            raise CorruptChunkError(f"chunk {names[k]}: Blosc decode failed ({native.describe(int(st[k]), int(det[k]))}); "
                                    "the chunk is corrupt.")
        todo = np.flatnonzero(st != native.OK).tolist()

    if todo and not checked:
        idx = np.asarray(todo, np.int64)
        parse_batch(src, batch.src_offsets[idx], batch.src_sizes[idx], nbytes, [names[k] for k in todo])

    def one(i: int) -> None:
        k = todo[i]
        try:
            blosc.decompress(src[so[k]:so[k] + ss[k]], dst[do[k]:do[k] + nbytes])
        except Exception as exc:  # noqa: BLE001 - named, with the cause
            raise CorruptChunkError(f"chunk {names[k]}: Blosc decode failed ({exc}); the chunk is corrupt.") from exc
    ops.map_chunks(one, len(todo))


class BloscStage:
    """The Blosc codec stage (see :mod:`gpu_zarr.engine.codecs`): parse on the host, decode on the device.

    ``prepare`` is :func:`parse_batch` (vectorised, checks everything nvCOMP would trip on);
    ``decode`` is :func:`decode_plan`.
    """

    name = "blosc"
    v2_names = ("blosc",)
    v3_chains = ("[bytes, blosc]", "[bytes, numcodecs.blosc]")
    native = "blosc"
    nvcomp = True
    decodes = True
    device_checks = False

    @property
    def native_checks(self) -> bool:
        """Our native library's Blosc decoder checks headers, block tables and sizes itself (the
        CPU's fast path skips :func:`parse_batch` then, as the local chunkwise path always did);
        c-blosc (numcodecs) trusts its block table, so without the library, and for the chunks
        it leaves to c-blosc, ``parse_batch`` runs first."""
        import gpu_zarr.engine.native as native

        return native.codec_available("blosc")

    def recognise_v2(self, compressor: Any, dtype: np.dtype) -> dict[str, Any] | None:
        """numcodecs' Blosc: its parameters, with the array's item size as the typesize."""
        params = blosc_params(compressor)
        return None if params is None else {**params, "typesize": np.dtype(dtype).itemsize}

    def recognise_v3(self, chain: Sequence[Any]) -> dict[str, Any] | None:
        return blosc_params(chain[0]) if len(chain) == 1 else None

    def label(self, params: Mapping[str, Any]) -> str:
        """``Blosc <cname>``, saying so when no GPU decoder exists for the inner codec."""
        cname = str(params.get("cname", "?"))
        if cname in ("blosclz", "snappy"):
            return f"Blosc {cname} (decoded on the host: no GPU decoder for {cname})"
        return f"Blosc {cname}"

    def prepare(self, staging: np.ndarray, batch: Any, lay: Any, names: Sequence[str]) -> BloscPlan:
        """:func:`parse_batch`, then the LZ4 streams walked here where the host walks them sooner."""
        from gpu_zarr.engine.codecs.lz4 import walk_blocks

        plan = parse_batch(staging, batch.src_offsets, batch.src_sizes, lay.inner_nbytes, names)
        lz = np.flatnonzero(plan.s_kind == KIND_LZ4)
        plan.lz4_walked = walk_blocks(staging, plan.s_src[lz], plan.s_size[lz], plan.s_dsize[lz],
                                      _stream_names(names, plan.s_chunk[lz]))
        return plan

    def decode(self, ops: Ops, src: Any, batch: Any, prep: BloscPlan | None, dst: Any, dst_offsets: np.ndarray,
               lay: Any, names: Sequence[str], slot: int, wait: Any) -> None:
        if ops.whole_chunks:  # the CPU's fast paths: whole-chunk decoders
            _decode_native(ops, src, batch, dst, dst_offsets, lay.inner_nbytes, names, checked=prep is not None)
            return
        if prep is None:  # not checked on the host yet: the stream decoders need the parse
            prep = parse_batch(src, batch.src_offsets, batch.src_sizes, lay.inner_nbytes, names)
        decode_plan(ops, src, prep, dst, dst_offsets, names, slot, wait)

    def scratch_bytes(self, chunks_per_batch: int, lay: Any) -> int:
        """The decoded-streams buffer (at most the decoded batch plus alignment), plus nvCOMP's zstd
        scratch (about 3.1x the decoded batch) when the metadata names zstd (LZ4 needs none)."""
        dec = chunks_per_batch * align_up(lay.inner_nbytes) * 9 // 8
        cname = str(getattr(lay, "codec_params", {}).get("cname", "zstd"))
        return dec + (dec * 31 // 10 if cname == "zstd" else 0)


def blosc_params(codec: Any) -> dict[str, Any] | None:
    """Codec parameters when ``codec`` is a Blosc codec (numcodecs v2 compressor or zarr v3 codec).

    Returns
    -------
    dict or None
        ``{"cname", "clevel", "shuffle", "typesize", "blocksize"}`` as the metadata states them
        (informative only: every chunk's own header decides how it is decoded); None when
        ``codec`` is not Blosc.
    """
    if getattr(codec, "codec_name", None) == "numcodecs.blosc":  # numcodecs' Blosc under its v3 name
        codec = getattr(codec, "_codec", None)
        if codec is None:
            return None
    if getattr(codec, "codec_id", None) == "blosc":  # numcodecs.Blosc (zarr v2 compressor)
        cfg = codec.get_config()
        shuffle = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle", -1: "autoshuffle"}.get(cfg.get("shuffle"), "?")
        return {"cname": str(cfg.get("cname")), "clevel": int(cfg.get("clevel", 5)), "shuffle": shuffle,
                "typesize": None, "blocksize": int(cfg.get("blocksize", 0))}
    try:
        from zarr.codecs import BloscCodec
    except ImportError:  # pragma: no cover - zarr is a dependency
        return None
    if isinstance(codec, BloscCodec):
        def val(v: Any) -> Any:
            return getattr(v, "value", v)
        return {"cname": str(val(codec.cname)), "clevel": int(codec.clevel), "shuffle": str(val(codec.shuffle)),
                "typesize": codec.typesize, "blocksize": int(codec.blocksize)}
    return None
