"""Element steps: the array-to-array filters that run after the core codec, on the GPU or the host.

zarr v2 filters and their zarr v3 ``numcodecs.*`` forms (``Delta``, ``FixedScaleOffset``,
``Quantize``, ``AsType``, ``BitRound``, ``Shuffle``) change each element of a chunk on its own
(Delta: a running sum over the chunk's elements in stored order; Shuffle: the bytes of each
element gathered from the chunk's byte planes). The engine runs them as element steps: the core
codec (zstd, Blosc, deflate, LZ4, raw: nvCOMP on the GPU, native threads on the host) decodes a
batch into the step's stored dtype, then each step turns the whole batch -- one chunk a row --
into the next dtype with array operations written once for numpy and cupy (:func:`run`), on
the batch's work stream; on the host, Delta's running sum and Shuffle's gather are the native
library's loops where it is loaded (numpy's without it).

A step is taken only where both array libraries compute exactly what numcodecs does, bit for
bit (but a NaN's payload: cupy's casts write the canonical quiet NaN); anything else leaves
the chain to the codecs' own decode (:mod:`.host`):

- ``Delta`` on integers with ``astype`` equal to ``dtype``: a running sum wraps the same way
  in any order (floats would not: cupy's parallel scan adds in another order).
- ``AsType`` and ``Quantize``: casts between integers, from integers to floats and between
  floats (each rounds to nearest in both libraries); float to integer casts are left out
  (undefined for NaN and out-of-range values, and the two libraries differ there).
- ``FixedScaleOffset`` to a float ``dtype``: ``enc / scale + offset`` in the dtype numpy gives
  that expression (found by numpy itself on one element), each operation rounded once.
- ``Shuffle`` with an element size of 2, 4 or 8 bytes (the size of the elements beside it):
  bytes moved, never changed; 1 byte is no step.
- ``BitRound`` decodes to the same bytes: no step at all.

Every dtype must be in the machine's byte order (cupy has no other) and every step keeps the
element count. Nothing here executes code from the store: codecs are zarr's and numcodecs'
own objects, made from the metadata by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import gpu_zarr.engine.native as native

__all__ = ["ElementStep", "element_steps", "label", "run"]


@dataclass(frozen=True)
class ElementStep:
    """One element-wise decode step.

    Attributes
    ----------
    name : str
        The filter's numcodecs id (``"delta"``, ``"fixedscaleoffset"``, ``"astype"``, ``"quantize"``,
        ``"shuffle"``).
    stored : numpy.dtype
        What the step reads: the bytes before it, viewed as this dtype.
    decoded : numpy.dtype
        What it writes.
    scale, offset : float
        ``fixedscaleoffset`` only: its parameters, as the metadata gives them.
    """

    name: str
    stored: np.dtype
    decoded: np.dtype
    scale: Any = None
    offset: Any = None

    def apply(self, xp: Any, src: Any, dst: Any) -> None:
        """Decode ``src`` (C-contiguous rows of ``stored`` elements, one chunk a row) into ``dst``
        (the same shape, ``decoded``)."""
        if self.name == "delta":  # numcodecs: np.cumsum(enc, out=dec); integers wrap alike in any order
            if not (xp is np and native.delta(src, dst)):  # the native loop; numpy's accumulate is generic
                xp.cumsum(src, axis=1, dtype=self.decoded, out=dst)
        elif self.name == "fixedscaleoffset":  # numcodecs: ((enc / scale) + offset).astype(dtype)
            work = _work_dtype(self.stored, self.scale, self.offset)
            val = dst if work == self.decoded else xp.empty(dst.shape, work)
            xp.divide(src, work.type(self.scale), out=val, dtype=work)
            xp.add(val, work.type(self.offset), out=val, dtype=work)
            if val is not dst:
                dst[...] = val
        elif self.name == "shuffle":  # numcodecs' unshuffle: byte j of element i from byte plane j
            if not (xp is np and native.unshuffle(src, dst)):  # the native loop: numpy's is a byte-strided copy
                n, m, size = src.shape[0], src.shape[1], self.stored.itemsize
                dst.view(np.uint8).reshape(n, m, size)[...] = src.view(np.uint8).reshape(n, size, m).transpose(0, 2, 1)
        else:  # astype, quantize: a cast
            dst[...] = src


def _numeric(dt: np.dtype) -> bool:
    """Integers, float32 and float64 in the machine's byte order (float16 arithmetic is left out:
    the libraries may round its intermediate steps differently)."""
    return dt.isnative and (dt.kind in "iu" or (dt.kind == "f" and dt.itemsize in (4, 8)))


def _work_dtype(stored: np.dtype, scale: Any, offset: Any) -> np.dtype:
    """The dtype numpy computes ``enc / scale + offset`` in (numcodecs' FixedScaleOffset), found
    by numpy on one element of ``stored``."""
    with np.errstate(all="ignore"):
        return (np.zeros(1, stored) / scale + offset).dtype


def _step(codec: Any) -> ElementStep | tuple[()] | None:
    """The element step of one numcodecs filter object; ``()`` for one that leaves the bytes as
    they are; None when it has no exact step."""
    cid = getattr(codec, "codec_id", None)
    try:
        if cid == "bitround":
            return ()
        if cid == "shuffle":  # bytes moved, not changed: exact anywhere; its elements as unsigned ints
            size = int(codec.elementsize)
            if size <= 1:
                return ()
            return ElementStep("shuffle", np.dtype(f"u{size}"), np.dtype(f"u{size}")) if size in (2, 4, 8) else None
        if cid == "delta":
            dt, ast = np.dtype(codec.dtype), np.dtype(codec.astype)
            if dt == ast and dt.kind in "iu" and dt.isnative:
                return ElementStep("delta", ast, dt)
        elif cid in ("astype", "quantize"):
            src = np.dtype(codec.encode_dtype if cid == "astype" else codec.astype)
            dst = np.dtype(codec.decode_dtype if cid == "astype" else codec.dtype)
            if _numeric(src) and _numeric(dst) and not (src.kind == "f" and dst.kind in "iu"):  # rounded alike
                return ElementStep(cid, src, dst)
        elif cid == "fixedscaleoffset":
            dt, ast = np.dtype(codec.dtype), np.dtype(codec.astype)
            scale, offset = codec.scale, codec.offset
            if not (isinstance(scale, (int, float)) and isinstance(offset, (int, float)) and scale != 0):
                return None
            work = _work_dtype(ast, scale, offset)
            if dt.kind == "f" and _numeric(ast) and _numeric(dt) and work.kind == "f" and _numeric(work):
                return ElementStep("fixedscaleoffset", ast, dt, scale, offset)
    except (AttributeError, TypeError, ValueError, OverflowError):
        return None
    return None


def element_steps(filters: Sequence[Any], out_dtype: np.dtype) -> tuple[ElementStep, ...] | None:
    """The element steps that decode what ``filters`` (numcodecs objects, in encode order)
    encoded, in decode order; None when one of them has no exact step, or when the steps do
    not chain (each step's stored itemsize is the one before it's decoded itemsize, the last
    decodes to ``out_dtype``'s itemsize).

    An empty tuple: the filters leave the bytes as they are.
    """
    steps: list[ElementStep] = []
    for f in reversed(list(filters)):
        s = _step(f)
        if s is None:
            return None
        if isinstance(s, ElementStep):
            steps.append(s)
    for a, b in zip(steps, steps[1:]):
        if a.decoded.itemsize != b.stored.itemsize:
            return None
    if steps and steps[-1].decoded.itemsize != np.dtype(out_dtype).itemsize:
        return None
    return tuple(steps)


def label(steps: Sequence[ElementStep]) -> str:
    """How descriptions name the steps, in decode order (e.g. ``"delta"``)."""
    return ", ".join(s.name for s in steps)


def _rows(buf: Any, lo: int, hi: int, m: int, dtype: np.dtype) -> Any:
    """Chunks ``lo:hi`` of ``buf`` (chunks of ``m`` elements of ``dtype`` end to end) as the rows
    of one C-contiguous 2-D array."""
    size = m * dtype.itemsize
    return buf[lo * size:hi * size].view(dtype).reshape(hi - lo, m)


def run(xp: Any, steps: Sequence[ElementStep], src: Any, dst: Any, lo: int, hi: int, m: int,
        scratch: Callable[[int], Any]) -> None:
    """Run ``steps`` on chunks ``lo:hi`` of ``m`` elements: ``src`` holds the stored elements of
    every chunk end to end, ``dst`` receives the decoded ones end to end (byte buffers).
    ``scratch(nbytes)`` lends a byte buffer for the values between two steps."""
    cur, cur_lo = src, lo
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        # between two steps: the group's rows from row 0 of a scratch buffer
        nxt, nxt_lo = (dst, lo) if last else (scratch((hi - lo) * m * step.decoded.itemsize), 0)
        with np.errstate(all="ignore"):  # overflow to inf is the data's value (numcodecs warns, cupy is silent)
            step.apply(xp, _rows(cur, cur_lo, cur_lo + hi - lo, m, step.stored),
                       _rows(nxt, nxt_lo, nxt_lo + hi - lo, m, step.decoded))
        cur, cur_lo = nxt, nxt_lo
