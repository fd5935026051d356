"""Every codec chain zarr reads, served by the engine: the CPU twin against zarr-python's read.

The same stores run on the GPU in ``test_gpu.py`` (``test_chains_gpu``).
"""

from __future__ import annotations

import numpy as np
import pytest

from chains import CHAINS, ELEMENT_CHAINS, HOST_FILTER_CHAINS
from gpu_zarr.engine import EngineOptions, read
from gpu_zarr.engine.metadata import describe, layout_of
from gpu_zarr.errors import CorruptChunkError
from stores import SELECTIONS


@pytest.mark.parametrize("name,make", CHAINS, ids=[n for n, _ in CHAINS])
@pytest.mark.parametrize("sel", [Ellipsis, SELECTIONS[2], SELECTIONS[4], SELECTIONS[5]], ids=range(4))
def test_chain_matches_zarr(tmp_path, name, make, sel):
    arr, _ = make(tmp_path / "a.zarr")
    want = arr[...][sel]
    got = read(arr, sel, device="cpu").data
    assert got.dtype == want.dtype.newbyteorder("=")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name,make", CHAINS, ids=[n for n, _ in CHAINS])
def test_chain_batches_and_threads(tmp_path, name, make):
    """Batches of one chunk and several slots: the batch pipeline with the chain's steps."""
    arr, _ = make(tmp_path / "a.zarr")
    res = read(arr, Ellipsis, device="cpu", options=EngineOptions(batch_bytes=1, slots=2, threads=3))
    np.testing.assert_array_equal(res.data, arr[...])


def test_description_names_the_steps(tmp_path):
    lay = layout_of(dict(CHAINS)["v3-shard-zstd-crc32c"](tmp_path / "a.zarr")[0])
    assert lay.codec == "zstd" and [f.name for f in lay.frames] == ["crc32c"] and lay.host is None
    assert describe(lay) == "zarr v3, sharded: crc32c checked on the host, zstd"
    lay = layout_of(dict(CHAINS)["v2-delta-zstd"](tmp_path / "b.zarr")[0])
    assert lay.codec == "zstd" and lay.host is None and [s.name for s in lay.elements] == ["delta"]
    assert describe(lay) == "zarr v2: zstd, delta"
    assert describe(lay, "on the GPU") == "zarr v2: zstd on the GPU, delta on the GPU"
    lay = layout_of(dict(CHAINS)["v3-numcodecs-zstd"](tmp_path / "c.zarr")[0])
    assert lay.codec == "zstd" and lay.host is None  # zstd frames under numcodecs' name: the core stage
    lay = layout_of(dict(CHAINS)["v3-numcodecs-lz4"](tmp_path / "d.zarr")[0])
    assert lay.codec == "lz4" and lay.host is None and describe(lay) == "lz4 zarr v3"
    lay = layout_of(dict(CHAINS)["v2-bz2-bigendian"](tmp_path / "e.zarr")[0])
    assert lay.codec == "host" and "bz2 by the codecs' own decode" in describe(lay)


def _flip_last_byte_of_a_chunk(root):
    files = sorted(p for p in root.rglob("c/*") if p.is_file()) or sorted(
        p for p in root.rglob("*") if p.is_file() and not p.name.startswith((".", "zarr.json")))
    f = files[0]
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0xFF
    f.write_bytes(bytes(b))
    return f


@pytest.mark.parametrize("name", ["v3-zstd-crc32c", "v3-raw-crc32c", "v3-shard-zstd-crc32c"])
def test_checksum_mismatch_names_the_chunk(tmp_path, name):
    arr, _ = dict(CHAINS)[name](tmp_path / "a.zarr")
    _flip_last_byte_of_a_chunk(tmp_path / "a.zarr")
    with pytest.raises(CorruptChunkError, match="crc32c checksum") as err:
        read(arr, Ellipsis, device="cpu")
    assert "chunk" in str(err.value)


def test_host_decode_failure_names_the_chunk(tmp_path):
    arr, _ = dict(CHAINS)["v2-bz2-bigendian"](tmp_path / "a.zarr")
    f = sorted(p for p in (tmp_path / "a.zarr").iterdir() if p.name[0].isdigit())[0]
    f.write_bytes(f.read_bytes()[:10])
    with pytest.raises(CorruptChunkError, match=f"chunk .*{f.name}.* could not be decoded by its codecs"):
        read(arr, Ellipsis, device="cpu")


@pytest.mark.parametrize("cut", ["header", "block", "size"])
def test_damaged_lz4_chunk_names_the_chunk(tmp_path, cut):
    """numcodecs' LZ4 chunks: a chunk cut inside its size header, one whose block is cut short,
    and one whose header states another size are each named, on every CPU path."""
    arr, _ = dict(CHAINS)["v2-lz4"](tmp_path / "a.zarr")
    f = sorted(p for p in (tmp_path / "a.zarr").iterdir() if p.name[0].isdigit())[0]
    raw = f.read_bytes()
    f.write_bytes({"header": raw[:3], "block": raw[:len(raw) // 2],
                   "size": (int.from_bytes(raw[:4], "little") + 2).to_bytes(4, "little") + raw[4:]}[cut])
    for opts in (None, EngineOptions(batch_bytes=1, slots=2, threads=3)):
        with pytest.raises(CorruptChunkError, match=f"chunk {f.name}"):
            read(arr, Ellipsis, device="cpu", options=opts)


def test_chains_through_the_public_api(tmp_path):
    """``auto`` serves an off-list chain with the engine and says which steps ran where."""
    import gpu_zarr

    arr, _ = dict(CHAINS)["v3-shard-zstd-crc32c"](tmp_path / "a.zarr")
    res = gpu_zarr.read_zarr(str(tmp_path / "a.zarr"), prefer="cpu", progress=False)
    np.testing.assert_array_equal(np.asarray(res.data), arr[...])


@pytest.mark.parametrize("name", ELEMENT_CHAINS + HOST_FILTER_CHAINS)
def test_filters_run_as_element_steps_where_exact(tmp_path, name):
    """Filters with an exact step on numpy and cupy run after the core codec (which then decodes
    the stored dtype); the others -- byte shuffles, Delta into another dtype, casts from floats
    to integers, other byte orders, F order -- stay with the codecs' own decode."""
    lay = layout_of(dict(CHAINS)[name](tmp_path / "a.zarr")[0])
    if name in ELEMENT_CHAINS:
        assert lay.elements and lay.host is None and lay.codec != "host"
        assert lay.stored_nbytes == int(np.prod(lay.inner_shape)) * lay.elements[0].stored.itemsize
    else:
        assert not lay.elements and lay.codec == "host"


@pytest.mark.parametrize("name", ["v2-delta-i8-raw", "v2-astype-u2-i4-raw"])
def test_uncompressed_chunk_of_the_stored_dtype_is_checked_for_its_size(tmp_path, name):
    """An uncompressed chunk before element steps holds the stored dtype's bytes: a chunk of the
    decoded dtype's size is named as the wrong size."""
    arr, _ = dict(CHAINS)[name](tmp_path / "a.zarr")
    lay = layout_of(arr)
    assert lay.stored_nbytes != lay.inner_nbytes or name == "v2-delta-i8-raw"
    f = sorted(p for p in (tmp_path / "a.zarr").iterdir() if p.name[0].isdigit())[0]
    f.write_bytes(f.read_bytes() + b"\0" * 8)
    with pytest.raises(CorruptChunkError, match=f"chunk {f.name} .*{lay.stored_nbytes} bytes \\(an uncompressed"):
        read(arr, Ellipsis, device="cpu")
