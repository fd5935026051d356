"""The codecs' own decode: any chain zarr-python reads, decoded on the host in batches.

For a chain with a step the engine has no GPU or native implementation of (v2 filters the
element steps of :mod:`.elements` do not take, such as Shuffle; ``numcodecs.*`` bytes codecs;
LZ4, BZ2 or LZMA compressors; other array-to-array codecs), each chunk is decoded by the
codec objects of the array's own metadata -- zarr-python's codecs, which wrap numcodecs --
exactly as zarr's codec pipeline decodes it: bytes-to-bytes steps in reverse, then the
array-to-bytes step, then array-to-array steps in reverse, each with the chunk spec it sees
in zarr. Chunks of a batch are decoded side by side on the engine's worker threads (the
numcodecs decoders release the GIL); the decoded chunks are then uploaded and placed like any
other. Nothing here executes code from the store: codecs are looked up by name in zarr's registry,
and object dtypes (the pickle codec and its kin) are refused by the layout.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from gpu_zarr.errors import CorruptChunkError

__all__ = ["HostChain", "decode_host_batch"]


@dataclass(frozen=True, eq=False)
class HostChain:
    """The codec steps of one chunk, decoded by the codecs themselves.

    Attributes
    ----------
    codecs : tuple
        zarr codec objects in encode order (array-to-array, one array-to-bytes, bytes-to-bytes),
        without the checksum frames the engine strips itself.
    spec : zarr ArraySpec
        The spec of one (inner) chunk as zarr builds it (shape, dtype, fill value, order).
    out_dtype : numpy.dtype
        Native-order dtype of the decoded chunk.
    label : str
        How descriptions name the steps (e.g. ``"delta, zlib"``).
    """

    codecs: tuple[Any, ...]
    spec: Any
    out_dtype: np.dtype
    label: str

    @cached_property
    def _steps(self) -> tuple[Any, list[Any], Any, list[Any], list[Any]]:
        """(buffer prototype, array-to-array codecs, array-to-bytes codec, bytes-to-bytes codecs,
        the spec each array-to-array step sees), worked out once for every chunk."""
        from zarr.core.buffer import default_buffer_prototype

        aa, ab, bb = _split(self.codecs)
        specs = [self.spec]
        for c in aa:  # as zarr resolves them
            specs.append(c.resolve_metadata(specs[-1]))
        return default_buffer_prototype(), aa, ab, bb, specs

    def decode(self, data: Any) -> np.ndarray:
        """One chunk's encoded bytes (a uint8 array) -> its decoded elements, flat, C order."""
        proto, aa, ab, bb, specs = self._steps
        value: Any = proto.buffer.from_array_like(np.asarray(data, np.uint8).reshape(-1))
        for c in reversed(bb):
            value = _run(c, value, specs[-1])
        value = _run(ab, value, specs[-1])
        for c, spec in zip(reversed(aa), reversed(specs[:-1])):
            value = _run(c, value, spec)
        return np.asarray(value.as_numpy_array())


def _split(codecs: Sequence[Any]) -> tuple[list[Any], Any, list[Any]]:
    from zarr.abc.codec import ArrayArrayCodec, ArrayBytesCodec

    aa = [c for c in codecs if isinstance(c, ArrayArrayCodec)]
    ab = [c for c in codecs if isinstance(c, ArrayBytesCodec)]
    bb = [c for c in codecs if not isinstance(c, (ArrayArrayCodec, ArrayBytesCodec))]
    return aa, ab[0], bb


def _run(codec: Any, value: Any, spec: Any) -> Any:
    """One codec's decode of one chunk: its synchronous decode where it has one (zarr >= 3.3),
    else its coroutine on zarr's own event loop."""
    sync_decode = getattr(codec, "_decode_sync", None)
    if sync_decode is not None:
        return sync_decode(value, spec)
    from zarr.core.sync import sync

    return sync(codec._decode_single(value, spec))


def decode_host_batch(chain: HostChain, staging: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
                      out: np.ndarray, stride: int, nbytes: int, names: Sequence[str], pool: Any = None) -> None:
    """Decode chunk k of ``staging[offsets[k]:][:sizes[k]]`` into ``out[k * stride:][:nbytes]``.

    Chunks are decoded side by side on ``pool``'s threads (in order on this thread without one).

    Raises
    ------
    CorruptChunkError
        A chunk the codecs cannot decode, or that decodes to another size than ``nbytes``; the
        message names it and says what the codecs said.
    """
    n = len(sizes)
    offs = np.asarray(offsets, np.int64).tolist()
    lens = np.asarray(sizes, np.int64).tolist()

    def one(k: int) -> None:
        try:
            arr = chain.decode(staging[offs[k]:offs[k] + lens[k]])
        except CorruptChunkError:
            raise
        except Exception as exc:  # noqa: BLE001 - any codec's failure names the chunk
            raise CorruptChunkError(
                f"chunk {names[k]} could not be decoded by its codecs ({chain.label}): {type(exc).__name__}: {exc}"
            ) from exc
        flat = np.ascontiguousarray(arr, dtype=chain.out_dtype).reshape(-1).view(np.uint8)
        if flat.nbytes != nbytes:
            raise CorruptChunkError(
                f"chunk {names[k]} decodes to {flat.nbytes} bytes through {chain.label}; a chunk of this array has "
                f"{nbytes}. The chunk was written with other codec settings or is damaged.")
        out[k * stride:k * stride + nbytes] = flat

    if pool is None or n < 2:
        for k in range(n):
            one(k)
        return
    groups = min(n, 4 * (os.cpu_count() or 1))  # a few groups per core: uneven chunks still spread
    bounds = np.linspace(0, n, groups + 1).astype(int).tolist()

    def group(g: int) -> None:
        for k in range(bounds[g], bounds[g + 1]):
            one(k)

    for f in [pool.submit(group, g) for g in range(groups)]:
        f.result()
