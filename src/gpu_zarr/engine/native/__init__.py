"""The native host library (``native/gz_native.c``): load it, expose its batch calls.

One job: find ``libgz_native.so`` (built next to this module by the package's build hook on
``pip install``), load it with ctypes, and offer typed batch calls -- read many byte ranges,
decode many chunks, place many chunks, or all three per chunk; and the writer's one: create
many files from their pieces (``native/gz_write.c``) -- each spread over native threads with
no Python per file or chunk (ctypes releases the GIL for the call). :func:`status` says whether
it loaded and which codec libraries it found (dlopen at run time: libzstd, liblz4, zlib,
libdeflate), or why not. The ``native`` setting (``GPU_ZARR_NATIVE=0``) turns it off: the
engine then runs its pure-Python paths. It is asked at each decision (:func:`available`,
:func:`library`, :func:`status`), so ``settings.set(native=False)`` applies to reads prepared
after it; the library itself is loaded once per process (from the ``native_library`` setting,
``GPU_ZARR_NATIVE_LIB``, when given), and a batch call already decided on runs on it.

Every call returns per-item status codes; :func:`describe` turns one into words, and
:data:`UNSUPPORTED` are the codes for which a caller falls back to numcodecs.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from gpu_zarr import settings
from gpu_zarr.engine.place import place_geometry

__all__ = ["CODECS", "address", "checksums", "OK", "SHORT", "UNSUPPORTED", "NativeStatus", "available",
           "codec_available", "decode", "delta", "describe", "fused", "library", "loaded", "place", "place_chunks",
           "read", "stat_files", "Arrivals", "scratch_per_thread", "status", "unshuffle", "write_files"]

LIBNAME = "libgz_native.so"
VERSION = 14  # gz_version() of the library this module speaks to (an older build is refused: rebuild)
CODECS = MappingProxyType({"raw": 0, "zstd": 1, "lz4": 2, "zlib": 3, "gzip": 4, "deflate": 5, "blosc": 6,
                          "lz4-sized": 7})
OK, OPEN, SHORT, IO, BOUNDS, CORRUPT, SIZE = 0, 1, 2, 3, 4, 10, 11
CRC32C_MISMATCH = 18
UNSUPPORTED = frozenset(range(20, 25))
_LIBS = ("libzstd", "liblz4", "zlib", "libdeflate")
# codec -> the libraries that can decode it (any one of them)
_NEEDS = MappingProxyType({"raw": (), "zstd": ("libzstd",), "lz4": ("liblz4",), "zlib": ("zlib", "libdeflate"),
          "gzip": ("zlib", "libdeflate"), "deflate": ("zlib", "libdeflate"), "blosc": (), "lz4-sized": ("liblz4",)})

_i64p = np.ctypeslib.ndpointer(np.int64, flags="C_CONTIGUOUS")
_i32p = np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS")
_vp = ctypes.c_void_p
_i64, _int = ctypes.c_int64, ctypes.c_int


@dataclass(frozen=True)
class NativeStatus:
    """Whether the native library runs here: the shared library loaded (or looked for), why it
    is not loaded ("" when it is), per codec library "" when loaded or why not, and the codecs
    the library can decode here (Blosc inner codecs follow the libraries)."""

    loaded: bool
    path: str | None
    reason: str
    libraries: dict[str, str]
    codecs: tuple[str, ...]

    def summary(self) -> str:
        """One line for ``gpu-zarr info``."""
        if not self.loaded:
            return f"not loaded ({self.reason}); the pure-Python host path runs"
        libs = ", ".join(k for k, v in self.libraries.items() if not v) or "none"
        return f"loaded ({libs}): {', '.join(self.codecs)}"


def _candidates() -> list[Path]:
    here = Path(__file__).parent
    other = settings.get("native_library")
    return ([Path(other)] if other else []) + [here / LIBNAME]


def _state() -> tuple[Any, NativeStatus]:
    """(library or None, status), the ``native`` setting asked now (a dict lookup)."""
    if settings.get("native"):
        return _load()
    return None, NativeStatus(False, None, "turned off by the native setting (GPU_ZARR_NATIVE=0)", {}, ())


def loaded() -> Any:
    """The loaded ctypes library, for a batch call its caller decided on (:func:`available`).

    The ``native`` switch is not asked again once the library is loaded, so a
    ``settings.set(native=False)`` meanwhile does not pull it from a read under way; while it
    is off, nothing loads it.

    Raises
    ------
    RuntimeError
        The library is not loaded (turned off before it ever loaded, not built, or refused).
    """
    if not settings.get("native") and not _load.cache_info().currsize:
        raise RuntimeError("the native library is turned off by the native setting (GPU_ZARR_NATIVE=0)")
    lib, st = _load()
    if lib is None:
        raise RuntimeError(f"the native library is not loaded ({st.reason})")
    return lib


@functools.cache
def _load() -> tuple[Any, NativeStatus]:
    """Load the library, once per process (the ``native`` switch is asked by :func:`_state`)."""
    path = next((p for p in _candidates() if p.exists()), None)
    if path is None:
        return None, NativeStatus(False, str(_candidates()[-1]), "the library was not built (no C compiler when the "
                                  "package was installed?); reinstall with a C compiler (cc) on PATH", {}, ())
    try:
        lib = ctypes.CDLL(str(path))
        if lib.gz_version() != VERSION:
            raise OSError(f"version {lib.gz_version()}, expected {VERSION}: rebuild it (reinstall the package)")
    except (OSError, AttributeError) as exc:
        return None, NativeStatus(False, str(path), f"it did not load: {exc}", {}, ())
    lib.gz_strerror.restype = ctypes.c_char_p
    lib.gz_library_error.restype = ctypes.c_char_p
    lib.gz_read.restype = lib.gz_decode.restype = lib.gz_place.restype = lib.gz_fused.restype = _i64
    lib.gz_checksum.restype = _i64
    lib.gz_checksum.argtypes = [_int, _i64, _vp, _i64, _i64p, _i64p, _int,
                                np.ctypeslib.ndpointer(np.uint32, flags="C_CONTIGUOUS"), _i32p]
    lib.gz_read.argtypes = [_vp, _i64, _i64, _i64p, _i64p, _i64p, _i64p, _vp, _i64, _i64, _int, _i32p, _i64p]
    lib.gz_decode.argtypes = [_int, _i64, _vp, _i64, _i64p, _i64p, _vp, _i64, _i64p, _i64p, _int, _i32p, _i64p]
    lib.gz_place.argtypes = [_i64, _vp, _i64, _i64p, _i64, _i64p, _int, _i64p, _int, _int, _vp, _i64, _int, _i32p]
    lib.gz_fused.argtypes = [_int, _vp, _i64, _i64, _i64p, _i64p, _i64p, _i64, _i64p, _int, _i64p, _int, _int, _vp,
                             _i64, _vp, _vp, _i64, _int, _i32p, _i64p, _int]
    lib.gz_write_files.restype = _i64
    lib.gz_write_files.argtypes = [_vp, _i64, _i64p, np.ctypeslib.ndpointer(np.uint64, flags="C_CONTIGUOUS"), _i64p,
                                   _int, _i32p, _i64p]
    lib.gz_arrivals_open.restype = _vp
    lib.gz_arrivals_open.argtypes = [_int, _i64, _i64, _i64p, _int, _i64p, _int, _int, _vp, _i64, _vp, _vp, _int,
                                     _int, _i32p, _i64p]
    lib.gz_arrivals_add.restype = _int
    lib.gz_arrivals_add.argtypes = [_vp, _i64, _vp, _i64]
    lib.gz_arrivals_close.restype = _i64
    lib.gz_arrivals_close.argtypes = [_vp]
    lib.gz_delta.restype = _int
    lib.gz_delta.argtypes = [_vp, _vp, _i64, _i64, _int]
    lib.gz_unshuffle.restype = None
    lib.gz_unshuffle.argtypes = [_vp, _vp, _i64, _i64, _int]
    lib.gz_stat.restype = None
    lib.gz_stat.argtypes = [_vp, _i64, _int, _i64p, _i64p, _i32p]
    lib.gz_lz4_check.restype = _i64
    lib.gz_lz4_check.argtypes = [_i64, _vp, _i64, _i64p, _i64p, _i64p, _int, _i32p]
    mask = lib.gz_libraries()
    libs = {name: ("" if mask >> k & 1 else lib.gz_library_error(k).decode(errors="replace") or "not found")
            for k, name in enumerate(_LIBS)}
    have = {k for k, v in libs.items() if not v}
    codecs = tuple(c for c, need in _NEEDS.items() if not need or have & set(need))
    return lib, NativeStatus(True, str(path), "", libs, codecs)


def library() -> Any:
    """The loaded ctypes library, or None (not loaded, or turned off by the ``native`` setting)."""
    return _state()[0]


def status() -> NativeStatus:
    """Whether the native library loaded, its codec libraries, or why not."""
    return _state()[1]


def available() -> bool:
    """The native library is loaded (and not turned off by the ``native`` setting, ``GPU_ZARR_NATIVE=0``)."""
    return _state()[0] is not None


def codec_available(codec: str) -> bool:
    """The native library can decode ``codec`` here ("raw", "zstd", "lz4", "zlib", "gzip",
    "deflate", "blosc", "lz4-sized": numcodecs' LZ4 chunks; Blosc chunks whose inner codec's library is missing report
    "unsupported", per chunk)."""
    return codec in status().codecs


def describe(code: int, detail: int = 0) -> str:
    """A status code (and its detail: errno, bytes found, decoded size) in words."""
    lib = library()
    text = lib.gz_strerror(int(code)).decode() if lib is not None else f"status {code}"
    if code in (OPEN, IO) and detail:
        text += f" ({os.strerror(int(detail))})"
    elif code == SHORT:
        text += f" (it has {int(detail)} of them)"
    elif code == 11 and detail:
        text += f" (its header says {int(detail)} bytes)"
    return text


def address(a: np.ndarray) -> int:
    """Where ``a``'s first element lies in memory. A writable array's address comes through
    the buffer protocol (``a.ctypes.data`` builds a Python helper object each call)."""
    try:  # (a writable C-contiguous array of at least one byte)
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):  # read-only, empty or strided: numpy says
        return int(a.ctypes.data)


def _ptr(a: Any) -> int:
    return address(a) if isinstance(a, np.ndarray) else int(a)


def _i64a(v: Any) -> np.ndarray:
    return np.ascontiguousarray(v, np.int64)


class _Paths:
    """A C array of NUL-terminated file names, kept alive with it."""

    def __init__(self, files: list[Any]) -> None:
        self._bytes = [os.fsencode(f) for f in files]
        self.array = (ctypes.c_char_p * max(1, len(self._bytes)))(*self._bytes)
        self.n = len(self._bytes)


def _pointers(bufs: list[np.ndarray | None] | None) -> np.ndarray | None:
    """The addresses of ``bufs`` for the library (0 for None), or None when there are none."""
    if bufs is None or all(b is None for b in bufs):
        return None
    return np.array([0 if b is None else _ptr(b) for b in bufs], np.uint64)


def _check_buffer(buf: np.ndarray, what: str) -> None:
    if not (isinstance(buf, np.ndarray) and buf.flags.c_contiguous and buf.flags.writeable):
        raise ValueError(f"{what} must be a writable C-contiguous numpy array")


def read(files: list[Any], file_id: Any, file_offset: Any, sizes: Any, dst_offsets: Any, dst: np.ndarray,
         threads: int, group_bytes: int = 4 << 20) -> tuple[np.ndarray, np.ndarray]:
    """Read item i (``sizes[i]`` bytes at ``file_offset[i]`` of ``files[file_id[i]]``) into
    ``dst[dst_offsets[i]:]`` on ``threads`` native threads.

    Consecutive items of one file form a group of at most ``group_bytes`` that one thread
    reads with the file opened once; cut larger items into parts first.

    Returns
    -------
    (status, detail)
        Per item: :data:`OK` or an error code, and its detail (errno, or the bytes found).
    """
    _check_buffer(dst, "dst")
    fid, foff, size, doff = _i64a(file_id), _i64a(file_offset), _i64a(sizes), _i64a(dst_offsets)
    n = len(fid)
    st, det = np.empty(n, np.int32), np.empty(n, np.int64)
    if n:
        paths = _Paths(files)
        loaded().gz_read(ctypes.cast(paths.array, _vp), paths.n, n, fid, foff, size, doff, _ptr(dst), dst.nbytes,
                         int(group_bytes), int(threads), st, det)
    return st, det


def _piece_address(p: Any) -> tuple[int, int, Any]:
    """(address, length, what keeps it alive) of a bytes-like piece (numpy array, bytes, memoryview)."""
    a = p if isinstance(p, np.ndarray) and p.flags.c_contiguous else np.frombuffer(memoryview(p).cast("B"), np.uint8)
    return (address(a) if a.nbytes else 0), int(a.nbytes), a


def write_files(paths: list[Any], pieces: list[list[Any]], threads: int) -> tuple[np.ndarray, np.ndarray]:
    """Create file i (``paths[i]``, which must not exist; missing parent folders are made) from
    ``pieces[i]`` (bytes-like objects, C-contiguous, written in order) on ``threads`` native threads.

    Returns
    -------
    (status, detail)
        Per file: :data:`OK` (detail: the bytes written), or ``OPEN`` / ``IO`` (detail: the errno).
    """
    n = len(paths)
    if len(pieces) != n:
        raise ValueError(f"{n} paths but {len(pieces)} lists of pieces")
    st, det = np.empty(n, np.int32), np.empty(n, np.int64)
    if not n:
        return st, det
    flat = [_piece_address(p) for ps in pieces for p in ps]
    first = np.zeros(n + 1, np.int64)
    np.cumsum([len(ps) for ps in pieces], out=first[1:])
    ptrs = np.array([f[0] for f in flat], np.uint64) if flat else np.zeros(1, np.uint64)
    lens = np.array([f[1] for f in flat], np.int64) if flat else np.zeros(1, np.int64)
    names = _Paths(paths)
    loaded().gz_write_files(ctypes.cast(names.array, _vp), n, first, ptrs, lens, int(threads), st, det)
    del flat  # the pieces' arrays were alive for the whole call
    return st, det


def decode(codec: str, src: np.ndarray, src_offsets: Any, src_sizes: Any, dst: np.ndarray, dst_offsets: Any,
           dst_sizes: Any, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode item i (``src[src_offsets[i]:][:src_sizes[i]]``) to exactly ``dst_sizes[i]`` bytes
    at ``dst[dst_offsets[i]:]`` (``codec`` a key of :data:`CODECS`). Returns (status, detail)."""
    _check_buffer(dst, "dst")
    src = np.ascontiguousarray(src).view(np.uint8).reshape(-1)
    so, ss, do = _i64a(src_offsets), _i64a(src_sizes), _i64a(dst_offsets)
    n = len(so)
    ds = np.broadcast_to(_i64a(dst_sizes), (n,)).copy()
    st, det = np.empty(n, np.int32), np.empty(n, np.int64)
    if n:
        loaded().gz_decode(CODECS[codec], n, _ptr(src), src.nbytes, so, ss, _ptr(dst), dst.nbytes, do, ds,
                           int(threads), st, det)
    return st, det


