"""The seeded fuzz suite: every store of :mod:`fuzz_stores` through every entry point.

Each result must be one of

- **equal**: the same values, shape and dtype as zarr-python's own CPU read of the store;
- **clear**: a :mod:`gpu_zarr.errors` exception whose message names the case's store (its
  folder) and, for a damaged chunk, the chunk's key (for a shard, the shard's key and the
  inner chunk's position);
- **declined**: :class:`~gpu_zarr.errors.UnsupportedArrayError` / ``BackendUnavailable``
  (the backend cannot serve the array, and says so), or the napari reader returning None;

and never

- **garbage**: data where zarr's read raises, or data unlike zarr's;
- **unclear**: any other exception (zarr's, numpy's, numcodecs': ``ValueError``,
  ``OverflowError``, ``MemoryError``, ``KeyError``...), or one of ours that does not name the
  store or the chunk; for the CLI: a traceback, or an exit status other than 0 and 2;
- **hang / crash**: no result within the time limit, or a process that dies (hostile shapes run
  in a subprocess bounded in wall-clock time and address space);
- **changed store**: any file of the store different afterwards (every file is hashed).

The entry points: read_zarr, read_region, the engine, the lazy array, read_omezarr / open_ome,
to_dask, the napari reader, gpu_zarr_context and read_zarr_to_gpu, each with the backends that
apply (``ENTRIES``); HCS plates through open_plate / open_well / the napari reader on plates
whose well has a damaged chunk or hostile metadata (``PLATE_ENTRIES``); the CLI with
``--backend cpu`` and, on a subset, ``auto``. The CPU entry points (and ``auto``) run in CI; the
GPU ones are marked ``gpu``, including the napari reader with each GPU backend forced and
``auto`` again (so ``pytest -m gpu`` fuzzes them on the GPU). Without a GPU, read_zarr_to_gpu must
say at once that it needs one. ``GPU_ZARR_FUZZ_FULL=1`` damages every Blosc variant.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import fuzz_stores as fs  # noqa: E402

TIMEOUT_S = 30.0  # in-process reads: a read of these tiny stores takes milliseconds
CHILD_TIMEOUT_S = 120.0  # one child runs every entry point on one hostile-shape case
CHILD_MEMORY = 6 << 30  # address-space bound of a hostile-shape child (RLIMIT_AS)
CASES = fs.cases()
BY_NAME = {c.name: c for c in CASES}


# -- entry points ----------------------------------------------------------------------------
def _zarr_ref(case: fs.Case, base: Path, region: bool) -> Any:
    import zarr

    a = zarr.open_array(str(case.array(base)), mode="r")
    return np.asarray(a[fs.REGION] if region else a[...])


def _read_zarr(backend: str) -> Callable[[fs.Case, Path], Any]:
    def run(case: fs.Case, base: Path) -> Any:
        from gpu_zarr.zarr_io import read_zarr

        return read_zarr(str(case.array(base)), prefer=backend, progress=None).data
    return run


def _read_region(backend: str) -> Callable[[fs.Case, Path], Any]:
    def run(case: fs.Case, base: Path) -> Any:
        from gpu_zarr.zarr_io import read_region

        return read_region(str(case.array(base)), fs.REGION, backend=backend)
    return run


def _engine(device: str, fast: bool = False) -> Callable[[fs.Case, Path], Any]:
    def run(case: fs.Case, base: Path) -> Any:
        from gpu_zarr.engine import EngineOptions, get_runtime
        from gpu_zarr.engine import read as engine_read
        from gpu_zarr.engine.ops import CpuOps

        opts = EngineOptions(reader="threads")
        ops = CpuOps(get_runtime().pool("cpu-decode", opts.threads), opts.threads, fast=True) if fast else None
        return engine_read(str(case.array(base)), fs.REGION, device=device, options=opts, ops=ops).data
    return run


def _lazy(backend: str) -> Callable[[fs.Case, Path], Any]:
    def run(case: fs.Case, base: Path) -> Any:
        from gpu_zarr.lazy import GpuLazyArray
        from gpu_zarr.store import open_array

        return GpuLazyArray(open_array(str(case.array(base))), backend)[fs.REGION]
    return run


def _omezarr(backend: str) -> Callable[[fs.Case, Path], Any]:
    def run(case: fs.Case, base: Path) -> Any:
        from gpu_zarr.omezarr import read_omezarr
        from gpu_zarr.zarr_io import read_region

        arr, _ = read_omezarr(str(case.image(base)), level=0)
        return read_region(arr, fs.REGION, backend=backend)
    return run


def _open_ome(backend: str) -> Callable[[fs.Case, Path], Any]:
    def run(case: fs.Case, base: Path) -> Any:
        from gpu_zarr.lazy import GpuLazyArray
        from gpu_zarr.omezarr import open_ome

        img = open_ome(str(case.image(base)))
        return GpuLazyArray(img.open_level(0), backend)[fs.REGION]
    return run


def _dask(backend: str, ome: bool = False) -> Callable[[fs.Case, Path], Any]:
    def run(case: fs.Case, base: Path) -> Any:
        from gpu_zarr.dask_array import to_dask

        if ome:
            d = to_dask(str(case.image(base)), level=0, backend=backend)
        else:
            d = to_dask(str(case.array(base)), backend=backend)
        return d[fs.REGION].compute(scheduler="synchronous")
    return run


def _napari(ome: bool, backend: str | None = None) -> Callable[[fs.Case, Path], Any]:
    """The napari reader's first layer, read as napari does; ``backend`` forces the layer's
    backend (the reader itself leaves it at "auto")."""
    def run(case: fs.Case, base: Path) -> Any:
        from gpu_zarr.napari_plugin._reader import napari_get_reader

        path = str(case.image(base) if ome else case.array(base))
        fn = napari_get_reader(path)
        if fn is None:
            return None  # declined
        layers = fn(path)
        data = layers[0][0]
        if isinstance(data, list):
            data = data[0]
        if backend is not None:
            data.backend = backend
        return np.asarray(data[fs.REGION])
    return run


def _to_gpu(backend: str) -> Callable[[fs.Case, Path], Any]:
    def run(case: fs.Case, base: Path) -> Any:
        from gpu_zarr.zarr_io import read_zarr_to_gpu

        return read_zarr_to_gpu(str(case.array(base)), prefer=backend)
    return run


def _context(case: fs.Case, base: Path) -> Any:
    from gpu_zarr.store import open_array
    from gpu_zarr.zarr_io import gpu_zarr_context

    # opened inside the block, as documented: a zarr array keeps the codec pipeline it was
    # opened with, so one opened before the block reads through zarr's own pipeline
    with gpu_zarr_context():
        return open_array(str(case.array(base)))[fs.REGION]


#: name -> (function, reads the region (else the whole array), OME entry, needs a GPU)
ENTRIES: dict[str, tuple[Callable[[fs.Case, Path], Any], bool, bool, bool]] = {
    "read_zarr-cpu": (_read_zarr("cpu"), False, False, False),
    "read_zarr-auto": (_read_zarr("auto"), False, False, False),
    "read_region-cpu": (_read_region("cpu"), True, False, False),
    "read_region-auto": (_read_region("auto"), True, False, False),
    "engine-cpu": (_engine("cpu"), True, False, False),
    "engine-cpu-fast": (_engine("cpu", fast=True), True, False, False),
    "lazy-cpu": (_lazy("cpu"), True, False, False),
    "lazy-auto": (_lazy("auto"), True, False, False),
    "read_omezarr-cpu": (_omezarr("cpu"), True, True, False),
    "open_ome-lazy-cpu": (_open_ome("cpu"), True, True, False),
    "dask-cpu": (_dask("cpu"), True, False, False),
    "dask-ome-cpu": (_dask("cpu", ome=True), True, True, False),
    "napari-array": (_napari(False), True, False, False),
    "napari-ome": (_napari(True), True, True, False),
    # GPU backends (the H200 machine: pytest -m gpu tests/test_fuzz.py)
    "read_zarr-kvikio": (_read_zarr("kvikio"), False, False, True),
    "read_zarr-zarr-gpu": (_read_zarr("zarr-gpu"), False, False, True),
    "read_region-kvikio": (_read_region("kvikio"), True, False, True),
    "read_region-zarr-gpu": (_read_region("zarr-gpu"), True, False, True),
    "engine-gpu": (_engine("gpu"), True, False, True),
    "lazy-kvikio": (_lazy("kvikio"), True, False, True),
    "lazy-zarr-gpu": (_lazy("zarr-gpu"), True, False, True),
    "read_omezarr-kvikio": (_omezarr("kvikio"), True, True, True),
    "dask-kvikio": (_dask("kvikio"), True, False, True),
    "gpu_zarr_context": (_context, True, False, True),
    "read_zarr_to_gpu-auto": (_to_gpu("auto"), False, False, True),
    "read_zarr_to_gpu-kvikio": (_to_gpu("kvikio"), False, False, True),
    "read_zarr_to_gpu-zarr-gpu": (_to_gpu("zarr-gpu"), False, False, True),
    "read_omezarr-zarr-gpu": (_omezarr("zarr-gpu"), True, True, True),
    "open_ome-lazy-kvikio": (_open_ome("kvikio"), True, True, True),
    "open_ome-lazy-zarr-gpu": (_open_ome("zarr-gpu"), True, True, True),
    "dask-zarr-gpu": (_dask("zarr-gpu"), True, False, True),
    "dask-ome-kvikio": (_dask("kvikio", ome=True), True, True, True),
    "dask-ome-zarr-gpu": (_dask("zarr-gpu", ome=True), True, True, True),
    # the napari reader on the GPU: its own choice ("auto"; unmarked above, so `-m gpu` would
    # skip it) and each GPU backend forced
    "napari-array-auto-gpu": (_napari(False), True, False, True),
    "napari-ome-auto-gpu": (_napari(True), True, True, True),
    "napari-array-kvikio": (_napari(False, "kvikio"), True, False, True),
    "napari-array-zarr-gpu": (_napari(False, "zarr-gpu"), True, False, True),
    "napari-ome-kvikio": (_napari(True, "kvikio"), True, True, True),
    "napari-ome-zarr-gpu": (_napari(True, "zarr-gpu"), True, True, True),
    "read_region-auto-gpu": (_read_region("auto"), True, False, True),
    "lazy-auto-gpu": (_lazy("auto"), True, False, True),
}


# -- outcomes --------------------------------------------------------------------------------
def _summary(data: Any) -> dict[str, Any]:
    """What a result is, comparable across processes: shape, dtype and a hash of the values."""
    if data is None:
        return {"kind": "declined", "type": "None"}
    if hasattr(data, "__cuda_array_interface__"):
        import cupy

        data = cupy.asnumpy(data)
    a = np.asarray(data)
    if a.dtype.kind in "OTU":
        blob = repr(a.tolist()).encode()
    else:
        blob = np.ascontiguousarray(a).tobytes()
    return {"kind": "data", "shape": list(a.shape), "dtype": str(a.dtype), "sha": hashlib.sha256(blob).hexdigest()}


def _error(exc: BaseException) -> dict[str, Any]:
    return {"kind": "error", "type": type(exc).__name__,
            "mro": [f"{k.__module__}.{k.__name__}" for k in type(exc).__mro__], "msg": str(exc)}


def outcome(fn: Callable[[fs.Case, Path], Any], case: fs.Case, base: Path) -> dict[str, Any]:
    try:
        return _summary(fn(case, base))
    except Exception as exc:  # noqa: BLE001 - judged below
        return _error(exc)


def outcome_bounded(entry: str, case: Any, base: Path, fn: Callable[[Any, Path], Any] | None = None) -> dict[str, Any]:
    """``outcome`` in this process, failing the test when it takes longer than TIMEOUT_S."""
    box: list[dict[str, Any]] = []
    fn = fn or ENTRIES[entry][0]

    def work() -> None:
        box.append(outcome(fn, case, base))
    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(TIMEOUT_S)
    if not box:
        pytest.fail(f"HANG: {entry} on {case.name} gave no result in {TIMEOUT_S:.0f} s")
    return box[0]


_child_runs: dict[tuple[str, bool, str | None], dict[str, Any]] = {}

#: damages that leave every header a check can read intact and hit a compressed block's body
#: (entropy-coded literals and sequences): nvCOMP, undefined on corrupt input, may fault the GPU
#: on them, which no later test in the process could survive (CUDA keeps the context broken)
BODY_DAMAGES = ("flip-header12", "flip-body", "byte-last", "inner-flip", "inner-trunc")
#: entries that decode small reads on the GPU (the others take the CPU's small-read path here)
GPU_DECODING = ("engine-gpu",)


def may_fault(entry: str, case: fs.Case) -> bool:
    """Whether this entry on this case runs in a child process of its own (a GPU fault there
    is judged like any outcome; the test process's GPU stays usable)."""
    return entry in GPU_DECODING and case.kind == "damage" and case.codec != "raw" and \
        case.name.endswith(BODY_DAMAGES)


def outcomes_child(case: fs.Case, base: Path, gpu: bool, only: str | None = None) -> dict[str, Any]:
    """Every entry point (CPU or GPU ones; or ``only`` that one) on a case in ONE subprocess
    bounded in wall-clock time (and, for the CPU, in address space), one JSON line per entry as
    it finishes (cached per case): an entry without a line hung or crashed the process."""
    key = (case.name, gpu, only)
    if key in _child_runs:
        return _child_runs[key]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE),
                                                         os.environ.get("PYTHONPATH", "")])}
    # zarr's own reads run in the CPU child only: that one is bounded in address space, and an
    # unbounded zarr read of a 6 TiB shape would be killed by the kernel, not refused
    entries = [only] if only else (
        ([] if gpu else ["zarr-region", "zarr-all"]) + [e for e, v in ENTRIES.items() if v[3] == gpu])
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__)), ",".join(entries), case.name, str(base)],
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env)
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err, rc = f"ran past {CHILD_TIMEOUT_S:.0f} s", None
    got = {}
    for line in out.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            got[rec.pop("entry")] = rec
    _child_runs[key] = {"got": got, "rc": rc, "err": err[-2000:]}
    return _child_runs[key]


