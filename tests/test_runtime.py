"""The runtime, settings, the fit check and the pipeline's ordering, on the CPU (no GPU needed)."""

from __future__ import annotations

import resource
import threading
import time

import numpy as np
import pytest
import zarr

from gpu_zarr import capabilities, settings
from gpu_zarr.engine import EngineOptions, read
from gpu_zarr.engine import pipeline as pipeline_mod
from gpu_zarr.engine.ops import AsyncCpuOps
from gpu_zarr.engine.runtime import Runtime, get_runtime
from gpu_zarr.errors import CorruptChunkError, OutOfHostMemory
from gpu_zarr.zarr_io import read_selection, read_zarr
from stores import write


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class CheckingCpuOps(AsyncCpuOps):
    """AsyncCpuOps that fails when a buffer is written while earlier submitted work that reads
    it has not finished (a slot refilled too early), and that slows its copies down so that
    such a race would show."""

    def __init__(self, slots: int = 3, delay: float = 0.002) -> None:
        super().__init__(slots)
        self.delay = delay
        self.readers: dict[int, list] = {}
        self.lock = threading.Lock()
        self.violations: list[str] = []

    def _read_by(self, buf, fut) -> None:
        with self.lock:
            self.readers.setdefault(_ptr(buf), []).append(fut)

    def earlier_readers(self, buf) -> list:
        with self.lock:
            return list(self.readers.get(_ptr(buf), []))

    def check_writable(self, buf, who: str, earlier: list | None = None) -> None:
        """Every operation submitted before this write that reads ``buf`` must be done."""
        pending = [f for f in (self.earlier_readers(buf) if earlier is None else earlier) if not f.done()]
        if pending:
            self.violations.append(f"{who} wrote a buffer that {len(pending)} queued operation(s) still read")

    def upload(self, host, dev, nbytes, slot=0, after=None):
        earlier = self.earlier_readers(dev)  # in program order: readers queued before this copy

        def copy():
            time.sleep(self.delay)
            self.check_writable(dev, "upload", earlier)
            dev[:nbytes] = host[:nbytes]
        fut = self._submit(self._copy[slot % len(self._copy)], copy, after=after)
        self._read_by(host, fut)
        return fut

    def decode_batch(self, algo, src, src_offsets, src_sizes, dst, dst_offsets, dst_sizes, names, slot=0,
                     wait=None, walked=False):
        fut = self._run(pipeline_decode(algo, walked), src, src_offsets, src_sizes, dst, dst_offsets, dst_sizes, names,
                        slot=slot, after=wait)
        self._read_by(src, fut)

    def place(self, src, src_offsets, table, out, disk_dtype, slot=0, wait=None, perm=None):
        from gpu_zarr.engine.place import place_cpu

        fut = self._run(place_cpu, src, src_offsets, table, out, disk_dtype, perm, slot=slot, after=wait)
        self._read_by(src, fut)


def pipeline_decode(algo, walked=False):
    from gpu_zarr.engine.decode import decode_batch_cpu

    return lambda *a: decode_batch_cpu(algo, *a, walked=walked)


class CheckingReader:
    """Wraps the real reader: before filling a buffer, asks the ops whether that is safe."""

    def __init__(self, inner, ops: CheckingCpuOps) -> None:
        self.inner, self.ops = inner, ops
        self.name, self.threads = inner.name, inner.threads

    def read(self, files, batch, dest) -> None:
        self.ops.check_writable(dest, "reader")
        self.inner.read(files, batch, dest)

    def session(self):
        return self.inner.session()

    def close(self) -> None:
        pass


def _read_checked(arr, monkeypatch, *, break_ordering: bool = False, lanes: int = 3):
    ops = CheckingCpuOps(slots=3)
    ops.lanes = lanes
    ops._lanes = ops._lanes[:lanes]
    rt = Runtime()
    import gpu_zarr.engine.pipeline as pipeline
    from gpu_zarr.engine.sources.files import reader_of

    monkeypatch.setattr(pipeline, "reader_of",
                        lambda runtime, kind, threads: CheckingReader(reader_of(runtime, kind, threads), ops))
    if break_ordering:  # a pipeline that does not wait for a slot to be free before refilling it
        monkeypatch.setattr(ops, "wait", lambda event: None)
    res: object = None
    try:
        res = read(arr, Ellipsis, device="cpu", ops=ops, runtime=rt,
                   options=EngineOptions(batch_bytes=1, slots=3, lanes=lanes, threads=2))
    except CorruptChunkError as exc:  # what a race does to zstd data: keep it as evidence
        if not break_ordering:
            raise
        ops.violations.append(f"corrupt data: {exc}")
    finally:
        ops.sync()
        ops.close()
        rt.close()
    return res, ops