def checksums(kind: str, buf: np.ndarray, offsets: Any, sizes: Any, threads: int) -> np.ndarray | None:
    """CRC-32 (``kind="crc32"``), Adler-32 (``"adler32"``) or CRC-32C (``"crc32c"``) of each span
    of ``buf``, on ``threads`` native threads; None when neither zlib nor libdeflate is loaded (CRC-32C
    needs neither)."""
    buf = np.ascontiguousarray(buf).view(np.uint8).reshape(-1)
    off, size = _i64a(offsets), _i64a(sizes)
    n = len(off)
    out, st = np.zeros(n, np.uint32), np.empty(n, np.int32)
    code = {"crc32": 0, "adler32": 1, "crc32c": 2}[kind]
    if n and loaded().gz_checksum(code, n, _ptr(buf), buf.nbytes, off, size, int(threads),
                                  out, st):
        if (st == 20).any():
            return None
        raise ValueError("checksum spans lie outside the buffer")
    return out


def lz4_check(buf: np.ndarray, offsets: Any, sizes: Any, dsizes: Any, threads: int) -> np.ndarray | None:
    """Each LZ4 block ``buf[offsets[i]:+sizes[i]]`` walked, without decoding it, as LZ4's safe
    decoder would decode it to ``dsizes[i]`` bytes (``gz_lz4_check``): the status of each (0
    when it decodes to exactly that size; see :func:`describe`), or None without the library."""
    if not available():
        return None
    buf = np.ascontiguousarray(buf).view(np.uint8).reshape(-1)
    off, size, dsize = _i64a(offsets), _i64a(sizes), _i64a(dsizes)
    st = np.zeros(len(off), np.int32)
    if len(off):
        loaded().gz_lz4_check(len(off), _ptr(buf), buf.nbytes, off, size, dsize, int(threads), st)
    return st


