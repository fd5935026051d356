"""ctypes binding to nvCOMP's low-level batched decode API (zstd, LZ4, Deflate).

nvCOMP's Python API (``nvidia.nvcomp.Codec``) builds its batch objects with one Python
call per chunk and hides the scratch memory and the per-chunk statuses. The C entry points
of the ``nvidia-libnvcomp-cu13`` (or ``-cu12``) wheel give that control back:

- the decode scratch is sized with ``nvcompBatched<Algo>DecompressGetTempSize`` (max
  chunks, max decoded chunk bytes, total decoded bytes), allocated once per decoder and
  grown only when a batch needs more;
- the device arrays of pointers and sizes are built per batch from one base pointer plus
  int64 offsets (numpy vector arithmetic, one host->device copy), never per chunk;
- the per-chunk statuses and actual decoded sizes come back in ONE small device->host
  copy after the batch; a failed or short chunk raises
  :class:`~gpu_zarr.errors.CorruptChunkError` naming that chunk.

Signatures and option structs follow the nvCOMP 6.0 headers (``nvcomp/zstd.h``,
``lz4.h``, ``deflate.h``, ``shared_types.h``). Older libraries (4.x, 5.x) have other
signatures: they are refused with an error that names the fix, never called.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from gpu_zarr import settings
from gpu_zarr.errors import INSTALL_HINT, CorruptChunkError, GPUUnavailable

__all__ = [
    "ALGORITHMS",
    "MIN_VERSION",
    "BatchedDecoder",
    "NvcompLibrary",
    "PendingBatch",
    "batched_decoder",
    "copy_spans",
    "load_library",
    "nvcomp_info",
]

ALGORITHMS = MappingProxyType({"zstd": "Zstd", "lz4": "LZ4", "deflate": "Deflate"})
MIN_VERSION = (6, 0)
UPGRADE_HINT = ('pip install -U "nvidia-libnvcomp-cu13>=6,<7"  (or nvidia-libnvcomp-cu12 for a CUDA 12 '
                'driver; both come with napari-gpu-zarr[cuda13] / [cuda12])')

_BACKENDS = MappingProxyType({"default": 0, "hardware": 1, "cuda": 2})
_STATUS = MappingProxyType({0: "success", 10: "invalid value", 11: "not supported", 12: "cannot decompress",
           13: "bad checksum", 14: "cannot verify checksums", 15: "output buffer too small",
           16: "wrong header length", 17: "alignment", 18: "chunk size too large",
           20: "wrong input length", 21: "batch size too large", 1000: "CUDA error", 10000: "internal error"})
# largest decoded chunk each algorithm accepts (headers: *DecompressionMaxAllowedChunkSize)
_MAX_CHUNK = MappingProxyType({"zstd": (1 << 31) - 1, "lz4": (1 << 32) - 1, "deflate": (1 << 32) - 1})


class _DecompressOpts(ctypes.Structure):
    """The 64-byte decompress option struct, passed by value.

    zstd: ``{backend; reserved[60]}``; LZ4: ``{backend; sort_before_hw_decompress; data_type;
    bitshuffle_mode; reserved[48]}``; Deflate: ``{backend; sort_before_hw_decompress;
    reserved[56]}``. With every field after ``backend`` zero the bytes are the same for all
    three (no bitshuffle for LZ4, no sorting), so one layout serves them.
    """

    _fields_ = [("backend", ctypes.c_int), ("sort_before_hw_decompress", ctypes.c_int),
                ("data_type", ctypes.c_int), ("bitshuffle_mode", ctypes.c_int),
                ("reserved", ctypes.c_char * 48)]


class _Alignments(ctypes.Structure):
    _fields_ = [("input", ctypes.c_size_t), ("output", ctypes.c_size_t), ("temp", ctypes.c_size_t)]


class _Properties(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("cudart_version", ctypes.c_uint32)]


class _CRC32Spec(ctypes.Structure):
    _fields_ = [("poly", ctypes.c_uint32), ("init", ctypes.c_uint32), ("ref_in", ctypes.c_bool),
                ("ref_out", ctypes.c_bool), ("xorout", ctypes.c_uint32), ("reserved", ctypes.c_char * 16)]


class _CRC32KernelConf(ctypes.Structure):
    _fields_ = [("kernel_kind", ctypes.c_int), ("bytes_per_read", ctypes.c_int32),
                ("blocks_per_msg", ctypes.c_int32), ("reserved", ctypes.c_char * 20)]


class _CRC32Opts(ctypes.Structure):
    _fields_ = [("spec", _CRC32Spec), ("kernel_conf", _CRC32KernelConf), ("reserved", ctypes.c_char * 64)]


assert ctypes.sizeof(_DecompressOpts) == 64
assert ctypes.sizeof(_CRC32Spec) == 32 and ctypes.sizeof(_CRC32KernelConf) == 32 and ctypes.sizeof(_CRC32Opts) == 128


@dataclass(frozen=True)
class NvcompLibrary:
    """A loaded libnvcomp (``lib``, a ctypes.CDLL, from the file ``path``), its (major, minor,
    patch) version from ``nvcompGetProperties`` and the CUDA runtime version it was built with
    (e.g. 13000)."""

    path: str
    version: tuple[int, int, int]
    cudart_version: int
    lib: Any

    @property
    def version_string(self) -> str:
        return ".".join(str(v) for v in self.version)


def _candidates() -> list[str]:
    """libnvcomp files to try, best first: the ``nvcomp_library`` setting, then the pip wheels, then the loader path.

    The wheels are found through their installed file lists (nothing is imported).
    """
    from importlib import metadata

    out: list[str] = []
    other = settings.get("nvcomp_library")
    if other:
        out.append(other)
    for dist in ("nvidia-libnvcomp-cu13", "nvidia-libnvcomp-cu12"):
        try:
            files = metadata.distribution(dist).files or []
        except metadata.PackageNotFoundError:
            continue
        for f in files:
            if Path(str(f)).name.startswith("libnvcomp.so"):
                out.append(str(Path(str(f.locate())).resolve()))
    out += ["libnvcomp.so.6", "libnvcomp.so"]
    return out


def _loader_lock() -> threading.Lock:
    lock = getattr(_loader_lock, "lock", None)
    if lock is None:
        lock = _loader_lock.lock = threading.Lock()  # type: ignore[attr-defined]
    return lock


def _entry_points(algo: str) -> tuple[str, str, str]:
    a = ALGORITHMS[algo]
    return (f"nvcompBatched{a}DecompressGetTempSize", f"nvcompBatched{a}DecompressAsync",
            f"nvcompBatched{a}DecompressGetRequiredAlignments")


def _open(path: str) -> NvcompLibrary:
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    if not hasattr(lib, "nvcompGetProperties"):
        raise GPUUnavailable(f"{path} has no nvcompGetProperties: it is not nvCOMP >= 3; this package needs "
                             f"nvCOMP >= {MIN_VERSION[0]}.{MIN_VERSION[1]}. Fix: {UPGRADE_HINT}")
    props = _Properties()
    lib.nvcompGetProperties.restype = ctypes.c_int
    lib.nvcompGetProperties.argtypes = [ctypes.POINTER(_Properties)]
    rc = lib.nvcompGetProperties(ctypes.byref(props))
    if rc != 0:
        raise GPUUnavailable(f"nvcompGetProperties failed in {path} (status {rc}). Fix: {UPGRADE_HINT}")
    v = int(props.version)
    version = (v // 1000, (v % 1000) // 100, v % 100)
    return NvcompLibrary(path, version, int(props.cudart_version), lib)


def _check(nv: NvcompLibrary) -> NvcompLibrary:
    if nv.version[:2] < MIN_VERSION or nv.version[0] > MIN_VERSION[0]:
        raise GPUUnavailable(
            f"nvCOMP {nv.version_string} at {nv.path} is not supported: the batched decode API this package "
            f"calls is the one of nvCOMP {MIN_VERSION[0]}.x (the signatures differ in 4.x/5.x and may in 7.x). "
            f"Fix: {UPGRADE_HINT}")
    missing = [name for algo in ALGORITHMS for name in _entry_points(algo) if not hasattr(nv.lib, name)]
    if missing:
        raise GPUUnavailable(f"nvCOMP {nv.version_string} at {nv.path} lacks the entry points {missing}. "
                             f"Fix: {UPGRADE_HINT}")
    return nv


def load_library(refresh: bool = False) -> NvcompLibrary:
    """Load libnvcomp once per process and check that it is a version this module supports.

    The library is looked for in the ``nvcomp_library`` setting
    (``$GPU_ZARR_NVCOMP_LIBRARY``), then in the ``nvidia-libnvcomp-cu13``/``-cu12`` wheel
    (``nvidia/libnvcomp/lib64``), then on the loader's path.

    Returns
    -------
    NvcompLibrary

    Raises
    ------
    GPUUnavailable
        No libnvcomp was found, or it is older than :data:`MIN_VERSION` / of another major
        version, or it lacks an entry point; the message names the fix.
    """
    with _loader_lock():
        cached = getattr(load_library, "cached", None)
        if cached is not None and not refresh:
            return cached
        errors = []
        for path in _candidates():
            try:
                nv = _open(path)
            except OSError as exc:
                errors.append(f"{path}: {exc}")
                continue
            nv = _check(nv)
            load_library.cached = nv  # type: ignore[attr-defined]
            return nv
        tried = "; ".join(errors[:3]) or "nothing found"
        raise GPUUnavailable(f"libnvcomp (nvCOMP's C library) could not be loaded ({tried}). Fix: {UPGRADE_HINT}")


def nvcomp_info() -> dict[str, Any]:
    """What :mod:`gpu_zarr.capabilities` reports: version, path, whether the low-level API loaded.

    Never raises: a failure is reported in ``error``.
    """
    try:
        nv = load_library()
    except Exception as exc:  # noqa: BLE001  (a broken install must not break the probe)
        return {"low_level": False, "version": _wheel_version(), "path": None, "error": str(exc)}
    return {"low_level": True, "version": nv.version_string, "path": nv.path, "error": None}


def _wheel_version() -> str | None:
    from importlib import metadata

    for dist in ("nvidia-libnvcomp-cu13", "nvidia-libnvcomp-cu12", "nvidia-nvcomp-cu13", "nvidia-nvcomp-cu12"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


_KERNELS = r"""
__device__ unsigned long long le(const unsigned char* p, int n) {
    unsigned long long v = 0;
    for (int i = 0; i < n; ++i) v |= ((unsigned long long)p[i]) << (8 * i);
    return v;
}

