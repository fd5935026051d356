"""Errors raised by gpu_zarr.

Every message says what was expected, what was found and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "BenchReaderFailed",
    "CorruptChunkError",
    "DestinationExists",
    "GPUUnavailable",
    "GpuZarrError",
    "GuiUnavailable",
    "InvalidOmeMetadata",
    "NativeHttpDeclined",
    "NotAZarrError",
    "NotOmeZarrError",
    "OutOfGPUMemory",
    "OutOfHostMemory",
    "OutOfMemory",
    "ReadCancelled",
    "RemoteError",
    "RemoteUnavailable",
    "ShardChanged",
    "ShortAnswer",
    "UnsafeArrayError",
    "UnsupportedArrayError",
    "UsageError",
    "WriteError",
    "install_hint",
    "hint_shown_above",
]


def _installed_from_checkout() -> str | None:
    """The source folder when gpu_zarr runs from a checkout (editable install or src on the path)."""
    from pathlib import Path

    here = Path(__file__).resolve().parent  # .../src/gpu_zarr
    root = here.parent.parent
    if here.parent.name == "src" and (root / "pyproject.toml").is_file():
        return str(root)
    try:
        import json
        from importlib.metadata import distribution

        raw = distribution("napari-gpu-zarr").read_text("direct_url.json")
        info = json.loads(raw) if raw else {}
        if info.get("dir_info", {}).get("editable"):
            url = str(info.get("url", ""))
            return url.removeprefix("file://") or "."
    except Exception:  # noqa: BLE001 - no metadata: an ordinary install
        pass
    return None


def install_hint(extra: str = "cuda13") -> str:
    """The pip command that installs an extra for how this package is installed.

    From a checkout (editable install, or ``src`` on the path): ``pip install -e ".[extra]"``
    run in the checkout; from a wheel: ``pip install "napari-gpu-zarr[extra]"``. For the CUDA
    extras the CUDA 12 alternative is named too.
    """
    root = _installed_from_checkout()
    cmd = f'pip install -e ".[{extra}]"' if root else f'pip install "napari-gpu-zarr[{extra}]"'
    where = f" in {root}" if root and root != "." else ""
    alt = " ([cuda12] for a CUDA 12 driver)" if extra == "cuda13" else ""
    return f"{cmd}{where}{alt}"


INSTALL_HINT = install_hint()


def hint_shown_above(text: str) -> str:
    """``text`` without the install command, for a line below one that already shows it (a
    widget's header): each later mention says "the install above" instead."""
    return (text.replace("; for GPU reads: " + INSTALL_HINT, "").replace(": " + INSTALL_HINT, "")
            .replace(INSTALL_HINT, "the install above"))


class GpuZarrError(Exception):
    """Base class of the errors gpu_zarr raises on purpose."""


class GPUUnavailable(GpuZarrError, RuntimeError):
    """No usable CUDA GPU (cupy missing, no device, or driver problem)."""


class BackendUnavailable(GpuZarrError, RuntimeError):
    """A forced backend cannot serve this machine or this array."""


class UnsupportedArrayError(BackendUnavailable):
    """The direct engine cannot read this array (codec, order, dtype...); zarr-gpu can."""


class NotAZarrError(GpuZarrError, ValueError):
    """The path is not a zarr array or group."""


class UnsafeArrayError(NotAZarrError):
    """An array gpu_zarr refuses to open: Python-object data, or a codec that runs code (pickle)."""


class CorruptChunkError(GpuZarrError, ValueError):
    """A chunk (or shard) on disk is truncated or corrupt."""


class GPUFault(GpuZarrError, RuntimeError):
    """The GPU faulted during a read (an illegal address in a decoder): CUDA cannot recover the
    process's context, so the GPU stays unusable until Python restarts."""


class OutOfMemory(GpuZarrError, MemoryError):
    """The requested read does not fit in free memory (GPU or host)."""


class OutOfGPUMemory(OutOfMemory):
    """The requested read does not fit in free GPU memory."""


class OutOfHostMemory(OutOfMemory):
    """The requested read does not fit in the host's available memory."""


class NotOmeZarrError(NotAZarrError):
    """The path is a zarr node but carries no OME-NGFF ``multiscales`` metadata."""


class InvalidOmeMetadata(GpuZarrError, ValueError):
    """OME-NGFF metadata is present but malformed or inconsistent with the arrays."""


class ReadCancelled(GpuZarrError):
    """A read was cancelled by its caller (widget's cancel button)."""


class BenchReaderFailed(GpuZarrError):
    """A benchmark reader failed; its error is already written into the reader's record."""


class RemoteUnavailable(GpuZarrError, ImportError):
    """A remote store was asked for and the package that reads it is not installed."""


class RemoteError(GpuZarrError, OSError):
    """A remote store could not be read (refused, not found, forbidden, timed out, or a short
    answer); the message names the URL and what to do. Nothing partial is ever returned."""


class ShortAnswer(RemoteError):
    """A remote answer shorter (or longer) than asked for. Retried; when it persists the read
    raises a :class:`RemoteError` naming the URL."""


class NativeHttpDeclined(RemoteError):
    """An answer the native HTTP client leaves to obstore (a server that answers no byte
    ranges, a body longer than its buffer): obstore serves that store from then on. Never
    reaches the caller."""


class ShardChanged(RemoteError):
    """A ranged answer from a remote shard that changed since its index was fetched. The read
    fetches the indexes again; when the shards keep changing it raises :class:`CorruptChunkError`."""


class GuiUnavailable(GpuZarrError, RuntimeError):
    """napari (Qt and OpenGL) cannot start here: no display, or no usable Qt platform."""


class UsageError(GpuZarrError, ValueError):
    """A command line that cannot be served (the CLI prints one line on stderr, exit status 2)."""


class WriteError(GpuZarrError, OSError):
    """A write could not finish: read-only or full file system, no permission, or a destination
    that is not a zarr. Nothing partial is left where the array was to appear."""


class DestinationExists(WriteError, FileExistsError):
    """The destination of a write already exists and ``overwrite=True`` was not given."""