def delta(src: np.ndarray, dst: np.ndarray) -> bool:
    """The Delta filter's decode of each row of ``src`` (a 2-D C-contiguous array of 1-, 2-, 4- or
    8-byte integers) into the same row of ``dst`` (same shape and dtype): its running sum,
    wrapping. False, with nothing done, when the library is not loaded or the arrays do not
    fit that description (the caller then uses numpy)."""
    lib = _rows_lib(src, dst, (1, 2, 4, 8))
    ok = lib is not None and src.dtype == dst.dtype and src.dtype.kind in "iu" and src.dtype.isnative
    if ok and src.size:
        lib.gz_delta(src.ctypes.data, dst.ctypes.data, src.shape[0], src.shape[1], src.dtype.itemsize)
    return ok


def _rows_lib(src: np.ndarray, dst: np.ndarray, sizes: tuple[int, ...]) -> Any:
    """The library when ``src`` and ``dst`` are 2-D rows the element loops take (the same shape and
    item size, one of ``sizes``; C-contiguous, aligned, ``dst`` writable), else None."""
    lib = library()
    fits = (src.ndim == 2 and src.shape == dst.shape and src.dtype.itemsize == dst.dtype.itemsize
            and src.dtype.itemsize in sizes and src.flags.c_contiguous and src.flags.aligned
            and dst.flags.c_contiguous and dst.flags.aligned and dst.flags.writeable)
    return lib if fits else None