// One thread per zstd frame: walk the frame header and every block header (the same walk as
// gpu_zarr.engine.codecs.zstd_frames.check_frames). A bad frame gets a nonzero code and is replaced
// by a tiny valid frame, so nvCOMP never reads it (corrupt zstd input is undefined there and
// was measured to fault the GPU). table: [in_ptr | in_bytes | out_bytes | ...], n each.
extern "C" __global__ void zstd_sanitize(long long* table, long long n, long long dummy_ptr,
                                         long long dummy_bytes, long long* code) {
    long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    const unsigned char* p = (const unsigned char*)table[k];
    long long size = table[n + k];
    long long expected = table[2 * n + k];
    long long c = 0;
    if (size < 6) c = 1;
    else if (le(p, 4) != 0xFD2FB528ull) c = 2;
    else {
        int fhd = p[4];
        int single = (fhd >> 5) & 1, fcs_flag = fhd >> 6, has_ck = (fhd >> 2) & 1;
        if ((fhd >> 3) & 1) c = 3;
        else if (fhd & 3) c = 4;
        else {
            int fcs_size = fcs_flag == 0 ? single : (fcs_flag == 1 ? 2 : (fcs_flag == 2 ? 4 : 8));
            long long pos = 5 + (1 - single);
            if (pos + fcs_size + 3 > size) c = 5;
            else {
                if (fcs_size > 0) {
                    long long fcs = (long long)le(p + pos, fcs_size) + (fcs_size == 2 ? 256 : 0);
                    if (fcs != expected) c = 6;
                }
                pos += fcs_size;
                while (c == 0) {
                    if (pos + 3 > size) { c = 7; break; }
                    unsigned int h = (unsigned int)le(p + pos, 3);
                    int last = h & 1, btype = (h >> 1) & 3;
                    long long bsize = h >> 3;
                    if (btype == 3 || bsize > 131072) { c = 8; break; }
                    pos += 3 + (btype == 1 ? 1 : bsize);
                    if (pos > size) { c = 7; break; }
                    if (last) break;
                }
                if (c == 0) {
                    pos += 4 * has_ck;
                    if (pos != size) c = 9;
                }
            }
        }
    }
    code[k] = c;
    if (c != 0) { table[k] = dummy_ptr; table[n + k] = dummy_bytes; }
}

