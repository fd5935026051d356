"""The Blosc matrix and Blosc stores through the GPU path (nvCOMP + the unshuffle kernel)."""

from __future__ import annotations

import numpy as np
import pytest

from blosc_cases import (
    BLOSC_LAYOUTS,
    CNAMES,
    SHUFFLES,
    decode_chunks,
    encode,
    payload,
    reorder_blocks,
    write_blosc,
)
from gpu_zarr.engine.runtime import get_runtime
from gpu_zarr.errors import CorruptChunkError
from test_blosc import CORRUPT, _check_matrix, _good

pytestmark = pytest.mark.gpu


def gpu_ops():
    from gpu_zarr.engine.ops import ops_for

    return ops_for("gpu", 3, 1, get_runtime())


@pytest.mark.parametrize("shuffle", list(SHUFFLES), ids=list(SHUFFLES))
@pytest.mark.parametrize("cname", CNAMES)
def test_matrix_gpu(cname, shuffle):
    _check_matrix(gpu_ops(), cname, SHUFFLES[shuffle])


def test_blocks_out_of_order_gpu():
    ts, nbytes = 8, 40000
    buf = payload(nbytes, ts, "smooth")
    chunk = encode(buf, "lz4", 5, 1, ts, 1000)
    nblocks = -(-nbytes // int(np.frombuffer(chunk[8:12], "<i4")[0]))
    moved = reorder_blocks(chunk, list(range(nblocks))[::-1])
    out, _ = decode_chunks(gpu_ops(), [moved, chunk], nbytes)
    assert np.array_equal(out[0], buf) and np.array_equal(out[1], buf)


def test_many_chunks_one_batch_gpu():
    """Hundreds of chunks of mixed inner codecs in one batch: one call per codec, one kernel."""
    ts, nbytes = 2, 2 * 65536
    bufs, chunks = [], []
    for k in range(300):
        cname = ["lz4", "zstd", "zlib", "lz4hc"][k % 4]
        buf = payload(nbytes, ts, "smooth" if k % 5 else "random", seed=k)
        bufs.append(buf)
        chunks.append(encode(buf, cname, 1 + k % 9, [0, 1, 2][k % 3], ts))
    out, _ = decode_chunks(gpu_ops(), chunks, nbytes)
    for k, (b, o) in enumerate(zip(bufs, out)):
        assert np.array_equal(b, o), k


@pytest.mark.parametrize("kw", [k for _, k in BLOSC_LAYOUTS], ids=[i for i, _ in BLOSC_LAYOUTS])
def test_engine_reads_blosc_gpu(tmp_path, kw):
    from gpu_zarr.engine import read

    arr, _ = write_blosc(tmp_path / "a.zarr", **kw)
    want = arr[...]
    got = read(arr, device="gpu").data.get()
    assert np.array_equal(got, want)
    sel = (slice(3, 30, 2), slice(None, None, -3), slice(1, 20))
    assert np.array_equal(read(arr, sel, device="gpu").data.get(), want[sel])


@pytest.mark.parametrize("what", list(CORRUPT))
def test_corrupt_chunk_gpu(what):
    chunk, nbytes = _good()
    good2, _ = _good()
    with pytest.raises(CorruptChunkError, match=r"chunk 0\.1\.2"):
        decode_chunks(gpu_ops(), [good2, CORRUPT[what](chunk)], nbytes, names=["0.0.0", "0.1.2"])


_PAYLOAD = """
import sys
sys.path.insert(0, {tests!r})
import numcodecs, numpy as np
from blosc_cases import decode_chunks
from test_blosc import _good
from test_blosc_gpu import gpu_ops
from gpu_zarr.errors import CorruptChunkError
chunk, nbytes = _good(cname={cname!r}, shuffle=0)
s0 = int(np.frombuffer(chunk[16:20], "<i4")[0]) + 4
b = bytearray(chunk)
for k in range(s0 + 8, min(len(b), s0 + 40)):
    b[k] ^= 0x5A
try:
    out, _ = decode_chunks(gpu_ops(), [bytes(b)] * 3, nbytes, names=["a", "b", "c"])
except CorruptChunkError as exc:
    assert any(n in str(exc) for n in "abc"), exc
    print("corrupt:", exc)
else:
    assert len(out[0]) == nbytes
    print("decoded without an error (no checksum in this format)")
good, _ = _good(cname={cname!r})
out, _ = decode_chunks(gpu_ops(), [good], nbytes)
assert np.array_equal(out[0], np.frombuffer(numcodecs.Blosc().decode(good), np.uint8))
print("OK")
"""


@pytest.mark.parametrize("cname", ["zstd", "zlib", "lz4"])
def test_corrupt_payload_gpu_never_crashes(cname):
    """Corrupt stream contents (past every host check): a CorruptChunkError or bytes, never a crash,
    and the device stays usable. In a subprocess: a crash would poison this process's CUDA context."""
    import subprocess
    import sys
    from pathlib import Path

    code = _PAYLOAD.format(tests=str(Path(__file__).parent), cname=cname)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "OK" in out.stdout, (out.stdout + out.stderr)[-3000:]
