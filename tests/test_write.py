"""The writer's CPU twin: every format and codec read back by zarr-python, metadata equal to
zarr-python's own, shard indexes with their crc32c, sizes against numcodecs, safety."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import zarr

from gpu_zarr import settings
from gpu_zarr.errors import DestinationExists, UsageError, WriteError
from gpu_zarr.write.api import write_zarr
from gpu_zarr.write.codecs import codec_spec
from gpu_zarr.write.output import Destination
from gpu_zarr.write.shard import MISSING, crc32c
from staging import Staging, staged, staged_encoder

CODECS = ["zstd", "blosc-lz4", "blosc-zstd", "gzip", None]
FORMATS = [(3, None), (3, False), (2, None)]  # v3 sharded (automatic shards), v3 plain, v2
SHAPE, CHUNKS = (37, 150, 203), (8, 32, 64)  # every axis ends in a partial chunk


def _data(dtype: str = "uint16") -> np.ndarray:
    rng = np.random.default_rng(1)
    base = np.cumsum(rng.integers(-3, 4, SHAPE), axis=2) % 4000  # smooth-ish: compresses like images
    return (base + rng.integers(0, 8, SHAPE)).astype(dtype)


def _zarr_copy(a: np.ndarray, path, plan_shards, fmt: int, codec: str | None, level: int | None = None):
    """The same array written by zarr-python (the reference)."""
    spec = codec_spec(codec, level, a.dtype.itemsize)
    kw = {"compressors": spec.v3_compressors() if fmt == 3 else spec.v2_compressor()}
    if fmt == 3:
        kw["shards"] = plan_shards
    else:
        kw["chunk_key_encoding"] = {"name": "v2", "separator": "."}
    z = zarr.create_array(str(path), shape=a.shape, dtype=a.dtype, chunks=CHUNKS, fill_value=0, zarr_format=fmt,
                          **kw)
    z[...] = a
    return z


def _stored(path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and f.name not in
               ("zarr.json", ".zarray", ".zattrs", ".zgroup"))


@pytest.mark.parametrize("fmt,shards", FORMATS, ids=["v3-sharded", "v3", "v2"])
@pytest.mark.parametrize("codec", CODECS, ids=[str(c) for c in CODECS])
def test_zarr_reads_what_we_write_and_metadata_is_zarrs(tmp_path, fmt, shards, codec):
    a = _data()
    res = write_zarr(a, tmp_path / "ours", chunks=CHUNKS, shards=shards, codec=codec, zarr_format=fmt,
                     encoder="cpu")
    assert res.encoder == "cpu" and res.nbytes == a.nbytes and res.stored_bytes == _stored(tmp_path / "ours")
    z = zarr.open_array(tmp_path / "ours", mode="r")
    np.testing.assert_array_equal(z[...], a)
    ref = _zarr_copy(a, tmp_path / "ref", z.shards, fmt, codec)
    doc = "zarr.json" if fmt == 3 else ".zarray"
    assert json.loads((tmp_path / "ours" / doc).read_text()) == json.loads((tmp_path / "ref" / doc).read_text())
    assert ref.metadata == z.metadata
    if codec is not None:  # same codec, same level: the stored size is numcodecs' within 2 %
        assert abs(_stored(tmp_path / "ours") - _stored(tmp_path / "ref")) <= 0.02 * _stored(tmp_path / "ref")


def test_shard_index_is_zarrs_layout_with_crc32c(tmp_path):
    a = _data()
    write_zarr(a, tmp_path / "s", chunks=CHUNKS, shards=(16, 64, 128), encoder="cpu")
    # the last shard along every axis: inner chunks wholly outside the array are missing
    shard = (tmp_path / "s" / "c" / "2" / "2" / "1").read_bytes()
    n = 2 * 2 * 2
    raw, crc = shard[-4 - 16 * n:-4], shard[-4:]
    assert int.from_bytes(crc, "little") == crc32c(raw)
    table = np.frombuffer(raw, "<u8").reshape(2, 2, 2, 2)
    # z: 37 = 2*16 + 5 -> inner z chunk 1 (8..16 of the shard = 40..48) is outside; y: 150 - 128 = 22 < 32
    assert (table[1] == MISSING).all() and (table[:, 1] == MISSING).all()
    off, size = table[0, 0, 0]
    assert off == 0 and size > 0 and table[0, 0, 1, 0] == size  # chunks back to back in C order
    with open(tmp_path / "s" / "c" / "0" / "0" / "0", "r+b") as f:  # a corrupted index is caught by zarr
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(Exception):  # noqa: B017 - zarr's own checksum error type varies by version
        zarr.open_array(tmp_path / "s", mode="r")[0:8, 0:32, 0:64]


@pytest.mark.parametrize("dtype", ["uint8", "int32", "float32", ">u2", "bool"])
def test_dtypes(tmp_path, dtype):
    a = _data("int32").astype(dtype) if dtype != "bool" else _data() > 2000
    write_zarr(a, tmp_path / "d", chunks=CHUNKS, codec="blosc-lz4", encoder="cpu")
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "d", mode="r")[...], a)


def test_dask_blocks_written_in_bounded_batches(tmp_path):
    da = pytest.importorskip("dask.array")
    a = _data()
    d = da.from_array(a, chunks=(5, 70, 90))
    calls = []
    with settings.set(batch_bytes=1 << 20, lanes=2):  # 1 MiB batches: many batches, two in flight
        from gpu_zarr.write import source

        src = source.as_source(d)
        real = src._read
        src._read = lambda regions: calls.append(len(regions)) or real(regions)
        res = write_zarr(src, tmp_path / "k", chunks=CHUNKS, shards=(8, 64, 128), encoder="cpu")
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "k", mode="r")[...], a)
    shard_bytes = 8 * 64 * 128 * 2
    assert len(calls) > 1 and max(calls) * shard_bytes <= 1 << 20
    assert res.nbytes == a.nbytes


def test_never_overwrites_without_overwrite(tmp_path):
    a = _data()
    write_zarr(a, tmp_path / "x", chunks=CHUNKS, encoder="cpu")
    with pytest.raises(DestinationExists, match="overwrite=True"):
        write_zarr(a[:1], tmp_path / "x", chunks=CHUNKS, encoder="cpu")
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "x", mode="r")[...], a)
    write_zarr(a[:1], tmp_path / "x", chunks=CHUNKS, overwrite=True, encoder="cpu")
    assert zarr.open_array(tmp_path / "x", mode="r").shape == (1, *SHAPE[1:])
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(WriteError, match="not a zarr"):
        write_zarr(a, tmp_path / "mine", chunks=CHUNKS, overwrite=True, encoder="cpu")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "x"]  # no temporary folder left


def test_interrupted_write_leaves_nothing_that_looks_complete(tmp_path):
    a = _data()
    from gpu_zarr.write.source import as_source

    src = as_source(a)
    real, seen = src._read, []

    def failing(regions):
        seen.append(1)
        if len(seen) == 3:
            raise KeyboardInterrupt
        return real(regions)

    src._read = failing
    with settings.set(batch_bytes=1 << 20, lanes=1), pytest.raises(KeyboardInterrupt):
        write_zarr(src, tmp_path / "i", chunks=CHUNKS, shards=(8, 64, 128), encoder="cpu")
    assert list(tmp_path.iterdir()) == []


def test_free_space_is_checked(tmp_path, monkeypatch):
    monkeypatch.setattr(Destination, "free_bytes", lambda self: 1000)
    with settings.set(batch_bytes=1 << 20, lanes=1), pytest.raises(WriteError, match="not enough free space"):
        write_zarr(_data(), tmp_path / "f", chunks=CHUNKS, shards=(8, 64, 128), encoder="cpu")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder_is_a_clear_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(WriteError, match="permission denied"):
            write_zarr(_data(), ro / "x", chunks=CHUNKS, encoder="cpu")
    finally:
        ro.chmod(0o755)


def test_bad_arguments_are_usage_errors(tmp_path):
    a = _data()
    for kw, match in [({"codec": "lzma"}, "codec 'lzma'"), ({"codec": "zstd", "level": 40}, "out of range"),
                      ({"shards": (8, 33, 64)}, "not a multiple"), ({"zarr_format": 2, "shards": (8, 64, 64)},
                                                                      "v2 has no sharding"),
                      ({"chunks": (8, 32)}, "3 positive integers")]:
        kw.setdefault("chunks", CHUNKS)
        with pytest.raises(UsageError, match=match):
            write_zarr(a, tmp_path / "b", encoder="cpu", **kw)
    with pytest.raises(UsageError, match="expected a numpy array"):
        write_zarr([[1, 2]], tmp_path / "b", chunks=1)
    with pytest.raises(UsageError, match="local"):
        write_zarr(a, "ftp://bucket/x.zarr", chunks=CHUNKS)
    with pytest.raises(UsageError, match="local path"):
        write_zarr(a, tmp_path / "b", chunks=CHUNKS, storage_options={"anon": True})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fill", [-1, 256, np.nan, 1 + 2j, "x"])
@pytest.mark.parametrize("fmt,shards", FORMATS, ids=["v3-sharded", "v3", "v2"])
def test_a_fill_value_the_dtype_cannot_hold_is_refused_before_writing(tmp_path, fmt, shards, fill):
    """zarr-python refuses these fill values for uint8: so do we, with a UsageError that names
    the fill value and the dtype, before a chunk is written (no OverflowError from numpy)."""
    a = np.arange(30, dtype="uint8").reshape(5, 6)
    with pytest.raises(UsageError, match=r"fill_value=.* dtype uint8"):
        write_zarr(a, tmp_path / "f", chunks=4, shards=shards, zarr_format=fmt, fill_value=fill, encoder="cpu")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt,shards", FORMATS, ids=["v3-sharded", "v3", "v2"])
def test_fill_value_none_is_zarrs_default(tmp_path, fmt, shards):
    """fill_value=None (zarr-python's "the dtype's default") writes edge chunks and reads back."""
    a = np.arange(30, dtype="uint8").reshape(5, 6)
    write_zarr(a, tmp_path / "n", chunks=4, shards=shards, zarr_format=fmt, fill_value=None, encoder="cpu")
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "n"), mode="r")[...], a)


