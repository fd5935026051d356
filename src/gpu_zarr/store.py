"""Opening zarr stores read-only, with errors that say what was found.

The one place that turns a user's path into a zarr array or group: every other module
(backend choice, the engine, OME-Zarr, the CLI) opens through here, so a wrong path gets
the same helpful message everywhere. Nothing here writes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpu_zarr.errors import NotAZarrError

__all__ = ["METADATA_FILES", "is_zarr_node", "open_array", "open_node"]

METADATA_FILES = ("zarr.json", ".zarray", ".zgroup", ".zattrs")


def is_zarr_node(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a local folder holding zarr v2 or v3 metadata (never raises)."""
    try:
        p = Path(path)
        return p.is_dir() and any((p / f).is_file() for f in METADATA_FILES)
    except (OSError, ValueError, TypeError):
        return False


def _found(p: str) -> str:
    if "://" in p or not os.path.isdir(p):
        return ""
    names = sorted(os.listdir(p))[:8]
    return f"; the folder holds {names}" if names else "; the folder is empty"


def open_node(path: str | os.PathLike[str]) -> Any:
    """Open a zarr group or array read-only.

    Raises
    ------
    NotAZarrError
        Nothing exists at ``path``, or it cannot be opened as zarr (the message lists
        what the folder holds).
    """
    import zarr

    p = os.fspath(path)
    if "://" not in p and not os.path.exists(p):
        raise NotAZarrError(f"{p} does not exist: nothing exists there. Expected a zarr array or group (a folder holding "
                            "zarr.json, .zarray or .zgroup).")
    if "://" not in p and os.path.isfile(p):
        raise NotAZarrError(f"expected a zarr group or array at {p} (a folder with zarr.json, .zgroup or "
                            ".zarray), found a file. Pass the folder that holds it.")
    try:
        return zarr.open(p, mode="r")
    except Exception as exc:  # noqa: BLE001 - re-raised with context
        raise NotAZarrError(
            f"expected a zarr group or array at {p} (a folder with zarr.json, .zgroup or "
            f".zarray), but it could not be opened as one: {type(exc).__name__}: {exc}{_found(p)}"
        ) from exc


def open_array(path_or_array: Any) -> Any:
    """Open a zarr array read-only (a ``zarr.Array`` is returned as it is).

    Raises
    ------
    NotAZarrError
        The path does not exist, is not zarr, or is a group (the message lists the arrays
        inside it and points to the OME-Zarr reader).
    """
    import zarr

    if not isinstance(path_or_array, (str, os.PathLike)):
        if isinstance(path_or_array, zarr.Array):
            return path_or_array
        raise TypeError(f"expected a path or a zarr.Array, got {type(path_or_array).__name__}")
    p = os.fspath(path_or_array)
    if "://" not in p and os.path.isdir(p) and not is_zarr_node(p):
        raise NotAZarrError(f"{p} is not a zarr array: expected a directory holding zarr.json (zarr v3) "
                            f"or .zarray (zarr v2), found a directory without either{_found(p)}.")
    node = open_node(p)
    if isinstance(node, zarr.Group):
        inside = sorted(k for k, _ in node.arrays())
        hint = f" It holds the arrays {', '.join(inside)}: pass one of those paths." if inside else ""
        raise NotAZarrError(f"{p} is a zarr group, not an array.{hint} For OME-Zarr images use "
                            "gpu_zarr.omezarr.read_omezarr(path, level=0).")
    return node