def place(src: np.ndarray, src_offsets: Any, chunk_nbytes: int, table: np.ndarray, out: np.ndarray,
          disk_dtype: np.dtype, perm: tuple[int, ...] | None, threads: int) -> np.ndarray:
    """Scatter decoded chunks (chunk k at ``src[src_offsets[k]:]``) into ``out`` with the
    placement ``table`` (see :func:`gpu_zarr.engine.place.place_cpu`). Returns the statuses."""
    src = np.ascontiguousarray(src).view(np.uint8).reshape(-1)
    return _place(_ptr(src), src.nbytes, _i64a(src_offsets), chunk_nbytes, table, out, disk_dtype, perm, threads)


def _place(src: int | None, src_nbytes: int, at: np.ndarray, chunk_nbytes: int, table: np.ndarray, out: np.ndarray,
           disk_dtype: np.dtype, perm: tuple[int, ...] | None, threads: int) -> np.ndarray:
    """``gz_place`` of chunk k at ``at[k]`` (an offset into ``src``; an address when ``src`` is None)."""
    _check_buffer(out, "out")
    st = np.empty(len(at), np.int32)
    if len(at):
        tab, strides, unit, swap = place_geometry(table, out.shape, np.dtype(disk_dtype), perm)
        loaded().gz_place(len(at), src, src_nbytes, at, int(chunk_nbytes), tab, tab.shape[1], strides, unit, swap,
                          _ptr(out), out.nbytes, int(threads), st)
    return st


