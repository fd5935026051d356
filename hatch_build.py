"""Hatch build hook: compile the native host library (``src/gpu_zarr/engine/native``).

Runs for wheels and editable installs. It calls the system C compiler (``$CC`` or ``cc``)
with no headers beyond libc's (the codec libraries are loaded at run time with dlopen).
A failed compile is a warning, never a failed install: the package then runs its
pure-Python host path, and ``gpu-zarr info`` says why.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SRC = Path("src/gpu_zarr/engine/native/gz_native.c")
SOURCES = (SRC, SRC.with_name("gz_http.c"), SRC.with_name("gz_write.c"))  # one library: host codecs and reads,
# the HTTP client, and the writer's file output
LIB = "libgz_native.so"


def compile_native(root: Path, out: Path) -> str | None:
    """Compile the library to ``out``; return None, or why it could not be built."""
    if os.environ.get("GPU_ZARR_BUILD_NATIVE", "1") == "0":
        return "GPU_ZARR_BUILD_NATIVE=0"
    if not sys.platform.startswith("linux"):
        return f"the native library is built on Linux only (this is {sys.platform})"
    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not cc or shutil.which(cc[0]) is None:
        cc = ["cc"]
        if shutil.which("cc") is None:
            return "no C compiler (cc) on PATH"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".so.tmp")
    cmd = [*cc, "-O3", "-shared", "-fPIC", "-pthread", "-fvisibility=hidden", *(str(root / f) for f in SOURCES), "-o",
           str(tmp), "-ldl"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{' '.join(cmd)}: {exc}"
    if res.returncode != 0:
        return f"{' '.join(cmd)} failed:\n{res.stderr.strip()}"
    os.replace(tmp, out)
    return None


class NativeBuildHook(BuildHookInterface):
    """Builds ``libgz_native.so`` next to ``gpu_zarr/engine/native/__init__.py``."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name not in ("wheel",):
            return
        root = Path(self.root)
        if version == "editable":
            out = root / SRC.parent / LIB  # git-ignored; the editable install imports from src/
            why = compile_native(root, out)
        else:
            out = Path(self.directory) / "native-build" / LIB
            why = compile_native(root, out)
            if why is None:
                build_data["force_include"][str(out)] = "gpu_zarr/engine/native/" + LIB
                build_data["pure_python"] = False
                # no Python C-API (ctypes loads it): one wheel per platform, any Python 3
                plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
                build_data["tag"] = f"py3-none-{plat}"
        if why is not None:
            self.app.display_warning(f"napari-gpu-zarr: the native host library was not built ({why}); "
                                     "the pure-Python host path will run.")