def _from_child(run: dict[str, Any], entry: str, case: fs.Case, strict: bool = True) -> dict[str, Any]:
    if entry in run["got"]:
        return run["got"][entry]
    what = "HANG" if run["rc"] is None else "CRASH"
    if not strict:  # zarr's own read: it failing to finish is an outcome, not a test failure
        return {"kind": "error", "type": what, "mro": [], "msg": run["err"]}
    pytest.fail(f"{what}: {entry} on {case.name} gave no result (exit {run['rc']}, memory bound "
                f"{CHILD_MEMORY >> 30} GiB, {CHILD_TIMEOUT_S:.0f} s): {run['err']}")


def reference(case: fs.Case, base: Path, region: bool) -> dict[str, Any]:
    """zarr-python's own CPU read of the store (an outcome)."""
    if case.hostile_shape:
        return _from_child(outcomes_child(case, base, gpu=False), "zarr-region" if region else "zarr-all",
                           case, strict=False)
    return outcome(lambda c, b: _zarr_ref(c, b, region), case, base)


# -- judging ---------------------------------------------------------------------------------
DECLINED = ("gpu_zarr.errors.UnsupportedArrayError", "gpu_zarr.errors.BackendUnavailable",
            "gpu_zarr.errors.GPUUnavailable")
#: OME cases whose metadata points outside the store or is broken: data from them is an escape
OME_MUST_FAIL = set(fs.OME_META) - {"ome-axes-wrong"}
#: cases whose dtype holds Python objects: refused before anything is decoded
OBJECT_CASES = {n for n in fs.META if n.startswith(("object-", "pickle-"))}