// One thread per LZ4 block: the walk of the native library's gz_lz4_check (LZ4's safe decoder's
// rules, copying nothing; its C twin runs before the CPU's batched LZ4 decode, and instead of this
// one where the host walks a batch sooner: codecs/lz4.py's walk_blocks). A block that does
// not decode to exactly its expected size gets code 20 (malformed) or 21 (another size) and is
// replaced by a tiny valid block, so nvCOMP never reads it (nvCOMP's LZ4 returned data for blocks
// cut short). table: [in_ptr | in_bytes | out_bytes | ...], n each.
__device__ int lz4_walk(const unsigned char* s, long long n, long long cap) {
    if (n <= 0) return 20;
    if (cap == 0) return (n == 1 && s[0] == 0) ? 0 : 20;
    long long ip = 0, op = 0;
    for (;;) {
        if (ip >= n) return 20;
        unsigned int token = s[ip++];
        long long len = token >> 4;
        if (len == 15) {
            unsigned int b;
            do {
                if (ip >= n) return 20;
                b = s[ip++];
                len += b;
            } while (b == 255 && len < (1LL << 40));
        }
        long long left = n - ip;
        if (len > left) return 20;
        if (op + len > cap - 12 || len > left - 8) {
            if (len != left || op + len > cap) return 20;
            return op + len == cap ? 0 : 21;
        }
        ip += len;
        op += len;
        long long off = (long long)s[ip] | ((long long)s[ip + 1] << 8);
        ip += 2;
        if (off == 0 || off > op) return 20;
        long long ml = token & 15;
        if (ml == 15) {
            unsigned int b;
            do {
                if (ip >= n - 5) return 20;
                b = s[ip++];
                ml += b;
            } while (b == 255 && ml < (1LL << 40));
        }
        ml += 4;
        if (op + ml > cap - 5) return 20;
        op += ml;
    }
}

extern "C" __global__ void lz4_sanitize(long long* table, long long n, long long dummy_ptr,
                                        long long dummy_bytes, long long* code) {
    long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    int c = lz4_walk((const unsigned char*)table[k], table[n + k], table[2 * n + k]);
    code[k] = c;
    if (c != 0) { table[k] = dummy_ptr; table[n + k] = dummy_bytes; }
}

