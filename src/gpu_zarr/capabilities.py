"""One cached probe of what this machine can do: cupy and a GPU, kvikio, GDS, nvCOMP.

The probe never raises: whatever is missing becomes a note that says how to get it.
Errors, the CLI and the napari widget all read the same :class:`Capabilities`.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_zarr.backends import BACKENDS
from gpu_zarr.errors import INSTALL_HINT

__all__ = ["Capabilities", "probe"]


@dataclass(frozen=True)
class Capabilities:
    """What the machine offers for reading zarr onto a GPU.

    Attributes
    ----------
    cupy : bool
        cupy imports.
    gpu : bool
        cupy sees at least one CUDA device and can talk to it.
    device_name : str or None
        Name of the current CUDA device.
    free_bytes, total_bytes : int or None
        Free and total memory of the current device when probed.
    kvikio : bool
        kvikio imports.
    kvikio_compat : bool or None
        True when kvikio runs in POSIX compatibility mode (no GPUDirect Storage).
    gds_native : bool
        True only when the cuFile driver reports GDS available *and* kvikio is not
        in compat mode: chunks then go NVMe -> GPU by DMA.
    nvcomp : bool
        nvCOMP is usable for GPU decoding: its C library (low-level batched API, what the
        decode stage calls) loaded at a supported version, and ``nvidia.nvcomp`` imports.
    notes : list of str
        Human readable remarks: what is missing and how to install it.
    nvcomp_version : str or None
        Version of the nvCOMP C library (or of its wheel when the library did not load).
    nvcomp_lowlevel : bool
        The low-level batched API of libnvcomp loaded (``gpu_zarr.engine.nvcomp_batch``).
    native : bool
        The native host library (``gpu_zarr.engine.native``: reads, CPU decode and place on
        C threads) is loaded.
    native_summary : str
        Which codecs it decodes here, or why it is not loaded.
    """

    cupy: bool = False
    gpu: bool = False
    device_name: str | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    kvikio: bool = False
    kvikio_compat: bool | None = None
    gds_native: bool = False
    nvcomp: bool = False
    notes: list[str] = field(default_factory=list)
    nvcomp_version: str | None = None
    nvcomp_lowlevel: bool = False
    native: bool = False
    native_summary: str = ""

    def backend_status(self, name: str) -> tuple[bool, str]:
        """Whether backend *name* can run on this machine, and why (not).

        Parameters
        ----------
        name : {"auto", "kvikio", "zarr-gpu", "cpu"}

        Returns
        -------
        (bool, str)
            Availability and a one-line reason.
        """
        if name == "cpu":
            return True, "host memory: the native host path where it reads the array, else zarr-python; always available"
        if name == "auto":
            if self.gpu:
                return True, "picks the fastest GPU path per array"
            return True, "no usable GPU: auto falls back to the CPU path"
        if name not in BACKENDS:
            return False, f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}"
        if not self.cupy:
            return False, f"cupy is not installed: {INSTALL_HINT}"
        if not self.gpu:
            return False, "cupy is installed but no CUDA device is usable" + _first_note(self)
        if name == "zarr-gpu":
            return True, "zarr-python with enable_gpu()" + (
                " and nvCOMP zstd" if self.nvcomp else " (zstd decoded on the CPU: nvCOMP missing)"
            )
        # kvikio: our direct engine. It reads with kvikio when present, otherwise with a
        # pool of threads into pinned memory; codecs whose stage decodes with nvCOMP need it.
        if self.kvikio:
            mode = "GDS native" if self.gds_native else "POSIX compat mode"
            how = f"direct engine, kvikio reads ({mode})"
        else:
            how = "direct engine, threaded reads into pinned memory (kvikio not installed)"
        if not self.nvcomp:
            from gpu_zarr.engine.codecs import stages

            free = [s.name for s in stages() if not s.nvcomp]
            need = [s.name for s in stages() if s.nvcomp]
            how += f"; {', '.join(free)} arrays only: nvCOMP missing for {', '.join(need)}"
        return True, how

    # notebook display (gpu_zarr.reprs)
    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        from gpu_zarr import reprs

        return reprs.bundle(reprs.capabilities_text(self), reprs.capabilities_html(self))

    def _repr_html_(self) -> str:
        from gpu_zarr import reprs

        return reprs.capabilities_html(self)

    def report(self) -> str:
        """A multi-line, human readable summary of the probe."""
        gib = 2**30
        lines = []
        if self.gpu:
            mem = ""
            if self.total_bytes and self.free_bytes is not None:
                mem = f", {self.free_bytes / gib:.1f} of {self.total_bytes / gib:.1f} GiB free"
            lines.append(f"GPU:     {self.device_name}{mem}")
        else:
            lines.append("GPU:     none usable" + ("" if self.cupy else " (cupy not installed)"))
        if self.kvikio:
            mode = "compat (POSIX) mode" if self.kvikio_compat else "native mode"
            lines.append(f"kvikio:  installed, {mode}; GDS native: {'yes' if self.gds_native else 'no'}")
        else:
            lines.append("kvikio:  not installed")
        ver = f" {self.nvcomp_version}" if self.nvcomp_version else ""
        if self.nvcomp:
            lines.append(f"nvCOMP:  {ver.strip()} installed, low-level batched API loaded (GPU zstd/LZ4/deflate decode)")
        else:
            lines.append(f"nvCOMP:  {'installed' + ver + ' but not usable (see notes)' if ver else 'not installed'}")
        if self.native_summary:
            lines.append(f"native:  {self.native_summary}")
        lines.append("backends: " + "; ".join(
            f"{b}: {'yes' if ok else 'no'}" for b in BACKENDS for ok, _ in [self.backend_status(b)]
        ))
        lines.extend(f"note:    {n}" for n in self.notes)
        return "\n".join(lines)


def _first_note(caps: Capabilities) -> str:
    return f" ({caps.notes[0]})" if caps.notes else ""


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=1)
def _probe() -> Capabilities:
    notes: list[str] = []
    cupy_ok = gpu = False
    name = free = total = None
    if _has_module("cupy"):
        try:
            import cupy

            cupy_ok = True
            if cupy.cuda.runtime.getDeviceCount() > 0:
                dev = cupy.cuda.Device()
                props = cupy.cuda.runtime.getDeviceProperties(dev.id)
                name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
                free, total = (int(v) for v in cupy.cuda.runtime.memGetInfo())
                gpu = True
        except Exception as exc:  # driver missing, no device, broken install
            notes.append(f"cupy could not use a GPU: {type(exc).__name__}: {exc}")
    else:
        notes.append(f"cupy is not installed; for GPU reads: {INSTALL_HINT}")

    kvikio_ok = _has_module("kvikio")
    compat: bool | None = None
    gds = False
    if kvikio_ok and gpu:
        try:
            import kvikio
            import kvikio.defaults

            compat = bool(_kvikio_compat(kvikio))
            gds = (not compat) and _gds_available()
        except Exception as exc:
            notes.append(f"kvikio did not load: {type(exc).__name__}: {exc}")
            kvikio_ok = False
    elif not kvikio_ok:
        notes.append("kvikio is not installed: the direct engine uses its own threaded reads")

    nvcomp_ok = False
    if _has_module("nvidia.nvcomp"):
        try:
            import nvidia.nvcomp  # noqa: F401

            nvcomp_ok = True
        except Exception as exc:
            notes.append(f"nvCOMP did not load: {type(exc).__name__}: {exc}")
    else:
        notes.append("nvCOMP is not installed: zstd chunks are decoded on the CPU")
    from gpu_zarr.engine.nvcomp_batch import nvcomp_info

    low = nvcomp_info()
    if nvcomp_ok and not low["low_level"]:
        notes.append(f"nvCOMP's C library is not usable, so compressed chunks are decoded on the CPU: {low['error']}")
    import gpu_zarr.engine.native as native
    import gpu_zarr.engine.sources.http as native_http

    nat = native.status()
    return Capabilities(cupy_ok, gpu, name, free, total, kvikio_ok, compat, gds, nvcomp_ok and bool(low["low_level"]),
                        notes, low["version"], bool(low["low_level"]), nat.loaded,
                        "host path " + nat.summary() + "; http(s) stores: " + native_http.status())


def _kvikio_compat(kvikio: Any) -> bool:
    d = kvikio.defaults
    for attr in ("is_compat_mode_preferred", "compat_mode"):
        fn = getattr(d, attr, None)
        if fn is not None:
            val = fn()
            return bool(val) if not hasattr(val, "name") else val.name != "OFF"
    return True


def _gds_available() -> bool:
    """cuFile driver's own answer, not kvikio's compat setting."""
    try:
        from kvikio import cufile_driver

        fn = getattr(cufile_driver, "is_gds_available", None)
        if fn is not None:
            return bool(fn())
        props = getattr(cufile_driver, "properties", None)
        return bool(props and getattr(props, "is_gds_available", False))
    except Exception:
        return False


def probe(refresh: bool = False) -> Capabilities:
    """Probe the machine once (cached) and return its :class:`Capabilities`.

    Parameters
    ----------
    refresh : bool
        Probe again (free memory changes; a test may block imports).

    Notes
    -----
    Importing this module imports no GPU library; :func:`probe` imports cupy, kvikio and
    nvCOMP only if they are installed, and never raises.
    """
    if refresh:
        _probe.cache_clear()
    caps = _probe()
    from gpu_zarr.engine.runtime import gpu_fault

    fault = gpu_fault()
    if fault and caps.gpu:
        note = (f"the GPU faulted earlier in this process ({fault}); CUDA cannot recover a context after "
                "a fault, so the GPU is unusable until Python restarts")
        caps = replace(caps, gpu=False, notes=[note, *caps.notes])
    return caps