#: damages after which no reader may return data, whatever zarr-python does: a chunk shorter
#: than its own header says (c-blosc copies a truncated memcpyed chunk past the end of its
#: buffer and returns what lies beyond), empty, or of the wrong size for an uncompressed array
_TRUNCATIONS = ("trunc-half", "trunc-1", "trunc-last", "empty")


def must_fail(case: fs.Case) -> bool:
    if case.kind != "damage":
        return False
    how = fs._damage_of(case)
    if case.inner is not None:
        return how.startswith(("index-", "shard-")) and how != "index-overlap"
    if case.codec == "raw":
        return how in (*_TRUNCATIONS, "extra", "bigger", "smaller")
    return how in _TRUNCATIONS


def _needs_inner(case: fs.Case) -> bool:
    """Damages that concern one inner chunk of a shard: the message names its position."""
    return case.inner is not None and fs._damage_of(case).startswith(("inner-", "index-size", "index-offset",
                                                                       "index-overlap"))


def verdict(case: fs.Case, ome: bool, got: dict[str, Any], ref: dict[str, Any]) -> str:
    """"equal", "clear", "declined", or a failure ("garbage: ...", "unclear: ...")."""
    if got["kind"] == "declined":
        return "declined"
    if got["kind"] == "data":
        if case.name in OBJECT_CASES:
            return f"garbage: data of an object-dtype store returned ({got['dtype']})"
        if ome and case.name in OME_MUST_FAIL:
            return "garbage: data returned from broken / outside-the-store OME metadata"
        if must_fail(case):
            return "garbage: data returned from a truncated, empty or wrong-size chunk"
        return _data_verdict(got, ref)
    v = _error_verdict(case.name, case.chunk_key, got)
    if v == "clear" and "gpu_zarr.errors.CorruptChunkError" in got["mro"] and case.chunk_key and \
            _needs_inner(case) and f"inner chunk {case.inner}" not in got["msg"]:
        return f"unclear: CorruptChunkError does not name the inner chunk {case.inner}: {got['msg'][:300]}"
    return v


