"""The batched decode stage: the nvCOMP low-level binding (GPU) and its CPU twin.

CPU tests run everywhere (the twin, the loader's version checks); the ``gpu`` ones need
cupy, a CUDA device and the nvidia-libnvcomp wheel (H200 machine).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.errors import CorruptChunkError, GPUUnavailable

ALGOS = ("zstd", "lz4", "deflate")


def _raw(n: int, size: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        x = np.arange(size // 2, dtype=np.int64)
        v = (1000 + 500 * np.sin(x / (30.0 + k)) + rng.normal(0, 5, len(x))).astype("<u2")
        out.append(v.tobytes()[:size] + bytes(size - 2 * len(x)))
    return out


def _encode(algo: str, raw: bytes) -> bytes:
    if algo == "zstd":
        from numcodecs import Zstd
        return bytes(Zstd(level=3).encode(raw))
    if algo == "lz4":
        from numcodecs import LZ4
        return bytes(LZ4().encode(raw))[4:]
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(raw) + c.flush()


def _pack(enc: list[bytes], align: int = 8, skew: int = 0):
    sizes = np.array([len(e) for e in enc], np.int64)
    padded = -(-(sizes + skew) // align) * align
    offs = (np.concatenate([[0], np.cumsum(padded)[:-1]]) + skew).astype(np.int64)
    host = np.zeros(int(padded.sum()) + skew + 8, np.uint8)
    for e, o in zip(enc, offs):
        host[o:o + len(e)] = np.frombuffer(e, np.uint8)
    return host, offs, sizes


def _batch(algo: str, sizes=(65536, 65536, 4000, 131072, 7), skew: int = 0):
    raws = [r[:s] for r, s in zip(_raw(len(sizes), max(sizes)), sizes)]
    enc = [_encode(algo, r) for r in raws]
    host, offs, csz = _pack(enc, skew=skew)
    dsz = np.array([len(r) for r in raws], np.int64)
    doff = np.concatenate([[0], np.cumsum(dsz)[:-1]]).astype(np.int64)
    return raws, host, offs, csz, doff, dsz


def _corrupt_batch(algo: str, kind: str):
    """A batch whose chunk c/3 is damaged as ``kind`` says; with the chunk names."""
    raws, host, offs, csz, doff, dsz = _batch(algo)
    names = [f"c/{k}" for k in range(len(raws))]
    csz, dsz = csz.copy(), dsz.copy()
    if kind == "truncated":
        csz[3] //= 2
    elif kind == "garbage":
        host[offs[3]:offs[3] + csz[3]] = np.random.default_rng(1).integers(0, 256, int(csz[3]), dtype=np.uint8)
    elif kind == "header":
        host[offs[3]:offs[3] + 4] ^= 0xFF
    elif kind == "size_bigger":
        dsz[3] += 100
    else:
        dsz[3] -= 100
    doff = np.concatenate([[0], np.cumsum(dsz)[:-1]]).astype(np.int64)
    return raws, host, offs, csz, doff, dsz, names


# ---------------------------------------------------------------- CPU twin (CI)
@pytest.mark.parametrize("algo", ALGOS)
def test_cpu_twin_exact(algo):
    from gpu_zarr.engine.decode import decode_batch_cpu

    raws, host, offs, csz, doff, dsz = _batch(algo)
    out = np.zeros(int(dsz.sum()), np.uint8)
    decode_batch_cpu(algo, host, offs, csz, out, doff, dsz, [f"c/{k}" for k in range(len(raws))])
    assert out.tobytes() == b"".join(raws)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("kind", ["truncated", "garbage", "size_bigger", "size_smaller"])
def test_cpu_twin_corrupt_names_chunk(algo, kind):
    from gpu_zarr.engine.decode import decode_batch_cpu

    raws, host, offs, csz, doff, dsz, names = _corrupt_batch(algo, kind)
    out = np.zeros(int(dsz.sum()), np.uint8)
    with pytest.raises(CorruptChunkError, match="c/3"):
        decode_batch_cpu(algo, host, offs, csz, out, doff, dsz, names)


def test_decode_zstd_names_still_work():
    from gpu_zarr.engine.decode import decode_zstd_cpu

    raws, host, offs, csz, _, _ = _batch("zstd", sizes=(5000, 5000, 5000))
    out = np.zeros(15000, np.uint8)
    decode_zstd_cpu(host, offs, csz, out, np.arange(3) * 5000, 5000, ["a", "b", "c"])
    assert out.tobytes() == b"".join(raws)


def test_too_old_nvcomp_is_refused_with_the_fix():
    from gpu_zarr.engine.nvcomp_batch import NvcompLibrary, _check

    for version in ((5, 2, 0), (4, 1, 1), (7, 0, 0)):
        with pytest.raises(GPUUnavailable, match=r'pip install -U "nvidia-libnvcomp-cu13>=6'):
            _check(NvcompLibrary("/x/libnvcomp.so", version, 12080, object()))


def test_missing_entry_points_are_refused():
    from gpu_zarr.engine.nvcomp_batch import NvcompLibrary, _check

    class Lib:
        nvcompBatchedZstdDecompressAsync = nvcompBatchedZstdDecompressGetTempSize = None

    with pytest.raises(GPUUnavailable, match="lacks the entry points .*LZ4.*pip install -U"):
        _check(NvcompLibrary("/x/libnvcomp.so", (6, 0, 0), 13000, Lib()))


def test_missing_library_names_the_fix(monkeypatch):
    from gpu_zarr.engine import nvcomp_batch

    monkeypatch.setattr(nvcomp_batch, "_candidates", lambda: ["/nonexistent/libnvcomp.so.6"])
    with pytest.raises(GPUUnavailable, match="pip install -U"):
        nvcomp_batch.load_library(refresh=True)


def test_not_a_nvcomp_library_is_refused(tmp_path):
    import ctypes.util

    from gpu_zarr.engine.nvcomp_batch import _open

    libc = ctypes.util.find_library("c")
    if libc is None:
        pytest.skip("no libc found by ctypes")
    with pytest.raises(GPUUnavailable, match="nvcompGetProperties"):
        _open(libc)


# ---------------------------------------------------------------- GPU (nvCOMP)
def _gpu_decode(algo, host, offs, csz, doff, dsz, names=None, **kw):
    import cupy

    from gpu_zarr.engine.decode import decode_batch_gpu

    stream = cupy.cuda.Stream(non_blocking=True)
    src = cupy.asarray(host)
    dst = cupy.zeros(int(dsz.sum()) + 8, np.uint8)
    stream.synchronize()
    cupy.cuda.get_current_stream().synchronize()
    decode_batch_gpu(algo, src, offs, csz, dst, doff, dsz, stream, names, runtime=get_runtime(), **kw)
    stream.synchronize()
    return dst.get()[:int(dsz.sum())]


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("skew", [0, 1, 2])
def test_gpu_exact(algo, skew):
    raws, host, offs, csz, doff, dsz = _batch(algo, skew=skew)
    got = _gpu_decode(algo, host, offs, csz, doff, dsz)
    assert got.tobytes() == b"".join(raws)


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ALGOS)
def test_gpu_exact_misaligned_output(algo):
    raws, host, offs, csz, _, dsz = _batch(algo)
    doff = np.concatenate([[0], np.cumsum(dsz)[:-1]]).astype(np.int64) + 3
    out = _gpu_decode(algo, host, offs, csz, doff, dsz + 0)
    # _gpu_decode slices from 0: rebuild the expected layout with the 3-byte skew
    want = bytes(3) + b"".join(raws)
    assert out.tobytes() == want[:len(out)]


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("kind", ["truncated", "garbage", "size_bigger", "size_smaller", "header"])
def test_gpu_corrupt_names_chunk(algo, kind):
    raws, host, offs, csz, doff, dsz, names = _corrupt_batch(algo, kind)
    with pytest.raises(CorruptChunkError, match="c/3"):
        _gpu_decode(algo, host, offs, csz, doff, dsz, names)
    # the device is still usable afterwards
    raws, host, offs, csz, doff, dsz = _batch(algo)
    assert _gpu_decode(algo, host, offs, csz, doff, dsz).tobytes() == b"".join(raws)


@pytest.mark.gpu
def test_gpu_scratch_reused_between_calls():
    import cupy

    from gpu_zarr.engine.nvcomp_batch import batched_decoder

    stream = cupy.cuda.Stream(non_blocking=True)
    raws, host, offs, csz, doff, dsz = _batch("zstd")
    dec = batched_decoder("zstd", stream, slot=7, runtime=get_runtime())
    assert batched_decoder("zstd", stream, slot=7, runtime=get_runtime()) is dec
    src, dst = cupy.asarray(host), cupy.zeros(int(dsz.sum()), np.uint8)
    cupy.cuda.get_current_stream().synchronize()
    for _ in range(3):
        dec.decode(src, offs, csz, dst, doff, dsz, stream)
    assert dec.scratch_allocations == 1 and dec.calls == 3
    assert dst.get().tobytes() == b"".join(raws)
    dec.decode(src, offs[:2], csz[:2], dst, doff[:2], dsz[:2], stream)  # smaller batch: same scratch
    assert dec.scratch_allocations == 1


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ALGOS)
def test_gpu_several_streams_at_once(algo):
    import cupy

    from gpu_zarr.engine.nvcomp_batch import BatchedDecoder

    raws, host, offs, csz, doff, dsz = _batch(algo, sizes=(65536,) * 16)
    src = cupy.asarray(host)
    dst = cupy.zeros(int(dsz.sum()), np.uint8)
    cupy.cuda.get_current_stream().synchronize()
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(4)]
    decs = [BatchedDecoder(algo) for _ in range(4)]
    pend = [d.decode(src, offs[i::4], csz[i::4], dst, doff[i::4], dsz[i::4], s, check=False)
            for i, (d, s) in enumerate(zip(decs, streams))]
    for p in pend:
        p.check()
    assert dst.get().tobytes() == b"".join(raws)


@pytest.mark.gpu
def test_gpu_capabilities_report_nvcomp():
    from gpu_zarr.capabilities import probe

    caps = probe(refresh=True)
    assert caps.nvcomp_lowlevel, caps.notes
    assert caps.nvcomp_version and caps.nvcomp_version.startswith("6.")
    assert "nvCOMP" in caps.report()


@pytest.mark.gpu
@pytest.mark.parametrize("skew", [0, 3])
def test_gpu_crc32_after_decode(skew):
    raws, host, offs, csz, doff, dsz = _batch("deflate")
    doff = doff + skew
    crc = np.array([zlib.crc32(r) for r in raws], np.uint32)
    names = [f"c/{k}" for k in range(len(raws))]
    got = _gpu_decode("deflate", host, offs, csz, doff, dsz + 0, names, crc32=crc)
    assert got[skew:].tobytes() == b"".join(raws)[:len(got) - skew]
    crc[2] ^= 1
    with pytest.raises(CorruptChunkError, match="c/2: .*CRC-32"):
        _gpu_decode("deflate", host, offs, csz, doff, dsz + 0, names, crc32=crc)


def test_gpu_fault_message_says_what_to_do():
    from gpu_zarr.engine.nvcomp_batch import _gpu_fault

    err = _gpu_fault(RuntimeError("cudaErrorIllegalAddress"), "zstd", ["c/0/1", "c/0/2", "c/0/3"], 3)
    assert isinstance(err, CorruptChunkError)
    msg = str(err)
    assert "c/0/1 .. c/0/3" in msg and "restart Python" in msg and "prefer='cpu'" in msg