// Adler-32 of n device buffers, one block per buffer: each thread sums a contiguous segment,
// thread 0 combines the segments in order (adler32_combine). ptrs/sizes: n int64 each.
extern "C" __global__ void adler32_batch(const long long* ptrs, const long long* sizes, long long n,
                                         unsigned int* out) {
    const unsigned long long M = 65521ull;
    __shared__ unsigned long long sa[256], sb[256], sl[256];
    for (long long k = blockIdx.x; k < n; k += gridDim.x) {
        const unsigned char* p = (const unsigned char*)ptrs[k];
        long long len = sizes[k];
        long long per = (len + blockDim.x - 1) / blockDim.x;
        long long s = (long long)threadIdx.x * per;
        if (s > len) s = len;
        long long e = s + per;
        if (e > len) e = len;
        unsigned long long a = 0, b = 0;
        for (long long i = s; i < e; ) {
            long long stop = i + 4096 < e ? i + 4096 : e;  // reduce before a 64-bit sum could overflow
            for (; i < stop; ++i) { a += p[i]; b += a; }
            a %= M; b %= M;
        }
        sa[threadIdx.x] = a; sb[threadIdx.x] = b; sl[threadIdx.x] = (unsigned long long)(e - s);
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long A = 1, B = 0;
            for (unsigned int t = 0; t < blockDim.x; ++t) {
                B = (B + (sl[t] % M) * A + sb[t]) % M;
                A = (A + sa[t]) % M;
            }
            out[k] = (unsigned int)((B << 16) | A);
        }
        __syncthreads();
    }
}
"""
_ZSTD_CODES = MappingProxyType({1: "too short for a zstd frame", 2: "does not start with the zstd magic number 28b52ffd",
               3: "frame header has its reserved bit set", 4: "frame needs a zstd dictionary, which zarr never uses",
               5: "frame header is truncated", 6: "frame header states another decoded size than the array metadata",
               7: "frame is truncated inside a block", 8: "invalid zstd block header",
               9: "frame does not end where the chunk ends (truncated checksum or trailing bytes)"})
_LZ4_CODES = MappingProxyType({20: "malformed LZ4 block (a run or match outside the block or the chunk, or the "
                                   "block cut short)", 21: "LZ4 block decodes to another size than the array metadata"})
# what a bad frame or block is replaced with: a valid zstd frame, and a valid LZ4 block, of one byte
_DUMMY = MappingProxyType({"zstd": bytes.fromhex("28b52ffd200109000000"), "lz4": bytes.fromhex("1078")})
_SANITIZE = MappingProxyType({"zstd": "zstd_sanitize", "lz4": "lz4_sanitize"})


def _kernel(name: str) -> Any:
    import cupy

    cache = getattr(_kernel, "cache", None)
    if cache is None:
        cache = _kernel.cache = {}  # type: ignore[attr-defined]
    dev = cupy.cuda.Device().id
    k = cache.get((dev, name))
    if k is None:
        k = cache[(dev, name)] = cupy.RawModule(code=_KERNELS).get_function(name)
    return k


def _h2d(dev_ptr: int, host: np.ndarray, stream: Any) -> None:
    """Asynchronous host->device copy from pinned ``host`` on ``stream`` (never a hidden sync)."""
    import cupy

    cupy.cuda.runtime.memcpyAsync(dev_ptr, host.ctypes.data, host.nbytes, cupy.cuda.runtime.memcpyHostToDevice,
                                  stream.ptr)


def _d2h(host: np.ndarray, dev_ptr: int, stream: Any) -> None:
    import cupy

    cupy.cuda.runtime.memcpyAsync(host.ctypes.data, dev_ptr, host.nbytes, cupy.cuda.runtime.memcpyDeviceToHost,
                                  stream.ptr)


_COPY_KERNEL = r"""
extern "C" __global__ void copy_spans(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
                                      const long long* __restrict__ so, const long long* __restrict__ dof,
                                      const long long* __restrict__ n)
{
    const long long k = blockIdx.y;
    const long long len = n[k];
    const unsigned char* s = src + so[k];
    unsigned char* d = dst + dof[k];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < len; i += (long long)gridDim.x * blockDim.x)
        d[i] = s[i];
}
"""


def copy_spans(src: Any, src_offsets: np.ndarray, dst: Any, dst_offsets: np.ndarray, sizes: np.ndarray,
               stream: Any, keep: list | None = None, *, runtime: Any) -> None:
    """Copy many byte spans between device buffers with one kernel launch per 65535 spans.

    With ``keep`` (a list), the offsets go up through pinned memory without waiting for the
    stream, and the buffers that must outlive the queued copy are appended to ``keep``.
    ``runtime`` keeps the compiled kernel.
    """
    import cupy

    n = len(sizes)
    if n == 0:
        return
    kern = runtime.resource(("kernel", "copy_spans", cupy.cuda.Device().id),
                            lambda: cupy.RawKernel(_COPY_KERNEL, "copy_spans"))
    longest = int(np.max(sizes))
    gx = max(1, min(64, -(-longest // (256 * 4))))
    table = np.concatenate([np.asarray(src_offsets, np.int64), np.asarray(dst_offsets, np.int64),
                            np.asarray(sizes, np.int64)])
    with stream:
        meta = cupy.empty(3 * n, np.int64)
    if keep is None:
        meta.set(table, stream=stream)  # pageable: the copy waits for the stream's earlier work
    else:
        host = _pinned(3 * n)
        host[:] = table
        _h2d(int(meta.data.ptr), host, stream)  # pinned: asynchronous, ``keep`` holds it until the batch is checked
        keep += [host, meta]
    so, do, nn = meta[:n], meta[n:2 * n], meta[2 * n:]
    with stream:
        for p0 in range(0, n, 65535):
            cnt = min(65535, n - p0)
            kern((gx, cnt), (256,), (src, dst, so[p0:], do[p0:], nn[p0:]))


def _adler_works() -> bool:
    """Whether the Adler-32 kernel agrees with ``zlib.adler32`` on this device (checked once per device)."""
    import zlib

    import cupy

    dev = int(cupy.cuda.Device().id)
    cache = getattr(_adler_works, "cache", None)
    if cache is None:
        cache = _adler_works.cache = {}  # type: ignore[attr-defined]
    ok = cache.get(dev)
    if ok is None:
        rng = np.random.default_rng(7)
        bufs = [rng.integers(0, 256, n, dtype=np.uint8) for n in (1, 300, 70001)] + [np.full(1 << 20, 255, np.uint8)]
        want = np.array([zlib.adler32(b) for b in bufs], np.uint32)
        dev_bufs = [cupy.asarray(b) for b in bufs]
        ptrs = cupy.asarray(np.array([int(b.data.ptr) for b in dev_bufs], np.int64))
        sizes = cupy.asarray(np.array([b.nbytes for b in bufs], np.int64))
        out = cupy.zeros(len(bufs), np.uint32)
        _kernel("adler32_batch")((len(bufs),), (256,), (ptrs, sizes, np.int64(len(bufs)), out))
        ok = bool((out.get() == want).all())
        if not ok:
            import warnings

            warnings.warn("the GPU Adler-32 kernel disagrees with zlib on this device: zlib chunks decoded on the "
                          "GPU are not checked against their Adler-32 (nvCOMP statuses and sizes still are)",
                          RuntimeWarning, stacklevel=3)
        cache[dev] = ok
    return ok


def _round_up(x: np.ndarray, a: int) -> np.ndarray:
    return -(-x // a) * a


def _cuda_errors() -> tuple[type[BaseException], ...]:
    import cupy

    return (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError)


def _gpu_fault(exc: BaseException, algo: str, names: Sequence[str] | None, n: int) -> CorruptChunkError:
    """The clear error for a GPU fault during a batch (nvCOMP does not validate compressed blocks)."""
    which = f"chunks {names[0]} .. {names[n - 1]}" if names is not None and n else f"{n} chunks"
    return CorruptChunkError(
        f"the GPU faulted while nvCOMP decoded a batch of {algo} streams ({which}): {exc}. Most likely one of these "
        "chunks is corrupt inside a compressed block (nvCOMP does not validate block contents; measured: a "
        "flipped byte in a zstd block header can fault the GPU). This process's CUDA context is now unusable: "
        "restart Python. To find the chunk, read the same region with prefer='cpu' (its error names the chunk).")


class PendingBatch:
    """A queued batch decode whose statuses have not been looked at yet.

    :meth:`check` waits for the batch (an event, not the whole device), reads the
    per-chunk statuses, decoded sizes and frame-check codes (copied to pinned memory by
    the stream) and raises :class:`CorruptChunkError` for the first chunk that failed or
    decoded short. Call it once the batch is queued; the buffers the batch uses stay
    alive until then.
    """

    def __init__(self, algo: str, event: Any, host: np.ndarray, expected: np.ndarray, names: Sequence[str] | None, n: int,
                 keep: list, checksum: tuple[str, np.ndarray] | None = None) -> None:
        self._algo, self._event, self._host, self._expected, self._names, self._n = algo, event, host, expected, names, n
        self._keep = keep
        self._checksum = checksum
        self._checked = False

    def check(self) -> None:
        """Wait for the decode and raise CorruptChunkError naming the first bad chunk."""
        if self._checked:
            return
        try:
            self._event.synchronize()
        except _cuda_errors() as exc:
            self._checked = True
            raise _gpu_fault(exc, self._algo, self._names, self._n) from exc
        self._checked = True
        self._keep = []
        n = self._n
        actual, status, code = self._host[:n], self._host[n:2 * n], self._host[2 * n:3 * n]
        wrong = (code != 0) | (status != 0) | (actual != self._expected)
        got = want = None
        if self._checksum is not None:
            got = self._host[3 * n:4 * n] & 0xFFFFFFFF
            want = self._checksum[1].astype(np.int64)
            wrong |= got != want
        bad = np.flatnonzero(wrong)
        if len(bad) == 0:
            return
        k = int(bad[0])
        name = self._names[k] if self._names is not None else f"#{k} of the batch"
        more = f" ({len(bad) - 1} more chunks of this batch failed too)" if len(bad) > 1 else ""
        if code[k] != 0:
            codes = _LZ4_CODES if self._algo == "lz4" else _ZSTD_CODES
            what = f"{codes.get(int(code[k]), f'invalid {self._algo} stream')} (checked on the GPU before decoding)"
        elif status[k] != 0:
            what = f"nvCOMP {self._algo} decode failed with status {int(status[k])} ({_STATUS.get(int(status[k]), 'unknown')})"
        elif actual[k] != self._expected[k]:
            what = f"decoded to {int(actual[k])} bytes, but the array metadata says {int(self._expected[k])}"
        else:
            kind = self._checksum[0] if self._checksum is not None else "checksum"
            what = (f"the decoded bytes' {kind} is {int(got[k]):#010x}, the stream's trailer says "  # type: ignore[index]
                    f"{int(want[k]):#010x} (checked on the GPU)")  # type: ignore[index]
        raise CorruptChunkError(f"chunk {name}: {what}{more}. The chunk is corrupt or truncated; nothing of "
                                "it was placed. Rewrite or delete that chunk.")


class BatchedDecoder:
    """One nvCOMP batched decoder (zstd, LZ4 or Deflate) with its scratch, kept and reused.

    Parameters
    ----------
    algo : {"zstd", "lz4", "deflate"}
        zstd: standard zstd frames (RAW bitstream); lz4: raw LZ4 blocks (no frame, no size
        prefix); deflate: raw deflate streams (RFC 1951, no zlib/gzip wrapper).
    backend : {"cuda", "default", "hardware"}
        nvCOMP decompression backend. ``"cuda"`` (the default here) is the one whose
        statuses report corrupt LZ4 input; the hardware engine reports nothing.
    device : int, optional
        CUDA device (default: the current one).

    Notes
    -----
    The engine keeps one decoder per (device, algorithm, slot, stream) through the runtime.
    Queuing a batch holds the decoder's lock (threads sharing a decoder queue one batch at
    a time; waiting for the result does not hold it). When a decoder is handed another
    stream, that stream first waits for the work queued on the previous one (the scratch
    and the small device arrays are shared between calls).
    """

    def __init__(self, algo: str, backend: str = "cuda", device: int | None = None) -> None:
        if algo not in ALGORITHMS:
            raise ValueError(f"algo must be one of {sorted(ALGORITHMS)}, not {algo!r}")
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {sorted(_BACKENDS)}, not {backend!r}")
        try:
            import cupy
        except ImportError as exc:
            raise GPUUnavailable(f"nvCOMP decoding needs cupy, which is not installed: {INSTALL_HINT}") from exc
        self._cupy = cupy
        self.algo = algo
        self.nv = load_library()
        self.device = int(cupy.cuda.Device().id if device is None else device)
        lib = self.nv.lib
        temp_name, run_name, align_name = _entry_points(algo)
        self._temp_size = getattr(lib, temp_name)
        self._temp_size.restype = ctypes.c_int
        self._temp_size.argtypes = [ctypes.c_size_t, ctypes.c_size_t, _DecompressOpts,
                                    ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t, ctypes.c_void_p]
        self._run = getattr(lib, run_name)
        self._run.restype = ctypes.c_int
        self._run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, _DecompressOpts,
                              ctypes.c_void_p, ctypes.c_void_p]
        align = getattr(lib, align_name)
        align.restype = ctypes.c_int
        align.argtypes = [_DecompressOpts, ctypes.POINTER(_Alignments)]
        self._opts = _DecompressOpts()
        self._opts.backend = _BACKENDS[backend]
        al = _Alignments()
        rc = align(self._opts, ctypes.byref(al))
        if rc != 0:
            raise GPUUnavailable(f"nvCOMP {algo}: GetRequiredAlignments failed (status {rc}). Fix: {UPGRADE_HINT}")
        self.alignment = (max(1, int(al.input)), max(1, int(al.output)), max(1, int(al.temp)))
        self._scratch: Any = None  # cupy uint8, grown on demand
        self._meta: Any = None  # device int64: [in_ptr | in_bytes | out_bytes | out_actual | out_ptr | status]
        self._last_stream = None
        self.runtime: Any = None  # the runtime that keeps this decoder (None: the process's)
        self._lock = threading.Lock()  # one batch is queued at a time: the scratch and tables are shared
        self.calls = 0
        self.scratch_allocations = 0

    # -- memory -----------------------------------------------------------------------
    def temp_bytes(self, num_chunks: int, max_chunk_bytes: int, total_bytes: int) -> int:
        """nvCOMP's scratch size for a batch (``GetTempSize``; asks the GPU nothing)."""
        out = ctypes.c_size_t(0)
        rc = self._temp_size(int(num_chunks), int(max_chunk_bytes), self._opts, ctypes.byref(out),
                             int(total_bytes), None)
        if rc != 0:
            raise GPUUnavailable(f"nvCOMP {self.algo}: GetTempSize({num_chunks}, {max_chunk_bytes}, {total_bytes}) "
                                 f"failed with status {rc} ({_STATUS.get(rc, 'unknown')})")
        return int(out.value)

    @property
    def nbytes(self) -> int:
        """Device memory this decoder holds (scratch plus its pointer/size arrays)."""
        return int(sum(int(a.nbytes) for a in (self._scratch, self._meta) if a is not None))

    def close(self) -> None:
        """Free the scratch (once queued work is done)."""
        if self._last_stream is not None:
            self._last_stream.synchronize()
        self._scratch = self._meta = None

    def _ensure(self, attr: str, nbytes: int):
        cur = getattr(self, attr)
        if cur is None or cur.nbytes < nbytes:
            setattr(self, attr, None)
            cur = self._cupy.empty(max(int(nbytes), 1), np.uint8)
            setattr(self, attr, cur)
            if attr == "_scratch":
                self.scratch_allocations += 1
        return cur

    def _on(self, stream: Any) -> None:
        """Order ``stream`` after the work this decoder queued on another stream."""
        last = self._last_stream
        if last is not None and last.ptr != stream.ptr:
            stream.wait_event(last.record())
        self._last_stream = stream

    # -- decode -----------------------------------------------------------------------
    def decode(self, src: Any, src_offsets: np.ndarray, src_sizes: np.ndarray, dst: Any, dst_offsets: np.ndarray,
               dst_sizes: np.ndarray, stream: Any, names: Sequence[str] | None = None,
               check: bool = True, crc32: np.ndarray | None = None,
               adler32: np.ndarray | None = None, walked: bool = False) -> PendingBatch | None:
        """Decode every stream of a batch in ONE nvCOMP call on ``stream``.

        Parameters
        ----------
        src, dst : cupy.ndarray of uint8
            Encoded bytes (stream k at ``src_offsets[k]``, ``src_sizes[k]`` bytes) and the
            output (stream k decodes to ``dst[dst_offsets[k] : + dst_sizes[k]]``).
        src_offsets, src_sizes, dst_offsets, dst_sizes : ndarray of int64 (host)
            ``dst_sizes`` is each stream's exact decoded size: anything else is an error.
        stream : cupy.cuda.Stream
        names : sequence of str, optional
            Name of each stream's chunk, for error messages.
        check : bool
            True: wait for the batch and raise on a bad chunk before returning. False:
            return a :class:`PendingBatch` whose ``check()`` does that later.
        crc32 : ndarray of uint32, optional
            Expected CRC-32 (gzip's) of each stream's decoded bytes: computed on the GPU
            after the decode (``nvcompBatchedCRC32Async``) and checked with the statuses.
        adler32 : ndarray of uint32, optional
            Expected Adler-32 (zlib's) of each stream's decoded bytes: computed on the GPU
            by a small kernel (self-tested against ``zlib.adler32`` once per device; if that
            self-test fails the check is skipped with a warning).
        walked : bool
            LZ4: every block was walked on the host (``gz_lz4_check``); the GPU's walk
            (``lz4_sanitize``) is skipped.

        Raises
        ------
        CorruptChunkError
            A stream failed to decode or decoded to another size than ``dst_sizes``.
        ValueError
            Offsets/sizes outside the buffers or a decoded size over nvCOMP's limit.
        """
        so = np.ascontiguousarray(src_offsets, np.int64)
        ss = np.ascontiguousarray(src_sizes, np.int64)
        do = np.ascontiguousarray(dst_offsets, np.int64)
        ds = np.ascontiguousarray(dst_sizes, np.int64)
        n = len(so)
        if not (len(ss) == len(do) == len(ds) == n):
            raise ValueError("src_offsets, src_sizes, dst_offsets and dst_sizes must have one entry per stream")
        if n == 0:
            return None
        if (so < 0).any() or (ss < 0).any() or int((so + ss).max()) > src.nbytes:
            raise ValueError(f"a stream lies outside the source buffer of {src.nbytes} bytes")
        if (do < 0).any() or (ds < 0).any() or int((do + ds).max()) > dst.nbytes:
            raise ValueError(f"a stream's output lies outside the destination buffer of {dst.nbytes} bytes")
        max_out = int(ds.max())
        if max_out > _MAX_CHUNK[self.algo]:
            raise ValueError(f"nvCOMP {self.algo} decodes chunks of at most {_MAX_CHUNK[self.algo]} bytes; "
                             f"this batch has one of {max_out}: rechunk the array smaller")
        with self._lock:
            try:
                checksum = None
                if crc32 is not None:
                    checksum = ("CRC-32", np.asarray(crc32, np.uint32).reshape(-1))
                elif adler32 is not None and _adler_works():
                    checksum = ("Adler-32", np.asarray(adler32, np.uint32).reshape(-1))
                if checksum is not None and len(checksum[1]) != n:
                    raise ValueError("crc32/adler32 must have one entry per stream")
                pending = self._queue(src, so, ss, dst, do, ds, n, max_out, stream, names, checksum, walked)
            except _cuda_errors() as exc:  # an earlier batch faulted the GPU: say so, not a raw CUDA error
                raise _gpu_fault(exc, self.algo, names, n) from exc
        if check:
            pending.check()
            return None
        return pending

    def _queue(self, src: Any, so: np.ndarray, ss: np.ndarray, dst: Any, do: np.ndarray, ds: np.ndarray, n: int,
               max_out: int, stream: Any, names: Sequence[str] | None,
               checksum: tuple[str, np.ndarray] | None, walked: bool) -> PendingBatch:
        """Queue one batch on ``stream`` (under the decoder's lock); the caller checks it."""
        self._on(stream)
        a_in, a_out, a_tmp = self.alignment
        src_base, dst_base = int(src.data.ptr), int(dst.data.ptr)
        keep: list = []
        if ((src_base + so) % a_in).any():
            # nvCOMP wants aligned inputs (e.g. deflate after a gzip header): gather them
            staged_so, staged_in = self._staging(ss, a_in, stream)
            copy_spans(src, so, staged_in, staged_so, ss, stream, keep, runtime=self.runtime)
            keep.append(staged_in)
            src_base, so = int(staged_in.data.ptr), staged_so
        out_do, staged_out, out_base = do, None, dst_base
        if ((dst_base + do) % a_out).any():  # decoded into aligned staging, then copied into place
            out_do, staged_out = self._staging(ds, a_out, stream)
            keep.append(staged_out)
            out_base = int(staged_out.data.ptr)
        temp = self.temp_bytes(n, max_out, int(ds.sum()))
        with stream:
            scratch = self._ensure("_scratch", temp + a_tmp) if temp else None
            # device table: [in_ptr | in_bytes | out_bytes | out_actual | out_ptr | status | frame code]
            # + [crc32] (n uint32 in an 8n area)
            meta = self._ensure("_meta", 8 * 8 * n)
        host = self._upload_table(meta, n, src_base + so, ss, ds, out_base + out_do, stream, walked)
        self._launch(int(meta.data.ptr), n, scratch, temp, stream, names)
        res, status = self._results(meta, n, max_out, stream, checksum)
        result = host[7 * n:7 * n + res.size]
        _d2h(result, int(res.data.ptr), stream)
        keep += [host, res, status]
        event = stream.record()
        if staged_out is not None:
            copy_spans(staged_out, out_do, dst, do, ds, stream, keep, runtime=self.runtime)
            event = stream.record()
        return PendingBatch(self.algo, event, result, ds, names, n, keep, checksum)

    def _staging(self, sizes: np.ndarray, align: int, stream: Any) -> tuple[np.ndarray, Any]:
        """A device buffer for spans of ``sizes`` bytes, each at an ``align``-ed offset:
        (the offsets, the buffer)."""
        padded = _round_up(sizes, align)
        offsets = np.concatenate([[0], np.cumsum(padded)[:-1]]).astype(np.int64)
        with stream:
            buf = self._cupy.empty(max(int(padded.sum()), 1), np.uint8)
        return offsets, buf

    def _upload_table(self, meta: Any, n: int, in_ptrs: np.ndarray, in_bytes: np.ndarray, out_bytes: np.ndarray,
                      out_ptrs: np.ndarray, stream: Any, walked: bool) -> np.ndarray:
        """Copy the batch's pointer/size table into ``meta`` (zstd, and LZ4 not ``walked`` on the
        host: then let the GPU check each frame or block, see ``zstd_sanitize`` and
        ``lz4_sanitize``); returns the pinned host buffer (7n table out, 4n results back)."""
        host = _pinned(11 * n)
        table = host[:7 * n].reshape(7, n)
        table[:] = 0
        table[0], table[1], table[2], table[4] = in_ptrs, in_bytes, out_bytes, out_ptrs
        _h2d(int(meta.data.ptr), host[:7 * n], stream)
        if self.algo in _SANITIZE and not (walked and self.algo == "lz4"):
            dummy = self._dummy(stream)
            with stream:
                _kernel(_SANITIZE[self.algo])(((n + 127) // 128,), (128,),
                                         (meta[:56 * n].view(np.int64), np.int64(n), np.int64(dummy.data.ptr),
                                          np.int64(dummy.nbytes), meta[48 * n:56 * n].view(np.int64)))
        return host

    def _launch(self, base: int, n: int, scratch: Any, temp: int, stream: Any, names: Sequence[str] | None) -> None:
        """The one nvCOMP call that decodes the batch whose table is at ``base``."""
        a_tmp = self.alignment[2]
        tptr = 0
        if scratch is not None:
            tptr = int(scratch.data.ptr)
            tptr += (-tptr) % a_tmp
        rc = self._run(base, base + 8 * n, base + 16 * n, base + 24 * n, n, tptr or None, temp,
                       base + 32 * n, self._opts, base + 40 * n, stream.ptr)
        self.calls += 1
        if rc != 0:
            raise CorruptChunkError(
                f"nvCOMP {self.algo} refused a batch of {n} chunks (status {rc}: {_STATUS.get(rc, 'unknown')})"
                + (f", chunks {names[0]} .. {names[n - 1]}" if names is not None else "")
                + ". Nothing was decoded.")

    def _results(self, meta: Any, n: int, max_out: int, stream: Any,
                 checksum: tuple[str, np.ndarray] | None) -> tuple[Any, Any]:
        """Queue the checksums (when asked) and gather on the device what the host checks:
        actual sizes, statuses, frame codes [, checksums] as one int64 array; returns it and
        the statuses."""
        base = int(meta.data.ptr)
        parts = [meta[24 * n:32 * n].view(np.int64), None, meta[48 * n:56 * n].view(np.int64)]
        if checksum is not None:
            if checksum[0] == "CRC-32":
                self._crc32(base + 32 * n, base + 16 * n, n, base + 56 * n, max_out, stream)
            else:
                with stream:
                    _kernel("adler32_batch")((min(n, 65535),), (256,), (np.uint64(base + 32 * n),
                                             np.uint64(base + 16 * n), np.int64(n), np.uint64(base + 56 * n)))
            with stream:
                parts.append(meta[56 * n:60 * n].view(np.uint32).astype(np.int64))
        with stream:
            # statuses are 4-byte enums at the start of their 8-byte-per-chunk area: widen them
            parts[1] = meta[40 * n:44 * n].view(np.int32).astype(np.int64)
            res = self._cupy.concatenate(parts)
        return res, parts[1]

    def _crc32(self, ptrs: int, sizes: int, n: int, out: int, max_bytes: int, stream: Any) -> None:
        """CRC-32 (gzip's polynomial) of n device buffers, written as uint32 at ``out``, queued on stream."""
        lib = self.nv.lib
        if not hasattr(lib, "nvcompBatchedCRC32Async"):
            raise GPUUnavailable(f"nvCOMP {self.nv.version_string} has no batched CRC32. Fix: {UPGRADE_HINT}")
        conf_fn = lib.nvcompBatchedCRC32GetHeuristicConf
        conf_fn.restype = ctypes.c_int
        conf_fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(_CRC32KernelConf), ctypes.c_size_t,
                            ctypes.c_void_p]
        opts = _CRC32Opts()
        opts.spec.poly, opts.spec.init, opts.spec.ref_in, opts.spec.ref_out, opts.spec.xorout = (
            0x04C11DB7, 0xFFFFFFFF, True, True, 0xFFFFFFFF)  # nvcompCRC32: the CRC-32 of gzip and zlib.crc32
        rc = conf_fn(None, n, ctypes.byref(opts.kernel_conf), max(int(max_bytes), 1), None)
        if rc != 0:
            raise GPUUnavailable(f"nvcompBatchedCRC32GetHeuristicConf failed (status {rc})")
        run = lib.nvcompBatchedCRC32Async
        run.restype = ctypes.c_int
        run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, _CRC32Opts,
                        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        rc = run(ptrs, sizes, n, out, opts, 0, None, stream.ptr)
        if rc != 0:
            raise GPUUnavailable(f"nvcompBatchedCRC32Async failed (status {rc}: {_STATUS.get(rc, 'unknown')})")

    def _dummy(self, stream: Any) -> Any:
        d = getattr(self, "_dummy_frame", None)
        if d is None:
            frame = _DUMMY[self.algo]
            buf = _pinned(2)
            raw = buf.view(np.uint8)[:len(frame)]
            raw[:] = np.frombuffer(frame, np.uint8)
            with stream:
                d = self._cupy.empty(len(frame), np.uint8)
            _h2d(int(d.data.ptr), raw, stream)
            stream.synchronize()
            self._dummy_frame = d
        return d


def _pinned(count: int) -> np.ndarray:
    """A pinned int64 host array (cupy's pinned pool: reused, not re-pinned each call)."""
    import cupy

    mem = cupy.cuda.alloc_pinned_memory(8 * max(count, 1))
    return np.frombuffer(mem, np.int64, max(count, 1))


def batched_decoder(algo: str, stream: Any, slot: int = 0, backend: str = "cuda", *,
                    runtime: Any) -> BatchedDecoder:
    """The runtime's decoder for (device, algo, slot, stream), created once and reused.

    Its scratch lives as long as ``runtime`` (released by ``Runtime.close()``).
    """
    import cupy

    device = int(cupy.cuda.Device().id)

    def make() -> BatchedDecoder:
        with cupy.cuda.Device(device):
            dec = BatchedDecoder(algo, backend=backend, device=device)
        dec.runtime = runtime  # the runtime that keeps it keeps its kernels too
        return dec
    key = ("nvcomp-decoder", device, algo, backend, int(slot), int(stream.ptr))
    return runtime.resource(key, make, close=BatchedDecoder.close, nbytes=lambda d: d.nbytes)