def _data_verdict(got: dict[str, Any], ref: dict[str, Any]) -> str:
    """Data where data may come: "equal" to zarr's read, or garbage."""
    if ref["kind"] != "data":
        return f"garbage: data returned where zarr raises {ref['type']}: {ref['msg'][:200]}"
    same = all(got[k] == ref[k] for k in ("shape", "dtype", "sha"))
    return "equal" if same else f"garbage: data unlike zarr's ({got['shape']} {got['dtype']} vs " \
                                f"{ref['shape']} {ref['dtype']}, values differ: {got['sha'] != ref['sha']})"


def _error_verdict(name: str, chunk_key: str | None, got: dict[str, Any]) -> str:
    """An error: "declined", "clear" (a gpu_zarr error naming the store, and the chunk where one
    is corrupt), or "unclear: ..."."""
    mro, msg = got["mro"], got["msg"]
    if any(d in mro for d in DECLINED):
        return "declined"
    if "gpu_zarr.errors.GpuZarrError" not in mro:
        return f"unclear: {got['type']} is not a gpu_zarr error: {msg[:300]}"
    if name not in msg:
        return f"unclear: {got['type']} does not name the store: {msg[:300]}"
    if "gpu_zarr.errors.CorruptChunkError" in mro and chunk_key and chunk_key not in msg:
        return f"unclear: CorruptChunkError does not name the chunk {chunk_key}: {msg[:300]}"
    return "clear"