@pytest.mark.parametrize("lanes", [1, 3])
@pytest.mark.parametrize("codec", ["zstd", "raw"])
def test_overlapped_cpu_twin_never_refills_a_busy_slot(tmp_path, monkeypatch, codec, lanes):
    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec=codec, chunks=(4, 8, 7), shards=(8, 16, 14))
    res, ops = _read_checked(arr, monkeypatch, lanes=lanes)
    assert ops.violations == []
    assert res.stats["batches"] > 10
    np.testing.assert_array_equal(res.data, arr[...])


def test_the_ordering_check_catches_a_broken_pipeline(tmp_path, monkeypatch):
    """The double is not a test that cannot fail: without the slot wait it reports the race."""
    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", chunks=(4, 8, 7), shards=(8, 16, 14))
    monkeypatch.setattr(pipeline_mod, "get_runtime", lambda: Runtime())
    _, ops = _read_checked(arr, monkeypatch, break_ordering=True)
    assert ops.violations, "a refill before the upload finished went unnoticed"


def test_reads_from_several_threads_report_their_own_stats(tmp_path):
    small, _ = write(tmp_path / "s.zarr", fmt=3, codec="zstd", shape=(8, 16, 14), chunks=(4, 8, 7))
    big, _ = write(tmp_path / "b.zarr", fmt=3, codec="zstd", shape=(40, 32, 28), chunks=(4, 8, 7))
    want = {"s": (small, 2 * 2 * 2), "b": (big, 10 * 4 * 4)}
    errors: list[str] = []
    barrier = threading.Barrier(4)

    def work(name: str) -> None:
        arr, pieces = want[name]
        barrier.wait()
        for _ in range(5):
            res = read(arr, Ellipsis, device="cpu")
            if res.stats["pieces"] != pieces:
                errors.append(f"{name}: {res.stats['pieces']} pieces, expected {pieces}")
            if res.data.shape != arr.shape:
                errors.append(f"{name}: shape {res.data.shape}")

    threads = [threading.Thread(target=work, args=(n,)) for n in ("s", "b", "s", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_read_result_stats_belong_to_the_read(tmp_path, monkeypatch):
    from gpu_zarr.capabilities import Capabilities

    monkeypatch.setattr(capabilities, "probe", lambda: Capabilities())
    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd")
    res = read_selection(arr, (0,), prefer="cpu")
    other = read_selection(arr, (slice(0, 20),), prefer="cpu")
    assert res.backend == "cpu" and res.stats is not other.stats
    assert res.stats.get("pieces", 0) < other.stats.get("pieces", 1)  # each read's own counts


def test_absurd_shape_is_a_clear_error_on_the_cpu(tmp_path, monkeypatch):
    from gpu_zarr.capabilities import Capabilities

    monkeypatch.setattr(capabilities, "probe", lambda: Capabilities())
    zarr.create_array(str(tmp_path / "huge.zarr"), shape=(2**40, 2**20), chunks=(64, 1024), dtype="u2",
                      compressors=None)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    with pytest.raises(OutOfHostMemory, match=r"needs 2,147,483,648\.00 GiB of host memory"):
        read_zarr(tmp_path / "huge.zarr", prefer="auto")
    with pytest.raises(OutOfHostMemory, match="read_region"):
        read(str(tmp_path / "huge.zarr"), Ellipsis, device="cpu")
    assert time.perf_counter() - t < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB


def test_runtime_owns_pools_resources_and_closes_them():
    rt = Runtime()
    closed = []
    obj = rt.resource(("thing", 1), lambda: [1, 2, 3], close=closed.append, nbytes=lambda o: 24)
    assert rt.resource(("thing", 1), lambda: pytest.fail("made twice")) is obj
    pool = rt.pool("x", 2)
    assert rt.pool("x", 2) is pool
    rep = rt.report()
    assert rep["resources"] == {"thing 1": 24} and rep["thread_pools"] == {"x": 2}
    rt.close()
    assert closed == [obj] and rt.report()["resources"] == {}
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)


def test_get_runtime_is_one_object_across_threads():
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(get_runtime())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is seen[0] for r in seen)


