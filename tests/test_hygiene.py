"""Importing gpu_zarr imports no GPU or GUI library, and works with them all blocked."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_import_with_gpu_and_gui_blocked(tmp_path):
    code = textwrap.dedent(f"""
        import sys, importlib.abc
        BLOCK = ("cupy", "cupyx", "kvikio", "nvidia", "napari", "qtpy", "PyQt5", "PyQt6", "PySide2",
                 "PySide6", "magicgui", "vispy", "dask", "distributed", "dask_cuda", "ipywidgets", "IPython",
                 "tqdm")
        class Blocker(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCK:
                    raise ImportError(f"blocked {{name}}")
        sys.meta_path.insert(0, Blocker())
        import gpu_zarr, gpu_zarr.zarr_io, gpu_zarr.engine, gpu_zarr.omezarr, gpu_zarr.nvcomp_zstd
        import gpu_zarr.kvikio_zarr, gpu_zarr.capabilities, gpu_zarr.cli, gpu_zarr.lazy, gpu_zarr.sample
        import gpu_zarr.engine.nvcomp_batch, gpu_zarr.engine.codecs.deflate, gpu_zarr.engine.decode
        import gpu_zarr.bench, gpu_zarr.bench.cli, gpu_zarr.bench.readers, gpu_zarr.bench.report
        import gpu_zarr.dask_array
        import gpu_zarr.engine.codecs.blosc, gpu_zarr.engine.codecs.shuffle
        import gpu_zarr.controller, gpu_zarr.reprs, gpu_zarr.progress, gpu_zarr.jupyter
        try:
            gpu_zarr.jupyter.LoaderWidget
        except ImportError as e:
            assert gpu_zarr.errors.install_hint("jupyter") in str(e), e
        else:
            raise AssertionError("no error without ipywidgets")
        from gpu_zarr.errors import GPUUnavailable
        caps = gpu_zarr.probe()
        assert not caps.gpu and not caps.kvikio and not caps.nvcomp, caps
        assert gpu_zarr.nvcomp_zstd.register_nvcomp_zstd() is False
        path = gpu_zarr.sample.write_sample_omezarr({str(tmp_path / 's.ome.zarr')!r})
        arr, res = gpu_zarr.read_omezarr(path, level=0)
        r = gpu_zarr.read_zarr(arr)
        assert r.backend == "cpu" and r.data.shape == arr.shape
        assert "cpu" in r._repr_html_() and "GPU" in caps._repr_html_()
        assert "zstd" in gpu_zarr.omezarr.open_ome(path)._repr_html_()
        try:
            gpu_zarr.read_zarr_to_gpu(arr.store.root / arr.path)
        except GPUUnavailable as e:
            assert "pip install" in str(e)
        else:
            raise AssertionError("no error")
        try:
            gpu_zarr.to_dask(path)
        except ImportError as e:
            assert gpu_zarr.errors.install_hint("dask") in str(e), e
        else:
            raise AssertionError("to_dask without dask: no error")
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCK)
        assert not loaded, loaded
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout


def test_plain_import_is_light():
    code = ("import sys, gpu_zarr; bad=[m for m in ('cupy','kvikio','napari','qtpy','zarr','dask','ipywidgets',"
            "'tqdm','IPython') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# --- the import graph: data flows one way -------------------------------------------------

import ast  # noqa: E402
from pathlib import Path  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src" / "gpu_zarr"


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """Every gpu_zarr module -> the gpu_zarr modules it imports: at the top, inside functions and
    in ``if TYPE_CHECKING:`` blocks alike (an annotation-only import still ties the two modules)."""
    mods = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        deps: set[str] = set()
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == \
                    "import_module" and node.args and isinstance(node.args[0], ast.Constant):
                targets = [str(node.args[0].value)]  # importlib.import_module("gpu_zarr....") hides an import
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and t.startswith("gpu_zarr"):
                    deps.add(t)
        graph[name] = deps
    return graph


def test_no_import_cycles():
    graph = _imports()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if d == "gpu_zarr":  # the package's lazy __getattr__ front door
                continue
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d] if d in stack else [m, d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_engine_imports_nothing_above_it():
    above = {"gpu_zarr.zarr_io", "gpu_zarr.lazy", "gpu_zarr.cli", "gpu_zarr.omezarr", "gpu_zarr.kvikio_zarr",
             "gpu_zarr.napari_plugin", "gpu_zarr.capabilities", "gpu_zarr.nvcomp_zstd"}
    bad = {m: sorted(d for d in deps if any(d == a or d.startswith(a + ".") for a in above))
           for m, deps in _imports().items() if m.startswith("gpu_zarr.engine")}
    assert {m: d for m, d in bad.items() if d} == {}


def test_no_module_imports_another_modules_private_names():
    bad = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("gpu_zarr", ".")) or (
                    isinstance(node, ast.ImportFrom) and node.level):
                bad += [f"{path.name}: {a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert bad == []


# --- every exception class lives in errors.py ---------------------------------------------

import builtins  # noqa: E402

ROOT = SRC.parents[1]
_BUILTIN_EXCEPTIONS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}


