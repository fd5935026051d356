"""Opening zarr stores read-only, with errors that say what was found.

The one place that turns a user's path into a zarr array or group: every other module
(backend choice, the engine, OME-Zarr, the CLI) opens through here, so a wrong path gets
the same helpful message everywhere. Nothing here writes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gpu_zarr.errors import GpuZarrError, NotAZarrError, UnsafeArrayError

__all__ = ["METADATA_FILES", "UNSAFE_CODECS", "arrays_of", "check_safe", "is_zarr_node", "open_array", "open_node"]

#: codec ids whose decoding runs code from the store (numcodecs' pickle-based codecs)
UNSAFE_CODECS = frozenset({"pickle", "numcodecs.pickle"})

METADATA_FILES = ("zarr.json", ".zarray", ".zgroup", ".zattrs")


def is_zarr_node(path: Any) -> bool:
    """True when ``path`` is a local folder holding zarr v2 or v3 metadata (never raises)."""
    if isinstance(path, str) and "://" in path or getattr(path, "is_remote", False):
        return False
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


def _open_remote(loc: Any) -> Any:
    """zarr.open of a remote location, read-only, with errors that name the URL."""
    import zarr

    from gpu_zarr.errors import RemoteError, RemoteUnavailable
    from gpu_zarr.location import network_cause

    try:
        store = loc.zarr_store()
    except RemoteUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - a bad URL or option: re-raised with context
        raise NotAZarrError(f"cannot open {loc.url}: {type(exc).__name__}: {_first_line(exc)}") from exc
    try:
        return zarr.open(store, mode="r")
    except FileNotFoundError as exc:
        raise NotAZarrError(f"expected a zarr array or group at {loc.url}, found no zarr.json, .zarray or .zgroup "
                            "there (404): check the URL (it names the folder that holds the metadata)."
                            ) from exc
    except Exception as exc:  # noqa: BLE001 - re-raised with what to do
        name = type(exc).__name__
        if "PermissionDenied" in name or "Unauthenticated" in name:
            raise RemoteError(f"{loc.url}: the server refused access (403/401): check the URL, and for a "
                              "private bucket the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
                              f"or storage_options). {_first_line(exc)}") from exc
        if name in ("GenericError", "TimeoutError", "ConnectionError") or isinstance(exc, OSError):
            cause = network_cause(loc.url, exc, loc.storage_options.get("timeout", 60))
            raise RemoteError(f"{loc.url} could not be reached: {cause}{_first_line(exc)}. "
                              "Check the URL, that the server is up and reachable (network, DNS, proxy), then "
                              "retry.") from exc
        raise NotAZarrError(f"expected a zarr group or array at {loc.url}, but it could not be opened as one: "
                            f"{name}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _codec_ids(meta: Any) -> Iterator[str]:
    """Every codec id named in zarr v2 or v3 array metadata (nested sharding codecs too)."""
    if isinstance(meta, dict):
        for key in ("id", "name"):
            if isinstance(meta.get(key), str):
                yield meta[key]
        for key in ("compressor", "filters", "codecs", "configuration", "index_codecs", "object_codec"):
            yield from _codec_ids(meta.get(key))
    elif isinstance(meta, list):
        for m in meta:
            yield from _codec_ids(m)


def check_safe(path: str | os.PathLike[str]) -> None:
    """Refuse, from the raw metadata and before zarr parses it or anything is decoded, an array
    whose data are Python objects or whose codecs run code (pickle).

    Raises
    ------
    UnsafeArrayError
        Naming the array's path and what was found.
    """
    p = os.fspath(path)
    if "://" in p:
        return
    for name in (".zarray", "zarr.json"):
        try:
            with open(os.path.join(p, name), "rb") as fh:
                meta = json.loads(fh.read(1 << 20))
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict) or meta.get("node_type", "array") != "array":
            continue
        grid = meta.get("chunk_grid")
        chunks = meta.get("chunks") if "chunks" in meta else (
            grid.get("configuration", {}).get("chunk_shape") if isinstance(grid, dict) else None)
        if isinstance(chunks, list) and any(not isinstance(c, int) or c <= 0 for c in chunks):
            raise NotAZarrError(f"{p}: the array's chunk shape is {chunks}; expected positive integers (a chunk "
                                "can hold no data otherwise). The metadata is damaged; nothing was read.")
        dtype = meta.get("dtype", meta.get("data_type"))
        unsafe = sorted(set(_codec_ids(meta)) & UNSAFE_CODECS)
        objects = isinstance(dtype, str) and ("O" in dtype.lstrip("|<>=") or dtype == "object")
        if unsafe or objects:
            what = f"the codec {unsafe[0]!r}, which runs code from the store when it decodes" if unsafe else \
                f"dtype {dtype!r} (Python objects)"
            raise UnsafeArrayError(
                f"{p}: this array has {what}. gpu_zarr reads numeric and bool arrays only and never "
                "decodes pickle; nothing was read. Convert the array to a numeric dtype with trusted tools.")


def arrays_of(group: Any, path: str) -> list[tuple[str, Any]]:
    """``sorted(group.arrays())``, with any member zarr cannot open (unknown dtype or codec,
    broken metadata) reported with the group's path and the member's name; unsafe members
    (see :func:`check_safe`) are refused by name before zarr parses them.

    Raises
    ------
    NotAZarrError, UnsafeArrayError
    """
    import zarr

    if "://" not in path and os.path.isdir(path):
        for name in sorted(os.listdir(path)):  # before zarr lists (and so parses) the members
            if os.path.isdir(os.path.join(path, name)):
                check_safe(os.path.join(path, name))
    try:
        names = sorted(group.keys())
    except Exception as exc:  # noqa: BLE001 - re-raised with context
        raise NotAZarrError(f"{path}: the group's members cannot be listed: {type(exc).__name__}: {exc}") from exc
    out = []
    for name in names:
        try:
            node = group[name]
        except GpuZarrError:
            raise
        except Exception as exc:  # noqa: BLE001 - re-raised with context
            raise NotAZarrError(f"{path}: its member {name!r} cannot be opened: {type(exc).__name__}: {exc}") from exc
        if isinstance(node, zarr.Array):
            out.append((name, node))
    return out


def open_node(path: Any, storage_options: Mapping[str, Any] | None = None) -> Any:
    """Open a zarr group or array read-only.

    Parameters
    ----------
    path : str, os.PathLike or gpu_zarr.location.Location
        A local path, or a ``file://``, ``http(s)://``, ``s3://`` or ``gs://`` URL.
    storage_options : mapping, optional
        Options of a remote store (see :mod:`gpu_zarr.location`).

    Raises
    ------
    NotAZarrError
        Nothing exists at ``path``, or it cannot be opened as zarr (the message lists
        what the folder holds).
    gpu_zarr.errors.RemoteError
        A remote store refused access or could not be reached (the message names the URL).
    gpu_zarr.errors.RemoteUnavailable
        A URL was given and the package that reads it is missing (the message names the install).
    """
    import zarr

    from gpu_zarr.location import resolve

    loc = resolve(path, storage_options)
    if loc.is_remote:
        return _open_remote(loc)
    p = loc.url
    if not os.path.exists(p):
        raise NotAZarrError(f"{p} does not exist: nothing exists there. Expected a zarr array or group (a folder holding "
                            "zarr.json, .zarray or .zgroup).")
    if os.path.isfile(p):
        name = os.path.basename(p)
        if name in METADATA_FILES:  # a metadata document: its folder is the node
            raise NotAZarrError(f"expected a zarr group or array at {p} (a folder with zarr.json, .zgroup or "
                                f".zarray), found its metadata file {name}: pass the folder that holds it, "
                                f"{os.path.dirname(p) or '.'}")
        raise NotAZarrError(f"expected a zarr group or array at {p} (a folder with zarr.json, .zgroup or "
                            ".zarray), found a file that is not zarr: pass a zarr folder or URL")
    if not is_zarr_node(p):  # say what the folder holds, not zarr's own exception about its store
        raise NotAZarrError(f"expected a zarr group or array at {p} (a folder with zarr.json, .zgroup or "
                            f".zarray), found a folder without any of them{_found(p)}")
    check_safe(p)
    try:
        return zarr.open(p, mode="r")
    except Exception as exc:  # noqa: BLE001 - re-raised with context
        raise NotAZarrError(
            f"expected a zarr group or array at {p} (a folder with zarr.json, .zgroup or "
            f".zarray), but it could not be opened as one: {type(exc).__name__}: {exc}{_found(p)}"
        ) from exc


def open_array(path_or_array: Any, storage_options: Mapping[str, Any] | None = None) -> Any:
    """Open a zarr array read-only (a ``zarr.Array`` is returned as it is).

    Parameters
    ----------
    path_or_array : str, os.PathLike, gpu_zarr.location.Location or zarr.Array
        A local path or a URL (see :func:`open_node`).
    storage_options : mapping, optional
        Options of a remote store (see :mod:`gpu_zarr.location`).

    Raises
    ------
    NotAZarrError
        The path does not exist, is not zarr, or is a group (the message lists the arrays
        inside it and points to the OME-Zarr reader).
    """
    import zarr

    from gpu_zarr.location import Location, resolve

    if not isinstance(path_or_array, (str, os.PathLike, Location)):
        if isinstance(path_or_array, zarr.Array):
            if storage_options:
                raise ValueError("storage_options apply to a path or URL; this is an opened zarr.Array (its store "
                                 "has its own options): pass the URL instead, or leave storage_options out")
            return path_or_array
        raise TypeError(f"expected a path, a URL or a zarr.Array, got {type(path_or_array).__name__}")
    loc = resolve(path_or_array, storage_options)
    p = loc.url
    if not loc.is_remote and os.path.isdir(p) and not is_zarr_node(p):
        raise NotAZarrError(f"{p} is not a zarr array: expected a directory holding zarr.json (zarr v3) "
                            f"or .zarray (zarr v2), found a directory without either{_found(p)}.")
    node = open_node(loc)
    if isinstance(node, zarr.Group):
        inside = [k for k, _ in arrays_of(node, p)]
        hint = f" It holds the arrays {', '.join(inside)}: pass one of those paths." if inside else ""
        raise NotAZarrError(f"{p} is a zarr group, not an array.{hint} For OME-Zarr images use "
                            "gpu_zarr.omezarr.read_omezarr(path, level=0).")
    return node