def test_pinned_pool_is_shared_and_bounded():
    rt = Runtime()
    allocs = []

    def alloc(n):
        allocs.append(n)
        return np.empty(n, np.uint8)

    with settings.set(pinned_bytes=3000):
        with rt.pinned.lease(1000, 2, alloc) as a:
            assert len(a) == 2 and all(b.nbytes == 1000 for b in a)
            with rt.pinned.lease(1000, 2, alloc) as b:  # only 1000 bytes left: one pinned, one pageable
                assert len(b) == 2
            assert rt.pinned.pageable_leases == 1
        with rt.pinned.lease(800, 3, alloc):  # reuses the three pinned buffers
            pass
    assert allocs == [1000, 1000, 1000]
    assert rt.report()["pinned_bytes"] == 3000


def test_batches_fit_the_memory_budget(tmp_path):
    from gpu_zarr.engine.codecs.chain import stage_for
    from gpu_zarr.engine.metadata import layout_of
    from gpu_zarr.engine.pipeline import _size_batches

    arr, _ = write(tmp_path / "a.zarr", fmt=3, codec="zstd", shape=(64, 64, 64), chunks=(8, 8, 8))
    lay = layout_of(arr)
    stage = stage_for(lay)
    opts = EngineOptions(batch_bytes=1 << 30, pinned_limit=1 << 30)
    for budget in (50_000, 500_000, 5_000_000):
        batch, device_bytes = _size_batches(lay, stage, opts, slots=3, lanes=3, budget=budget)
        assert device_bytes <= max(budget, 3 * lay.inner_nbytes + 3 * (lay.inner_nbytes + stage.scratch_bytes(1, lay)))
        assert batch >= lay.inner_nbytes
    small, _ = _size_batches(lay, stage, opts, 3, 3, 50_000)
    big, _ = _size_batches(lay, stage, opts, 3, 3, 5_000_000)
    assert big > small
    res = read(arr, Ellipsis, device="cpu", options=EngineOptions(budget_bytes=50_000))
    np.testing.assert_array_equal(res.data, arr[...])
    assert res.stats["budget_bytes"] == 50_000 and res.stats["planned_device_bytes"] <= 50_000 + 4 * 8 * 8 * 8 * 4


def test_settings_get_set_and_restore():
    before = settings.get("slots")
    with settings.set(slots=5):
        assert settings.get("slots") == 5
        assert EngineOptions().slots == 5
    assert settings.get("slots") == before
    with pytest.raises(ValueError, match="out of range"):
        settings.set(slots=0)
    with pytest.raises(KeyError, match="unknown gpu_zarr setting"):
        settings.get("nope")


def test_pinned_pool_takes_any_free_buffer():
    """Taking a free buffer that is not the first in the list (found on the H200: list.remove
    compared numpy arrays elementwise and raised)."""
    rt = Runtime()
    with settings.set(pinned_bytes=1 << 20):
        with rt.pinned.lease(5000, 1, lambda n: np.zeros(n, np.uint8)), \
                rt.pinned.lease(100, 1, lambda n: np.zeros(n, np.uint8)):
            pass  # the free list is now [100-byte buffer, 5000-byte buffer]
        with rt.pinned.lease(4000, 1, lambda n: np.zeros(n, np.uint8)) as (buf,):
            assert buf.nbytes == 4000
        with rt.pinned.lease(50, 2, lambda n: np.zeros(n, np.uint8)) as bufs:
            assert len(bufs) == 2


def test_pinned_leases_of_nearly_equal_sizes_share_buffers():
    """Batches differ by a few bytes from read to read: a size class keeps them on one buffer
    (pinning anew per read cost ~180 ms on the H200)."""
    rt = Runtime()
    allocs = []

    def alloc(n):
        allocs.append(n)
        return np.empty(n, np.uint8)

    with settings.set(pinned_bytes=1 << 30):
        with rt.pinned.lease(3_000_000, 1, alloc) as (a,):
            assert a.nbytes == 3_000_000
        with rt.pinned.lease(3_100_000, 1, alloc) as (b,):
            assert b.nbytes == 3_100_000
    assert allocs == [3 << 20]