def _exception_classes(tree: ast.AST, known: set[str]) -> list[ast.ClassDef]:
    """The classes of a module that derive from an exception: a builtin one, one of ``known``
    (gpu_zarr.errors' classes), one of this module's own, or any ``...Error`` / ``...Exception``
    name (zarr's, numcodecs', obstore's)."""
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    names = set(known) | _BUILTIN_EXCEPTIONS
    found: dict[str, ast.ClassDef] = {}
    changed = True
    while changed:
        changed = False
        for c in classes:
            if c.name in found:
                continue
            for b in c.bases:
                base = b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                if base in names or base.endswith(("Error", "Exception", "Warning")):
                    found[c.name] = c
                    names.add(c.name)
                    changed = True
                    break
    return list(found.values())


def test_every_exception_class_is_in_errors():
    """Public exception classes live in gpu_zarr/errors.py (other modules re-export them); src
    defines no other exception class at all, private or not. Tests and benchmarks may define
    private (``_``-prefixed) test doubles."""
    errors_py = SRC / "errors.py"
    known = {c.name for c in _exception_classes(ast.parse(errors_py.read_text()), set())}
    assert {"GpuZarrError", "RemoteError", "RemoteUnavailable", "GuiUnavailable"} <= known
    bad = []
    for folder in ("src", "tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == errors_py:
                continue
            for c in _exception_classes(ast.parse(path.read_text()), known):
                if folder == "src" or not c.name.startswith("_"):
                    bad.append(f"{path.relative_to(ROOT)}:{c.lineno} {c.name}")
    assert bad == [], "exception classes outside gpu_zarr/errors.py: " + ", ".join(bad)


def test_moved_exceptions_importable_from_their_old_modules():
    from gpu_zarr import cli, errors, location
    from gpu_zarr.napari_plugin import notebook

    assert location.RemoteError is errors.RemoteError and location.RemoteUnavailable is errors.RemoteUnavailable
    assert notebook.GuiUnavailable is errors.GuiUnavailable and cli.UsageError is errors.UsageError
    for cls in (errors.RemoteError, errors.RemoteUnavailable, errors.GuiUnavailable, errors.UsageError,
                errors.ShortAnswer, errors.ShardChanged):
        assert issubclass(cls, errors.GpuZarrError), cls
    assert issubclass(errors.RemoteError, OSError) and issubclass(errors.RemoteUnavailable, ImportError)
    assert issubclass(errors.GuiUnavailable, RuntimeError)


# --- no module-level state: the runtime owns what lives across reads ----------------------

import dataclasses  # noqa: E402
import enum  # noqa: E402
import functools  # noqa: E402
import importlib  # noqa: E402
import types  # noqa: E402
import typing  # noqa: E402

#: modules whose module-level names must hold no mutable state (the engine, and the location
#: of stores, whose caches and store registry belong to the runtime)
_STATELESS = ("gpu_zarr.engine", "gpu_zarr.location")

#: the only module-level state allowed there, each with why
_STATE_ALLOWED = {
    # the GPU fault flag: process-wide on purpose, as the CUDA context it describes is
    "gpu_zarr.engine.runtime._fault", "gpu_zarr.engine.runtime._fault_lock",
    # the default runtime that user-facing entry points fall back to (get_runtime)
    "gpu_zarr.engine.runtime._current", "gpu_zarr.engine.runtime._current_lock",
    # the codec registry: an extension point (as zarr's codec registry), configured once, copied
    # on write; no read's state
    "gpu_zarr.engine.codecs._STAGES", "gpu_zarr.engine.codecs._lock",
    # the native HTTP client's callback trampoline: per thread, the native calls under way on it
    # (pushed and popped around each call; empty between calls)
    "gpu_zarr.engine.sources.http._local",
    # functools caches of pure probes and conversions (the machine's libraries, a kernel's
    # source compiled, header lines as a C array): the same answer every time
    "gpu_zarr.engine.native._load", "gpu_zarr.engine.sources.http._lib", "gpu_zarr.engine.sources.http._headers",
    "gpu_zarr.engine.decode._cpu_decoder", "gpu_zarr.engine.place._module",
    # our read-only zarr ObjectStore class, made once on first use (zarr is imported then, not
    # with gpu_zarr.location); its instances keep the runtime they were made with
    "gpu_zarr.location._retrying_store_class",
}

_IMMUTABLE_TYPES = (int, float, complex, str, bytes, bool, type(None), range, slice, types.FunctionType,
                    types.BuiltinFunctionType, type, types.ModuleType, typing.TypeVar, types.GenericAlias,
                    types.UnionType, enum.Enum)


def _is_immutable(v: object, depth: int = 0) -> bool:
    """``v`` holds no state that can change: numbers, strings, tuples and frozensets of such,
    read-only mappings of such, dtypes, frozen dataclasses and stateless objects of the package
    (every attribute immutable), sentinels (``object()``), functions (not caches)."""
    import ctypes

    import numpy as np

    if depth > 6:
        return False
    if isinstance(v, functools._lru_cache_wrapper):  # a cache: state, unless allowed by name
        return False
    if isinstance(v, _IMMUTABLE_TYPES) or type(v) is object or isinstance(v, (np.dtype, np.generic)):
        return True
    if isinstance(v, ctypes._CFuncPtr):  # type: ignore[attr-defined]  # a C callback (a function)
        return True
    if isinstance(v, typing.TypeAliasType if hasattr(typing, "TypeAliasType") else ()):
        return True
    if isinstance(v, (tuple, frozenset)):
        return all(_is_immutable(x, depth + 1) for x in v)
    if isinstance(v, types.MappingProxyType):
        return all(_is_immutable(k, depth + 1) and _is_immutable(x, depth + 1) for k, x in v.items())
    if type(v).__module__.startswith("gpu_zarr."):
        if dataclasses.is_dataclass(v) and type(v).__dataclass_params__.frozen:  # type: ignore[attr-defined]
            return all(_is_immutable(getattr(v, f.name), depth + 1) for f in dataclasses.fields(v))
        attrs = dict(getattr(v, "__dict__", {}))
        attrs.update({s: getattr(v, s) for s in getattr(type(v), "__slots__", ()) if hasattr(v, s)})
        return all(_is_immutable(x, depth + 1) for x in attrs.values())
    return False


def _module_bindings(path: Path) -> tuple[set[str], set[str]]:
    """(names bound at a module's top level, names rebound from inside its functions by ``global``)."""
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and (not isinstance(node, ast.AnnAssign)
                                                                   or node.value is not None):
            targets = [node.target]
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    top.add(n.id)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.decorator_list:
            top.add(node.name)  # a decorated function: maybe a cache
    rebound = {name for n in ast.walk(tree) if isinstance(n, ast.Global) for name in n.names}
    return top, rebound


def _module_state() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        name = _module_name(path)
        if not any(name == m or name.startswith(m + ".") for m in _STATELESS):
            continue
        top, rebound = _module_bindings(path)
        mod = importlib.import_module(name)
        for var in sorted(top | rebound):
            full = f"{name}.{var}"
            if full in _STATE_ALLOWED or var in ("__all__", "__getattr__"):
                continue
            if var in rebound:
                found.append(f"{full} (rebound by `global`)")
            elif not _is_immutable(getattr(mod, var, None)):
                found.append(f"{full} ({type(getattr(mod, var, None)).__name__})")
    return found


def test_no_module_level_state():
    """The runtime (:class:`gpu_zarr.engine.runtime.Runtime`) is the one owner of what lives
    across reads, passed explicitly: no module of the engine, nor ``gpu_zarr.location``, binds a
    mutable object at its top level (a dict, list or set, a lock, a cache, an object of ours
    with state) or rebinds one with ``global``, beyond the commented allowlist above."""
    assert _module_state() == []


def test_module_state_check_catches_state(tmp_path, monkeypatch):
    """The check above sees what it is for: a dict, a lock, an object with state, a cache."""
    import threading

    class _Holder:
        def __init__(self) -> None:
            self.d: dict[str, int] = {}

    _Holder.__module__ = "gpu_zarr.fake"

    @functools.cache
    def probe() -> int:
        return 1

    for bad in ({}, [], set(), threading.Lock(), _Holder(), probe, (1, []), types.SimpleNamespace()):
        assert not _is_immutable(bad), bad
    for good in (1, "a", (1, "b"), frozenset({2}), types.MappingProxyType({"a": 1}), object(), None):
        assert _is_immutable(good), good


def test_nothing_set_on_other_objects():
    """The engine and ``gpu_zarr.location`` set no attribute on an object by name (``setattr``)
    other than their own (``self``): nothing is hung on other libraries' objects (a zarr store)."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        name = _module_name(path)
        if not any(name == m or name.startswith(m + ".") for m in _STATELESS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr" and not (
                    node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "self"):
                bad.append(f"{name}:{node.lineno}")
    assert bad == []


#: the longest a function (or a method, or a class a function makes) may be, counted in lines
#: from its ``def`` to its last line, docstring included
MAX_FUNCTION_LINES = 80


def _long_functions(root: Path) -> list[str]:
    long = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({n} lines)")
    return long


def test_no_function_is_longer_than_80_lines():
    assert _long_functions(SRC) == []


def test_long_function_check_finds_one(tmp_path):
    body = "\n".join(f"    x{k} = {k}" for k in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}\n")
    found = _long_functions(tmp_path)
    assert len(found) == 1 and "long (81 lines)" in found[0]


# --- every GPU_ZARR_* variable is read in settings.py --------------------------------------

#: the one module that reads our environment variables (each a setting: see its table)
_SETTINGS_PY = SRC / "settings.py"


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ``."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def _our_variable(node: ast.AST | None, constants: dict[str, str]) -> bool:
    """``node`` names a GPU_ZARR_* variable: a string, an f-string or a module constant holding one."""
    if isinstance(node, ast.Name):
        return constants.get(node.id, "").startswith("GPU_ZARR_")
    return node is not None and any(isinstance(n, ast.Constant) and isinstance(n.value, str)
                                    and n.value.startswith("GPU_ZARR_") for n in ast.walk(node))


def _environment_reads(root: Path, skip: Path | None = None) -> list[str]:
    """Where a module under ``root`` (but ``skip``) reads a GPU_ZARR_* environment variable:
    ``os.environ.get/setdefault/pop(...)``, ``os.environ[...]``, ``... in os.environ``,
    ``os.getenv(...)``; other variables (XDG_CACHE_HOME, DISPLAY) are not ours to move."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == skip:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                     for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            key: ast.AST | None = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                if _is_environ(node.func.value) or node.func.attr == "getenv":
                    key = node.args[0]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getenv":
                key = node.args[0] if node.args else None
            elif isinstance(node, ast.Subscript) and _is_environ(node.value):
                key = node.slice
            elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
                key = node.left
            if _our_variable(key, constants):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_only_settings_reads_our_environment_variables():
    """Every GPU_ZARR_* knob is a setting (``gpu_zarr.settings``: a default, its variable read at
    import, a check, ``settings.get/set``, a row in its table); no other module reads one."""
    assert _environment_reads(SRC, skip=_SETTINGS_PY) == []
    assert _environment_reads(SRC) != []  # (settings.py itself reads them: the scan sees reads)


def test_environment_read_check_finds_them(tmp_path):
    (tmp_path / "m.py").write_text(
        'import os\nfrom os import environ, getenv\nVAR = "GPU_ZARR_X"\n'
        'a = os.environ.get("GPU_ZARR_A", "1")\nb = os.environ["GPU_ZARR_B"]\nc = os.getenv(VAR)\n'
        'd = "GPU_ZARR_D" in os.environ\ne = getenv(f"GPU_ZARR_{a}")\nf = environ.setdefault("GPU_ZARR_F", "")\n'
        'ok = os.environ.get("XDG_CACHE_HOME"), os.environ["DISPLAY"], "HOME" in os.environ\n')
    found = _environment_reads(tmp_path)
    assert [f.rpartition(":")[2] for f in found] == ["4", "5", "6", "7", "8", "9"], found