# -- known failures in files the lead owns ----------------------------------------------------
#: (entry, case) -> reason; these are strict xfails: the lead removes each with its fix
_ZSTD_BODY = ("a flipped bit inside a zstd compressed block (its literals header or entropy-coded body; zarr writes "
              "no frame checksum) that nvCOMP 6.0 decodes to the right size with status OK, where libzstd finds the "
              "block inconsistent; the frame and block headers, all the walk reads, check out. A full decode sees "
              "it (measured on the H200, 2026-12-02)")
KNOWN: dict[tuple[str, str], str] = {
    ("engine-gpu", name): _ZSTD_BODY
    for name in ("v2-zstd-flip-body", "v3-zstd-flip-body", "v2-zstd-flip-header12", "v3-zstd-flip-header12",
                 "v2-blosc-zstd-0-flip-body", "v3-blosc-zstd-0-flip-body", "v3-sharded-zstd-inner-flip")
}


def _params(gpu: bool) -> list[Any]:
    out = []
    for entry, (_, _, ome, needs_gpu) in ENTRIES.items():
        if needs_gpu != gpu:
            continue
        for case in CASES:
            marks = [pytest.mark.gpu] if gpu else []
            if (entry, case.name) in KNOWN:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN[(entry, case.name)]))
            out.append(pytest.param(entry, case.name, marks=marks, id=f"{entry}::{case.name}"))
    return out


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, str]]]:
    base = tmp_path_factory.mktemp("fuzz")
    fs.build(base)
    return base, {c.name: fs.digest(c.root(base)) for c in CASES}


_refs: dict[tuple[str, bool], dict[str, Any]] = {}


def check(entry: str, name: str, corpus: tuple[Path, dict[str, dict[str, str]]]) -> str:
    base, digests = corpus
    case = BY_NAME[name]
    _, region, ome, gpu = ENTRIES[entry]
    if entry.startswith("dask-"):
        pytest.importorskip("dask", reason="the dask entries need dask: pip install -e '.[dask]'")
    key = (name, region)
    if key not in _refs:
        _refs[key] = reference(case, base, region)
    if case.hostile_shape:
        got = _from_child(outcomes_child(case, base, gpu), entry, case)
    elif gpu and may_fault(entry, case):
        got = _from_child(outcomes_child(case, base, gpu, only=entry), entry, case)
    else:
        got = outcome_bounded(entry, case, base)
    after = fs.digest(case.root(base))
    assert after == digests[name], f"CHANGED STORE: {entry} altered {name}"
    v = verdict(case, ome, got, _refs[key])
    assert not v.startswith(("garbage", "unclear")), f"{entry} on {name}: {v}"
    return v


@pytest.mark.parametrize(("entry", "name"), _params(gpu=False))
def test_fuzz_cpu(entry: str, name: str, corpus: tuple[Path, dict[str, dict[str, str]]]) -> None:
    check(entry, name, corpus)


@pytest.mark.parametrize(("entry", "name"), _params(gpu=True))
def test_fuzz_gpu(entry: str, name: str, corpus: tuple[Path, dict[str, dict[str, str]]]) -> None:
    check(entry, name, corpus)


# -- the CLI, in a subprocess -----------------------------------------------------------------
CLI_TIMEOUT_S = 60.0
CLI_CASES = [c.name for c in CASES if c.kind == "meta"] + ["v2-zstd", "v3-sharded-zstd", "v2-blosc-zlib-1"] + [
    f"v{f}-{c}-{d}" for f, c, d in [(2, "raw", "trunc-half"), (2, "raw", "bigger"), (2, "zstd", "empty"),
                                    (2, "blosc-lz4-1", "flip-header3"), (2, "zlib", "garbage"),
                                    (3, "gzip", "trunc-1"), (3, "zstd", "smaller"),
                                    (3, "sharded-zstd", "inner-flip"), (3, "sharded-raw", "index-size-huge")]]