@pytest.mark.parametrize("fmt,shards", FORMATS, ids=["v3-sharded", "v3", "v2"])
@pytest.mark.parametrize("codec", CODECS, ids=[str(c) for c in CODECS])
def test_tensorstore_and_our_reader_read_what_we_write(tmp_path, fmt, shards, codec):
    from gpu_zarr import read_zarr

    a = _data()
    write_zarr(a, tmp_path / "o", chunks=CHUNKS, shards=shards, codec=codec, zarr_format=fmt, encoder="cpu")
    np.testing.assert_array_equal(np.asarray(read_zarr(str(tmp_path / "o"), prefer="cpu", progress=None).data), a)
    ts = pytest.importorskip("tensorstore")
    t = ts.open({"driver": "zarr3" if fmt == 3 else "zarr", "kvstore": {"driver": "file", "path": str(tmp_path / "o")}},
                read=True).result()
    np.testing.assert_array_equal(t.read().result(), a)


@pytest.mark.parametrize("err,match", [(28, "file system is full"), (30, "read-only")])
@pytest.mark.parametrize("path", ["python", "native"])
def test_full_or_read_only_file_system_mid_write(tmp_path, monkeypatch, err, match, path):
    """ENOSPC / EROFS from the kernel while chunks are written (a real full or read-only mount
    cannot be made in a test as an ordinary user): a clear WriteError naming the file, nothing
    left behind, from the pure-Python path and from the native one alike."""
    import gpu_zarr.write.output as output
    from gpu_zarr.engine import native

    calls = []
    if path == "python":
        real = os.writev
        monkeypatch.setattr(native, "available", lambda: False)

        def writev(fd, views):
            calls.append(1)
            if len(calls) > 2:
                raise OSError(err, os.strerror(err))
            return real(fd, views)

        monkeypatch.setattr(output.os, "writev", writev)
    else:
        if not native.available():
            pytest.skip(f"native library: {native.status().reason}")
        real_files = native.write_files

        def write_files(paths, pieces, threads):
            calls.append(1)
            st, det = real_files(paths, pieces, threads)
            if len(calls) > 1:
                st[-1], det[-1] = native.IO, err
            return st, det

        monkeypatch.setattr(native, "write_files", write_files)
    with settings.set(batch_bytes=1 << 20, lanes=1), pytest.raises(WriteError, match=match) as info:
        write_zarr(_data(), tmp_path / "w", chunks=CHUNKS, shards=(8, 64, 128), encoder="cpu")
    assert "cannot write " in str(info.value) and "/c/" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def _tree(path) -> dict[str, bytes]:
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("fmt,shards", [(3, (16, 64, 128)), (3, False), (2, None)], ids=["v3-sharded", "v3", "v2"])
def test_native_and_python_file_output_write_the_same_bytes(tmp_path, monkeypatch, fmt, shards):
    from gpu_zarr.engine import native

    if not native.available():
        pytest.skip(f"native library: {native.status().reason}")
    a = _data()
    with settings.set(batch_bytes=1 << 20):
        write_zarr(a, tmp_path / "native", chunks=CHUNKS, shards=shards, zarr_format=fmt, encoder="cpu")
        monkeypatch.setattr(native, "available", lambda: False)
        write_zarr(a, tmp_path / "python", chunks=CHUNKS, shards=shards, zarr_format=fmt, encoder="cpu")
    native_tree, python_tree = _tree(tmp_path / "native"), _tree(tmp_path / "python")
    assert len(native_tree) > 10 and native_tree == python_tree