def unshuffle(src: np.ndarray, dst: np.ndarray) -> bool:
    """The Shuffle filter's decode of each row of ``src`` (a 2-D C-contiguous array of 2-, 4- or
    8-byte elements, one chunk a row, its bytes in byte planes) into the same row of ``dst``.
    False, with nothing done, when the library is not loaded or the arrays do not fit."""
    lib = _rows_lib(src, dst, (2, 4, 8))
    ok = lib is not None
    if ok and src.size:
        lib.gz_unshuffle(src.ctypes.data, dst.ctypes.data, src.shape[0], src.shape[1] * src.dtype.itemsize,
                         src.dtype.itemsize)
    return ok


def stat_files(files: list[Any], threads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(size, modification time in ns, kind) of each file on ``threads`` native threads; kind
    0 a regular file, 1 none there (size and time -1), 2 not a regular file, 3 the stat failed
    (size: its errno). None without the library."""
    lib = library()
    if lib is None:
        return None
    n = len(files)
    size, mtime, kind = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int32)
    if n:
        paths = _Paths(files)
        lib.gz_stat(ctypes.cast(paths.array, _vp), n, int(threads), size, mtime, kind)
    return size, mtime, kind


def place_chunks(chunks: list[np.ndarray], chunk_nbytes: int, table: np.ndarray, out: np.ndarray,
                 disk_dtype: np.dtype, perm: tuple[int, ...] | None, threads: int) -> np.ndarray:
    """Scatter decoded chunks held in buffers of their own (chunk k is ``chunks[k]``, each a
    C-contiguous array of ``chunk_nbytes`` bytes: the chunk cache's) into ``out``, like
    :func:`place`, in one call. Returns the statuses."""
    bad = [k for k, c in enumerate(chunks)
           if not (isinstance(c, np.ndarray) and c.flags.c_contiguous and c.nbytes == chunk_nbytes)]
    if bad:
        raise ValueError(f"chunk {bad[0]} is not a C-contiguous buffer of {chunk_nbytes} bytes")
    addresses = np.fromiter((address(c) for c in chunks), np.int64, len(chunks))
    return _place(None, 0, addresses, chunk_nbytes, table, out, disk_dtype, perm, threads)


def fused(codec: str, files: list[Any], file_id: Any, file_offset: Any, sizes: Any, chunk_nbytes: int,
          table: np.ndarray, out: np.ndarray, disk_dtype: np.dtype, perm: tuple[int, ...] | None, threads: int,
          scratch: np.ndarray, keep: list[np.ndarray | None] | None = None,
          crc32c_frames: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk, on native threads: read its bytes, verify and strip its checksums, decode them,
    place them into ``out``; returns (status, detail) per chunk.

    ``crc32c_frames``: crc32c checksums at the end of each chunk's bytes (zarr v3 ``crc32c``
    codecs after the codec), verified (status 18 on a mismatch) and stripped before the decode.
    ``scratch``: at least ``threads * scratch_per_thread(codec, max(sizes), chunk_nbytes)``
    bytes (reused memory: fresh memory costs page faults). ``keep``: per chunk a buffer of
    ``chunk_nbytes`` bytes to decode into and keep (the chunk cache's), or None.
    """
    _check_buffer(out, "out")
    fid, foff, size = _i64a(file_id), _i64a(file_offset), _i64a(sizes)
    n = len(fid)
    st, det = np.empty(n, np.int32), np.empty(n, np.int64)
    if n == 0:
        return st, det
    threads = max(1, min(int(threads), n))
    per = scratch_per_thread(codec, int(size.max()), chunk_nbytes)
    if scratch.nbytes < threads * per:
        raise ValueError(f"scratch has {scratch.nbytes} bytes, {threads * per} needed")
    tab, strides, unit, swap = place_geometry(table, out.shape, np.dtype(disk_dtype), perm)
    keep_arr = _pointers(keep)
    paths = _Paths(files)
    loaded().gz_fused(CODECS[codec], ctypes.cast(paths.array, _vp), paths.n, n, fid, foff, size, int(chunk_nbytes),
                      tab, tab.shape[1], strides, unit, swap, _ptr(out), out.nbytes,
                      None if keep_arr is None else _ptr(keep_arr), _ptr(scratch), per, threads, st, det,
                      int(crc32c_frames))
    return st, det


class Arrivals:
    """Chunks decoded and placed into ``out`` on native threads as their bytes arrive (a remote
    read's answers): :meth:`add` queues one chunk and returns at once, a worker decodes it
    (into ``keep[i]`` when given, else its slot of ``scratch``) and places it with table row
    ``i`` while the rest are on the way; :meth:`close` waits for them all. A context manager
    (closed on exit, also on an error: no worker outlives it, and every buffer added is kept
    alive until then).

    ``n`` chunks (indices 0..n-1, each added at most once) of ``codec`` (a key of
    :data:`CODECS`), each ``chunk_nbytes`` decoded; ``table``, ``out``, ``disk_dtype`` and
    ``perm`` as for :func:`place`; at most ``threads`` workers on the set (the library's, kept
    between sets); ``scratch`` of at least ``min(threads, n) * chunk_nbytes`` bytes; ``keep``
    as for :func:`fused`. ``split``: workers at most on one Blosc chunk of several blocks (a run
    of its blocks each), so the last chunk of a read to arrive is not decoded by one thread
    while the others wait (1: one worker a chunk).
    """

    NOT_ADDED = 30

    def __init__(self, codec: str, n: int, chunk_nbytes: int, table: np.ndarray, out: np.ndarray,
                 disk_dtype: np.dtype, perm: tuple[int, ...] | None, threads: int, scratch: np.ndarray,
                 keep: list[np.ndarray | None] | None = None, split: int = 1) -> None:
        _check_buffer(out, "out")
        threads = max(1, min(int(threads), 64))
        if scratch.nbytes < min(threads, n) * chunk_nbytes:
            raise ValueError(f"scratch has {scratch.nbytes} bytes, {min(threads, n) * chunk_nbytes} needed")
        self.status, self.detail = np.empty(n, np.int32), np.empty(n, np.int64)
        tab, strides, unit, swap = place_geometry(table, out.shape, np.dtype(disk_dtype), perm)
        self._keep_arr = _pointers(keep)
        self.keep = keep
        # every buffer the workers touch (the geometry's arrays too), alive until close
        self._alive: list[Any] = [out, scratch, keep, tab, strides]
        self._lib = loaded()  # the set's library for its life: add() runs once per chunk
        self._h = self._lib.gz_arrivals_open(CODECS[codec], n, int(chunk_nbytes), tab, tab.shape[1], strides, unit,
                                             swap, _ptr(out), out.nbytes,
                                             None if self._keep_arr is None else _ptr(self._keep_arr),
                                             _ptr(scratch), threads, max(1, int(split)), self.status, self.detail)
        if not self._h:
            raise MemoryError("the native library could not start decoding as answers arrive (out of memory?)")

    @property
    def handle(self) -> int:
        """The set's native handle (0 once closed): what the native HTTP client hands complete
        answers to (:class:`~gpu_zarr.engine.sources.http.Sink`)."""
        return int(self._h or 0)

    def add(self, i: int, data: np.ndarray, offset: int, nbytes: int) -> None:
        """Queue chunk ``i``: ``nbytes`` encoded bytes at ``data[offset:]`` (kept alive until close)."""
        if offset < 0 or nbytes < 0 or offset + nbytes > data.nbytes:
            raise ValueError(f"chunk {i}: bytes {offset}..{offset + nbytes} lie outside its answer ({data.nbytes})")
        self._alive.append(data)
        if self._lib.gz_arrivals_add(self._h, int(i), _ptr(data) + int(offset), int(nbytes)) != OK:
            raise ValueError(f"chunk {i} was added twice, or is not one of this set's")

    def close(self) -> tuple[np.ndarray, np.ndarray]:
        """Wait for every chunk added; (status, detail) per chunk (:attr:`NOT_ADDED`: never added)."""
        if self._h:
            self._lib.gz_arrivals_close(self._h)
            self._h = None
            self._alive = []
        return self.status, self.detail

    def __enter__(self) -> Arrivals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scratch_per_thread(codec: str, max_encoded: int, chunk_nbytes: int) -> int:
    """Scratch bytes one thread of :func:`fused` needs (encoded bytes, then the decoded chunk)."""
    enc = -(-max(max_encoded, 1) // 64) * 64
    return enc if codec == "raw" else enc + -(-chunk_nbytes // 64) * 64