#: the CLI with ``--backend auto`` (the GPU where there is one, else the CPU path): a subset
CLI_AUTO_CASES = CLI_CASES[-12:] + ["shape-wrap0-v3", "shape-6tib-v2", "object-pickle-v2", "nonjson-v2",
                                    "codec-unknown-v3", "ome-path-parent", "group-pickle-member"]


def _cli_params() -> list[Any]:
    out = []
    for backend in ("cpu", "auto"):
        for name in CLI_CASES if backend == "cpu" else CLI_AUTO_CASES:
            for ome in (False, True):
                if ome and not name.startswith(("ome-", "group-", "v2-zstd", "object-pickle-v2")):
                    continue  # the OME route of the CLI: the OME cases and a few others
                if backend == "auto" and not ome and name.startswith(("ome-", "group-")):
                    continue  # their arrays are good ones: the OME route is the point
                marks = []
                if not ome and (f"read_zarr-{backend}", name) in KNOWN:
                    marks.append(pytest.mark.xfail(strict=True, reason=KNOWN[(f"read_zarr-{backend}", name)]))
                tag = "" if backend == "cpu" else "auto-"
                out.append(pytest.param(name, ome, backend, marks=marks,
                                        id=f"{tag}{'ome' if ome else 'array'}-{name}"))
    return out


def _has_gpu() -> bool:
    from gpu_zarr import capabilities

    return capabilities.probe().gpu


@pytest.mark.parametrize(("name", "ome", "backend"), _cli_params())
def test_fuzz_cli(name: str, ome: bool, backend: str, corpus: tuple[Path, dict[str, dict[str, str]]]) -> None:
    base, digests = corpus
    case = BY_NAME[name]
    path = case.image(base) if ome else case.array(base)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    # an address-space bound, except where auto may take the GPU (CUDA reserves far more than it uses)
    bound = backend == "cpu" or not _has_gpu()
    limit = f"resource.setrlimit(resource.RLIMIT_AS, ({CHILD_MEMORY}, {CHILD_MEMORY})); " if bound else ""
    code = (f"import resource, sys; {limit}"
            "from gpu_zarr.cli import main; sys.exit(main(sys.argv[1:]))")
    try:
        proc = subprocess.run([sys.executable, "-c", code, "read", str(path), "--backend", backend, "--repeat", "1"],
                              capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"HANG: gpu-zarr read {name} ran past {CLI_TIMEOUT_S:.0f} s")
    assert fs.digest(case.root(base)) == digests[name], f"CHANGED STORE: the CLI altered {name}"
    err = proc.stderr
    assert "Traceback" not in err, f"unclear: gpu-zarr read {name} printed a traceback: {err[-1500:]}"
    assert proc.returncode in (0, 2), f"gpu-zarr read {name} exited {proc.returncode}: {err[-1500:]}"
    if proc.returncode == 2:
        assert name in err, f"unclear: gpu-zarr read {name}'s message does not name the store: {err[-800:]}"
    if proc.returncode == 0:
        ref = reference(case, base, region=False)
        assert ref["kind"] == "data" and not must_fail(case) and name not in OBJECT_CASES and not (
            ome and name in OME_MUST_FAIL), f"garbage: gpu-zarr read {name} succeeded where it must fail ({ref})"


# -- read_zarr_to_gpu (the seed API) without a GPU: a clear "no GPU" error, nothing read ----------
TO_GPU_CPU_CASES = [n for n in CLI_AUTO_CASES if not n.startswith(("ome-", "group-"))] + ["v3-zstd", "shape-zero-v2"]


@pytest.mark.parametrize("name", TO_GPU_CPU_CASES)
def test_fuzz_read_zarr_to_gpu_without_gpu(name: str, corpus: tuple[Path, dict[str, dict[str, str]]]) -> None:
    """On a machine without a GPU, read_zarr_to_gpu on any store (damaged, hostile) says at once
    that it needs a GPU and how to read on the CPU instead; the GPU entries read (``-m gpu``)."""
    if _has_gpu():
        pytest.skip("a GPU is here: the read_zarr_to_gpu-* entries of test_fuzz_gpu cover it")
    base, digests = corpus
    case = BY_NAME[name]
    got = outcome_bounded("read_zarr_to_gpu", case, base, _to_gpu("auto"))
    assert fs.digest(case.root(base)) == digests[name], f"CHANGED STORE: read_zarr_to_gpu altered {name}"
    assert got["kind"] == "error" and "gpu_zarr.errors.GPUUnavailable" in got["mro"], got
    assert "prefer='cpu'" in got["msg"] and "pip install" in got["msg"], got["msg"]