_EFBIG_SCRIPT = """
import resource, signal, sys
import numpy as np
from gpu_zarr import write_zarr
from gpu_zarr.errors import WriteError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.RLIM_INFINITY))
a = np.random.default_rng(0).integers(0, 60000, (16, 256, 256)).astype("uint16")
try:
    write_zarr(a, sys.argv[1], chunks=(8, 128, 128), shards=(8, 256, 256), encoder="cpu")
except WriteError as exc:
    print(exc)
"""


@pytest.mark.parametrize("native_on", ["1", "0"], ids=["native", "python"])
def test_a_real_errno_from_the_kernel_is_a_clear_error(tmp_path, native_on):
    """A real failed write (EFBIG past RLIMIT_FSIZE: it fails for root too) from the native
    threads and from the Python path: the same WriteError naming the file, nothing left behind."""
    import subprocess
    import sys

    env = {**os.environ, "GPU_ZARR_NATIVE": native_on, "PYTHONPATH": os.pathsep.join(
        [str(__import__("pathlib").Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _EFBIG_SCRIPT, str(tmp_path / "big")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"cannot write {tmp_path}/.big.gpu-zarr-") and "/c/" in out.stdout, out.stdout
    assert "File too large" in out.stdout
    assert list(tmp_path.iterdir()) == []


def test_native_write_files_reports_each_file(tmp_path):
    from gpu_zarr.engine import native

    if not native.available():
        pytest.skip(f"native library: {native.status().reason}")
    (tmp_path / "there").write_bytes(b"old")
    pieces = [[b"ab", np.arange(4, dtype=np.uint8), memoryview(b""), bytearray(b"z")], [], [b"new"]]
    st, det = native.write_files([tmp_path / "a" / "b" / "one", tmp_path / "empty", tmp_path / "there"], pieces, 3)
    assert st.tolist() == [native.OK, native.OK, native.OPEN] and det.tolist()[:2] == [7, 0]
    assert det[2] == 17  # EEXIST: never overwritten
    assert (tmp_path / "a/b/one").read_bytes() == b"ab\x00\x01\x02\x03z" and (tmp_path / "there").read_bytes() == b"old"
    many = [[bytes([k % 256])] * 3000 for k in range(3)]  # past IOV_MAX pieces per file
    st, det = native.write_files([tmp_path / f"m{k}" for k in range(3)], many, 2)
    assert (st == native.OK).all() and all((tmp_path / f"m{k}").read_bytes() == bytes([k]) * 3000 for k in range(3))


def test_encode_batches_are_the_cpu_batch_or_the_gpu_setting():
    """The CPU twin encodes ``batch_bytes`` at a time; the GPU ``write_batch_bytes`` when set
    (else sized from the free GPU memory: on the GPU machine)."""
    from gpu_zarr import settings
    from gpu_zarr.write.api import encode_batch_bytes

    with settings.set(batch_bytes=64 << 20, write_batch_bytes=1 << 30):
        assert encode_batch_bytes(False, 3) == 64 << 20
        assert encode_batch_bytes(True, 3) == 1 << 30


def _inner_chunks(path, chunks, shards) -> dict[tuple[int, ...], bytes]:
    """Every stored chunk's encoded bytes by chunk grid index: plain files, or shards' inner chunks."""
    out: dict[tuple[int, ...], bytes] = {}
    for f in (path / "c").rglob("*"):
        if not f.is_file():
            continue
        idx = tuple(int(p) for p in f.relative_to(path / "c").parts)
        data = f.read_bytes()
        if shards is None:
            out[idx] = data
            continue
        per = [s // c for s, c in zip(shards, chunks, strict=True)]
        n = int(np.prod(per))
        table = np.frombuffer(data[-(16 * n + 4):-4], "<u8").reshape(n, 2)
        for k, inner in enumerate(np.ndindex(*per)):
            off, size = (int(v) for v in table[k])
            if off != int(MISSING):
                out[tuple(i * p + j for i, p, j in zip(idx, per, inner, strict=True))] = data[off:off + size]
    return out


@pytest.mark.parametrize("codec", ["zstd", "blosc-lz4"])
def test_plain_and_sharded_store_the_same_chunk_bytes(tmp_path, codec):
    """One chunk, one encoder, one set of bytes, whatever file holds it: a sharded array's
    inner chunks are byte for byte the plain array's chunk files (edges included)."""
    a = _data()
    shards = (16, 64, 128)
    with settings.set(batch_bytes=1 << 20, lanes=2):  # several batches, of different compositions
        plain = write_zarr(a, tmp_path / "p", chunks=CHUNKS, shards=False, codec=codec, encoder="cpu")
        sharded = write_zarr(a, tmp_path / "s", chunks=CHUNKS, shards=shards, codec=codec, encoder="cpu")
    p, s = _inner_chunks(tmp_path / "p", CHUNKS, None), _inner_chunks(tmp_path / "s", CHUNKS, shards)
    assert len(p) == int(np.prod([-(-n // c) for n, c in zip(SHAPE, CHUNKS, strict=True)]))
    assert p.keys() == s.keys() and all(p[k] == s[k] for k in p)
    n_shards = int(np.prod([-(-n // c) for n, c in zip(SHAPE, shards, strict=True)]))
    index = 16 * int(np.prod([c // k for c, k in zip(shards, CHUNKS, strict=True)])) + 4
    assert sharded.stored_bytes == plain.stored_bytes + n_shards * index  # the indexes are all that differs


def test_encoded_frames_are_walked_before_anything_is_written():
    """The GPU encoder's frames go through the reader's zstd frame walk before a file is
    written (``encode._check_encoded``): whole frames pass; a frame cut short, an empty one
    and one stating another content size fail the write, naming the frame."""
    import numcodecs

    from gpu_zarr.write.encode import _check_encoded

    chunk = np.arange(65536, dtype="<u2")
    frames = [bytes(numcodecs.Zstd(3).encode(chunk + k)) for k in range(3)]

    def check(parts: list[bytes], nbytes: int = chunk.nbytes) -> None:
        sizes = np.array([len(p) for p in parts], np.int64)
        _check_encoded(np.frombuffer(b"".join(parts) + b"\0", np.uint8), np.cumsum(sizes) - sizes, sizes, nbytes)

    check(frames)
    for bad in (frames[1][:-3], b"", frames[1][:9]):
        with pytest.raises(WriteError, match="frame 1 of 3.*encoder='cpu'"):
            check([frames[0], bad, frames[2]])
    with pytest.raises(WriteError, match="frame 0 of 3"):
        check(frames, chunk.nbytes * 2)


def test_staged_frames_come_to_the_host_a_run_at_a_time_and_are_walked():
    """The GPU encoder's frames reach the host through one staging buffer, a run of frames a
    call (the copy here is numpy's; on the GPU a copy on the lane's stream): each run equals its
    frames, one lease serves every run that fits it, a bigger run gets a bigger one, and a frame
    that is not whole fails its run, named by its place in the batch."""
    import numcodecs

    chunks = [(np.arange(int(np.prod(CHUNKS)), dtype="<u2") * (k + 1)).reshape(CHUNKS) for k in range(6)]
    parts = [bytes(numcodecs.Zstd(3).encode(c)) for c in chunks]
    staging = Staging()
    enc = staged(parts, 2 * max(map(len, parts)), staging, chunks[0].nbytes)
    assert [bytes(p) for p in enc.frames(0, 2)] == parts[:2] and [bytes(p) for p in enc.frames(2, 4)] == parts[2:4]
    assert len(staging.leases) == 1
    assert [bytes(p) for p in enc.frames(0, 6)] == parts and len(staging.leases) == 2 and staging.out == 1
    enc.release()
    assert staging.out == 0
    bad = parts[:3] + [parts[3][:-5]] + parts[4:]
    enc = staged(bad, 1 << 30, staging, chunks[0].nbytes)
    assert [bytes(p) for p in enc.frames(0, 3)] == parts[:3]
    with pytest.raises(WriteError, match="frame 3 of 6 in the batch"):
        enc.frames(2, 6)
    enc.release()
    assert staging.out == 0


def test_file_groups_hold_whole_files_under_the_limit():
    from gpu_zarr.write.plan import Unit
    from gpu_zarr.write.writer import _file_groups

    units = [Unit((k,), (0,), (1,), np.array(p)) for k, p in enumerate([[1, 1], [1, 0], [1, 1], [1]])]
    sizes = np.array([10, 10, 30, 5, 5, 40], np.int64)  # frames: unit 0: 2, unit 1: 1, unit 2: 2, unit 3: 1
    assert _file_groups(units, sizes, None) == [(0, 4, 0, 6)]
    assert _file_groups(units, sizes, 50) == [(0, 2, 0, 3), (2, 4, 3, 6)]  # 20 + 30, 10 + 40 bytes
    assert _file_groups(units, sizes, 49) == [(0, 1, 0, 2), (1, 3, 2, 5), (3, 4, 5, 6)]
    assert _file_groups(units, sizes, 1) == [(0, 1, 0, 2), (1, 2, 2, 3), (2, 3, 3, 5), (3, 4, 5, 6)]  # one file each
    assert _file_groups(units, sizes, 100) == [(0, 4, 0, 6)]
    # at least min_files files a group (a remote store's requests in flight), bytes or not
    assert _file_groups(units, sizes, 1, 2) == [(0, 2, 0, 3), (2, 4, 3, 6)]
    assert _file_groups(units, sizes, 49, 3) == [(0, 3, 0, 5), (3, 4, 5, 6)]


@pytest.mark.parametrize("fmt,shards", [(3, (16, 64, 128)), (3, False), (2, None)], ids=["v3-sharded", "v3", "v2"])
def test_a_staged_encoder_writes_the_same_files(tmp_path, monkeypatch, fmt, shards):
    """The writer through the GPU encoder's staged hand-off (frames packed in one buffer, copied
    out in runs of whole files under a small staging buffer) writes the files the CPU encoder
    writes, byte for byte, and zarr reads them back."""
    from gpu_zarr.write import api

    staging = Staging()
    Staged = staged_encoder(staging, 64 << 10)

    a = _data()
    with settings.set(batch_bytes=1 << 20, lanes=2):
        write_zarr(a, tmp_path / "cpu", chunks=CHUNKS, shards=shards, zarr_format=fmt, encoder="cpu")
        monkeypatch.setattr(api, "choose_encoder", lambda spec, encoder, threads: (Staged(spec, threads), "staged"))
        res = write_zarr(a, tmp_path / "staged", chunks=CHUNKS, shards=shards, zarr_format=fmt, encoder="cpu")
    n_files = len([f for f in (tmp_path / "cpu").rglob("*") if f.is_file() and not f.name.startswith((".z", "zarr."))])
    assert res.reason == "staged" and res.stages["copy"] > 0 and staging.out == 0
    assert 2 < staging.copies <= n_files and all(n >= 64 << 10 for n in staging.leases)  # runs of whole files
    assert _tree(tmp_path / "cpu") == _tree(tmp_path / "staged")
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "staged"), mode="r")[...], a)
