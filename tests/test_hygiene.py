"""Importing gpu_zarr imports no GPU or GUI library, and works with them all blocked."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_import_with_gpu_and_gui_blocked(tmp_path):
    code = textwrap.dedent(f"""
        import sys, importlib.abc
        BLOCK = ("cupy", "cupyx", "kvikio", "nvidia", "napari", "qtpy", "PyQt5", "PyQt6", "PySide2",
                 "PySide6", "magicgui", "vispy")
        class Blocker(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCK:
                    raise ImportError(f"blocked {{name}}")
        sys.meta_path.insert(0, Blocker())
        import gpu_zarr, gpu_zarr.zarr_io, gpu_zarr.engine, gpu_zarr.omezarr, gpu_zarr.nvcomp_zstd
        import gpu_zarr.kvikio_zarr, gpu_zarr.capabilities, gpu_zarr.cli, gpu_zarr.lazy, gpu_zarr.sample
        import gpu_zarr.bench, gpu_zarr.bench.cli, gpu_zarr.bench.readers, gpu_zarr.bench.report
        from gpu_zarr.errors import GPUUnavailable
        caps = gpu_zarr.probe()
        assert not caps.gpu and not caps.kvikio and not caps.nvcomp, caps
        assert gpu_zarr.nvcomp_zstd.register_nvcomp_zstd() is False
        path = gpu_zarr.sample.write_sample_omezarr({str(tmp_path / 's.ome.zarr')!r})
        arr, res = gpu_zarr.read_omezarr(path, level=0)
        r = gpu_zarr.read_zarr(arr)
        assert r.backend == "cpu" and r.data.shape == arr.shape
        try:
            gpu_zarr.read_zarr_to_gpu(arr.store.root / arr.path)
        except GPUUnavailable as e:
            assert "pip install" in str(e)
        else:
            raise AssertionError("no error")
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCK)
        assert not loaded, loaded
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout


def test_plain_import_is_light():
    code = "import sys, gpu_zarr; bad=[m for m in ('cupy','kvikio','napari','qtpy','zarr') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