# -- HCS plates: a damaged chunk in a well, hostile well metadata --------------------------------
PLATE_CASES = fs.plate_cases()
PLATE_BY_NAME = {c.name: c for c in PLATE_CASES}


def _plate(backend: str) -> Callable[[fs.PlateCase, Path], Any]:
    def run(case: fs.PlateCase, base: Path) -> Any:
        from gpu_zarr.plate import open_plate

        return open_plate(str(case.root(base))).level(0, backend=backend)[fs.PLATE_REGION]
    return run


def _well(backend: str) -> Callable[[fs.PlateCase, Path], Any]:
    def run(case: fs.PlateCase, base: Path) -> Any:
        from gpu_zarr.plate import open_well

        return open_well(str(case.well(base))).level(0, backend=backend)[...]
    return run


def _napari_plate(case: fs.PlateCase, base: Path) -> Any:
    from gpu_zarr.napari_plugin._reader import napari_get_reader

    path = str(case.root(base))
    fn = napari_get_reader(path)
    if fn is None:
        return None
    data = fn(path)[0][0]  # the first channel's layer: (z, y, x)
    data = data[0] if isinstance(data, list) else data
    return np.asarray(data[fs.PLATE_REGION[1:]])


#: name -> (function, reads the damaged well alone (else the plate's region), needs a GPU)
PLATE_ENTRIES: dict[str, tuple[Callable[[fs.PlateCase, Path], Any], bool, bool]] = {
    "plate-cpu": (_plate("cpu"), False, False),
    "plate-auto": (_plate("auto"), False, False),
    "well-cpu": (_well("cpu"), True, False),
    "napari-plate": (_napari_plate, False, False),
    "plate-kvikio": (_plate("kvikio"), False, True),
    "plate-zarr-gpu": (_plate("zarr-gpu"), False, True),
    "well-kvikio": (_well("kvikio"), True, True),
    "well-zarr-gpu": (_well("zarr-gpu"), True, True),
    "napari-plate-auto-gpu": (_napari_plate, False, True),
}


def plate_reference(case: fs.PlateCase, base: Path, well: bool) -> dict[str, Any]:
    """zarr-python's read of the wells' arrays: the damaged well alone, or the plate image's
    region (a well with hostile metadata filled with 0, as a missing well is)."""
    import zarr

    def run(c: fs.PlateCase, b: Path) -> Any:
        if well:
            return zarr.open_array(str(c.field_array(b, fs.PLATE_BAD_WELL)), mode="r")[...]
        *lead, th, tw = fs.PLATE_SHAPE
        img = np.zeros((*lead, th, tw * len(fs.PLATE_WELLS)), np.uint16)
        for i, w in enumerate(fs.PLATE_WELLS):
            if w == fs.PLATE_BAD_WELL and c.damage.startswith("well-"):
                continue
            img[..., i * tw:(i + 1) * tw] = zarr.open_array(str(c.field_array(b, w)), mode="r")[...]
        return img[fs.PLATE_REGION]
    return outcome(run, case, base)


def plate_verdict(case: fs.PlateCase, well: bool, got: dict[str, Any], ref: dict[str, Any]) -> str:
    if got["kind"] == "declined":
        return "declined"
    if got["kind"] == "data":
        if case.damage == "chunk-trunc" or (well and case.damage.startswith("well-")):
            return f"garbage: data returned from a plate with {case.damage}"
        return _data_verdict(got, ref)
    return _error_verdict(case.name, case.chunk_key, got)


@pytest.fixture(scope="session")
def plate_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, str]]]:
    pytest.importorskip("ome_zarr")
    base = tmp_path_factory.mktemp("fuzz-plates")
    fs.build_plates(base)
    return base, {c.name: fs.digest(c.root(base)) for c in PLATE_CASES}


def _plate_params() -> list[Any]:
    out = []
    for entry, (_, _, gpu) in PLATE_ENTRIES.items():
        for case in PLATE_CASES:
            marks = [pytest.mark.gpu] if gpu else []
            if (entry, case.name) in KNOWN:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN[(entry, case.name)]))
            out.append(pytest.param(entry, case.name, marks=marks, id=f"{entry}::{case.name}"))
    return out