# ---------------------------------------------------------------- recycled host memory of handed-on arrays
def test_recycled_memory_comes_back_only_when_every_view_is_gone():
    import gc

    rt = Runtime()
    rec = rt.recycled
    a = rec.empty((512, 1024), np.uint16)
    assert a.shape == (512, 1024) and a.dtype == np.uint16 and a.flags.c_contiguous and a.flags.writeable
    a[:] = 7
    view = a[10:20, ::3]  # a view outlives the array it came from
    addr = a.ctypes.data
    del a
    gc.collect()
    assert rec.free_bytes == 0, "the block came back while a view of it was alive"
    b = rec.empty((512, 1024), np.uint16)
    assert b.ctypes.data != addr  # not the view's memory
    assert (view == 7).all()
    del view, b
    gc.collect()
    assert rec.free_bytes > 0
    c = rec.empty((512, 1024), np.uint16)  # an earlier block, reused
    assert rec.reused == 1 and c.ctypes.data in (addr, c.ctypes.data)
    # a remote read's landing (take): bytes, recycled the same way
    t = rec.take(600_000)
    assert t.shape == (600_000,) and t.dtype == np.uint8 and t.flags.writeable
    held = rec.free_bytes
    part = t[100:200]
    del t
    gc.collect()
    assert rec.free_bytes == held  # a view of it is alive
    del part
    gc.collect()
    assert rec.free_bytes > held
    rt.close()
    assert rec.free_bytes == 0


def test_recycled_sizes_dtypes_and_bound(monkeypatch):
    import gc

    rt = Runtime()
    rec = rt.recycled
    small = rec.empty(1000, np.uint8)  # under MIN_BYTES: a plain array
    assert small.flags.owndata
    for shape, dt in (((3, 300, 301), np.float64), ((1 << 20,), np.uint8), ((700, 700), ">i4"), ((2, 2), object)):
        x = rec.empty(shape, dt)
        assert x.shape == shape and x.dtype == np.dtype(dt)
        if np.dtype(dt).hasobject:
            assert x.flags.owndata  # never recycled
    monkeypatch.setattr(settings, "get", lambda name: 64 << 20 if name == "pinned_bytes" else None)
    assert rec.limit == 16 << 20
    big = rec.empty(rec.limit + 1, np.uint8)  # over a quarter of pinned_bytes: a plain array
    assert big.flags.owndata
    arrays = [rec.empty(1 << 20, np.uint8) for _ in range(40)]  # 40 MiB lent, more than the 32 MiB kept
    del arrays
    gc.collect()
    assert rec.free_bytes == 32 << 20
    reused = rec.reused
    two = rec.empty(2 << 20, np.uint8)  # another size: a new block
    del two
    gc.collect()
    assert rec.free_bytes == 32 << 20 and rec.reused == reused  # the oldest free blocks made room


def test_recycled_arrays_from_many_threads():
    import gc

    rt = Runtime()
    rec = rt.recycled
    errors = []

    def work(k):
        try:
            for i in range(200):
                a = rec.empty((300, 1000), np.uint8)
                a[:] = k
                assert (a == k).all()  # nobody else was lent this block meanwhile
                del a
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
    ts = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    gc.collect()
    assert not errors
    assert rec.reused > 0


def test_cpu_read_results_are_recycled_and_stay_correct(tmp_path):
    """A CPU read's result is recycled memory: results kept by the caller are never overwritten."""
    import gc

    ref = np.arange(8 * 512 * 512, dtype=np.uint16).reshape(8, 512, 512)
    z = zarr.create_array(tmp_path / "a.zarr", shape=ref.shape, chunks=(1, 256, 256), dtype=ref.dtype)
    z[:] = ref
    kept = [(k, read(z, (k,), device="cpu").data) for k in range(8)]
    for r in range(3):  # reads after some results were dropped reuse their memory
        del kept[::2]
        gc.collect()
        kept += [(k, read(z, (k,), device="cpu").data) for k in range(r, 8, 2)]
    for k in range(8):
        assert np.array_equal(read(z, (k,), device="cpu").data, ref[k])
    assert get_runtime().recycled.reused > 0
    for k, a in kept:
        assert np.array_equal(a, ref[k])