@pytest.mark.parametrize(("entry", "name"), _plate_params())
def test_fuzz_plate(entry: str, name: str, plate_corpus: tuple[Path, dict[str, dict[str, str]]]) -> None:
    base, digests = plate_corpus
    case = PLATE_BY_NAME[name]
    fn, well, _ = PLATE_ENTRIES[entry]
    got = outcome_bounded(entry, case, base, fn)
    assert fs.digest(case.root(base)) == digests[name], f"CHANGED STORE: {entry} altered {name}"
    v = plate_verdict(case, well, got, plate_reference(case, base, well))
    assert not v.startswith(("garbage", "unclear")), f"{entry} on {name}: {v}"


# -- the verdict itself must be able to fail --------------------------------------------------
def test_verdict_catches_garbage_and_unclear() -> None:
    case = BY_NAME["v2-zstd-flip-body"]
    data = {"kind": "data", "shape": [18, 18], "dtype": "uint16", "sha": "a"}
    assert verdict(BY_NAME["v2-zstd-trunc-half"], False, data, data).startswith("garbage")  # zarr or not
    zarr_err = _error(ValueError("bad"))
    assert verdict(case, False, data, zarr_err).startswith("garbage")
    assert verdict(case, False, data, {**data, "sha": "b"}).startswith("garbage")
    assert verdict(case, False, data, data) == "equal"
    assert verdict(case, False, zarr_err, zarr_err).startswith("unclear")
    from gpu_zarr.errors import CorruptChunkError, OutOfHostMemory

    assert verdict(case, False, _error(CorruptChunkError("chunk 1.1 is bad")), zarr_err).startswith("unclear")
    assert verdict(case, False, _error(CorruptChunkError(f"/x/{case.name}/img/0: chunk 0.0")),
                   zarr_err).startswith("unclear")
    assert verdict(case, False, _error(CorruptChunkError(f"/x/{case.name}/img/0: chunk 1.1")), zarr_err) == "clear"
    assert verdict(case, False, _error(MemoryError("Unable to allocate 768 PiB")), zarr_err).startswith("unclear")
    assert verdict(case, False, _error(OutOfHostMemory(f"{case.name} needs 6 TiB")), zarr_err) == "clear"


# -- the fixes themselves, directly ----------------------------------------------------------
def test_sizes_never_wrap() -> None:
    from gpu_zarr.engine.fit import nbytes_of

    assert int(np.prod([2**32, 2**32], dtype=np.int64)) == 0  # what numpy does: the bug
    assert nbytes_of([2**32, 2**32]) == 2**64
    assert nbytes_of([2**62, 3], 2) == 6 * 2**62
    assert nbytes_of([5, -3]) == 0


@pytest.mark.parametrize("name", ["shape-wrap0-v2", "shape-wrap0-v3", "shape-wrapneg-v3", "shape-big-v3"])
def test_overflowing_shape_refused_in_milliseconds(name: str, corpus: tuple[Path, dict[str, dict[str, str]]]) -> None:
    import time

    from gpu_zarr.engine import read as engine_read
    from gpu_zarr.errors import OutOfHostMemory

    path = BY_NAME[name].array(corpus[0])
    t = time.perf_counter()
    with pytest.raises(OutOfHostMemory, match=name):
        engine_read(str(path), device="cpu")
    assert time.perf_counter() - t < 1.0


def test_pickle_refused_before_zarr_parses(corpus: tuple[Path, dict[str, dict[str, str]]]) -> None:
    from gpu_zarr.errors import UnsafeArrayError
    from gpu_zarr.store import check_safe, open_node

    base = corpus[0]
    for name in ("object-pickle-v2", "pickle-filter-u2-v2", "object-vlen-v2"):
        with pytest.raises(UnsafeArrayError, match=name):
            check_safe(BY_NAME[name].array(base))
        with pytest.raises(UnsafeArrayError, match=name):
            open_node(BY_NAME[name].array(base))
    check_safe(BY_NAME["v2-zstd"].array(base))  # a numeric array passes


# -- child process: one entry point on one case, its outcome as one JSON line -----------------
def _child(entry: str, name: str, base: str) -> None:
    import resource

    if not any(ENTRIES[e][3] for e in entry.split(",") if e in ENTRIES):
        # an address-space bound: an allocation past it fails at once instead of swapping. (Not
        # for GPU entries: CUDA reserves far more address space than it uses; the wall clock bounds those.)
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))
    case = BY_NAME[name]
    for e in entry.split(","):
        if e.startswith("zarr-"):
            region = e == "zarr-region"
            out = outcome(lambda c, b, r=region: _zarr_ref(c, b, r), case, Path(base))
        else:
            out = outcome(ENTRIES[e][0], case, Path(base))
        print(json.dumps({"entry": e, **out}), flush=True)


if __name__ == "__main__":
    _child(*sys.argv[1:4])
