"""Process-wide settings of gpu_zarr, in the pattern of ``kvikio.defaults``.

Each setting has a default, an environment variable that overrides the default at import
time, a getter and a setter that also works as a context manager::

    from gpu_zarr import settings
    settings.get("batch_bytes")
    settings.set(slots=4)                      # from now on
    with settings.set(batch_bytes=256 << 20):  # only inside the block
        ...

============== =========================== ==========================================
setting        environment variable        meaning
============== =========================== ==========================================
batch_bytes    ``GPU_ZARR_BATCH_MIB``      encoded (and decoded) bytes per engine
                                           batch: one read, one copy and one batched
                                           decode per batch (default 192 MiB)
slots          ``GPU_ZARR_SLOTS``          batches in flight (default 3)
lanes          ``GPU_ZARR_LANES``          GPU work streams decoding at once (default 3;
                                           at most ``slots``): nvCOMP is latency-bound,
                                           so calls in flight add up
budget_bytes   ``GPU_ZARR_BUDGET_MIB``     GPU memory a read may use beyond its result
                                           (staging, decoded buffers, nvCOMP scratch);
                                           default 0: a quarter of the free memory, at
                                           most 3 GiB
threads        ``GPU_ZARR_THREADS``        read threads (default: cores, 8..32)
reader         ``GPU_ZARR_READER``         "auto", "kvikio", "native" or "threads"
direct_raw     ``GPU_ZARR_DIRECT_RAW``     raw chunks read by kvikio straight into
                                           device memory (default 1)
pinned_bytes   ``GPU_ZARR_PINNED_MIB``     bound of the pinned host staging shared by
                                           all reads of the process (default 1024 MiB)
headroom_bytes ``GPU_ZARR_HEADROOM_MIB``   GPU memory left free by any read (default:
                                           512 MiB, or 5 % of the device if larger)
cache_bytes    ``GPU_ZARR_CACHE_MIB``      decoded chunks kept for lazy arrays (viewers):
                                           on the GPU, and in host memory for small
                                           reads decoded on the CPU (each cache at most
                                           this); least recently used first out
                                           (default 1024 MiB; 0 turns it off)
small_read     ``GPU_ZARR_SMALL_READ_MIB`` compressed reads touching at most this many
                                           decoded bytes may decode on CPU threads; they
                                           do when that is estimated faster than on the
                                           GPU (nvCOMP costs 5-16 ms a call whatever its
                                           size; host rates measured per codec:
                                           :mod:`gpu_zarr.engine.choice`); default 6 MiB
                                           per core, at most 128 MiB; 0 turns it off
remote_host_read ``GPU_ZARR_REMOTE_HOST_READ_MIB`` the same for remote stores
                                           (at least ``small_read``): their reads
                                           touching at most this many decoded bytes
                                           decode on CPU threads as the answers
                                           arrive (a shard's inner chunks as its bytes
                                           come), one copy to the GPU; the network,
                                           not the decoder, is the limit there, and
                                           nvCOMP waits for whole answers; default
                                           8 MiB per core, at most 1024 MiB; 0: only
                                           ``small_read``
shard_bytes    ``GPU_ZARR_SHARD_MIB``      decoded bytes of a shard the writer sizes
                                           itself (``shards=None``): chunks grown
                                           along the last axes up to this
                                           (default 32 MiB)
write_batch_bytes ``GPU_ZARR_WRITE_BATCH_MIB`` data bytes the GPU writer encodes in one
                                           nvCOMP call per lane (a call costs about
                                           the same whatever it holds, so big batches
                                           write fastest); default 0: as much as a
                                           quarter of the free GPU memory holds, each
                                           lane's batch counted three times, between
                                           ``batch_bytes`` and 2 GiB. The CPU twin
                                           uses ``batch_bytes``
metadata_ttl   ``GPU_ZARR_METADATA_TTL_S`` seconds a remote store's metadata documents
                                           (zarr.json, .zarray, .zattrs, .zgroup,
                                           .zmetadata) are reused by later opens of
                                           the same node: opening an OME-Zarr reads
                                           the root many times (default 10; 0: off)
metadata_bytes ``GPU_ZARR_METADATA_MIB``   the largest remote metadata document read
                                           (a consolidated .zmetadata of a big plate
                                           may need more); a bigger one is refused,
                                           never held (default 8 MiB)
remote_timeout ``GPU_ZARR_REMOTE_TIMEOUT_S`` seconds one remote request may take, its
                                           retries and redirects included (default
                                           60; ``storage_options["timeout"]`` sets it
                                           per store; 0: no deadline)
remote_min_rate ``GPU_ZARR_REMOTE_MIN_RATE`` bytes per second below which a remote
                                           transfer fails (measured over 10 s, or half
                                           the timeout when shorter; default 1024)
remote_cache_bytes ``GPU_ZARR_REMOTE_CACHE_MIB`` a remote store's answers kept for reuse
                                           (default 256 MiB)
remote_index_bytes ``GPU_ZARR_REMOTE_INDEX_MIB`` a remote store's shard indexes kept
                                           (default 64 MiB)
remote_requests ``GPU_ZARR_REMOTE_REQUESTS`` requests in flight per remote read
                                           (default 64; ``storage_options["requests"]``
                                           overrides it per store)
native         ``GPU_ZARR_NATIVE``         the native host library (``engine/native``:
                                           host reads, CPU decodes and places, the
                                           writer's files, the HTTP client) runs
                                           (default True; 0/off/false/no: the
                                           pure-Python paths and obstore). Asked at
                                           each decision (a read prepared, a store
                                           opened): a change applies to what is
                                           prepared after it
native_library ``GPU_ZARR_NATIVE_LIB``     a ``libgz_native.so`` to load instead of
                                           the one built with the package (e.g. an
                                           AddressSanitizer build); "" (default): the
                                           built one. Read once, when the library
                                           first loads: a later change has no effect
native_http    ``GPU_ZARR_NATIVE_HTTP``    the native HTTP client (libcurl) serves
                                           http(s) and anonymous s3 stores (default
                                           True; 0/off/false/no: obstore serves).
                                           Asked as each store opens: a store opened
                                           before keeps its client
nvcomp_library ``GPU_ZARR_NVCOMP_LIBRARY`` a ``libnvcomp.so`` tried before the pip
                                           wheel's and the loader path's; "" (default):
                                           none. Read when nvCOMP first loads (once per
                                           process; ``load_library(refresh=True)``
                                           looks again)
progress       ``GPU_ZARR_PROGRESS``       what ``progress="auto"`` (a read's default)
                                           does: "auto" (a bar after about a second,
                                           in Jupyter or on a terminal), "on" (also
                                           without a terminal; environment
                                           1/on/true/yes) or "off" (no bar;
                                           0/off/false/no). Asked at each read
cache_dir      ``GPU_ZARR_CACHE``          folder of the sample data (``gpu-zarr
                                           demo``, napari's sample); "" (default):
                                           ``$XDG_CACHE_HOME/napari-gpu-zarr``, else
                                           ``~/.cache/napari-gpu-zarr``
============== =========================== ==========================================
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["get", "names", "set", "snapshot"]

MiB = 1 << 20


def _env_int(var: str, default: int, scale: int = 1) -> int:
    raw = os.environ.get(var)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(float(raw) * scale)
    except ValueError:
        raise ValueError(f"environment variable {var}={raw!r}: expected a number") from None
    if value < 0:
        raise ValueError(f"environment variable {var}={raw!r}: expected a number >= 0")
    return value


#: the words a switch's environment variable accepts (case and surrounding blanks ignored)
_OFF_WORDS = ("0", "off", "false", "no")
_ON_WORDS = ("1", "on", "true", "yes")


def _env_switch(var: str, default: bool = True) -> bool:
    """A switch from the environment: ``0/off/false/no`` off, ``1/on/true/yes`` on, unset or
    empty the default; any other value is refused (a typo must not leave a switch as it was)."""
    raw = os.environ.get(var)
    v = (raw or "").strip().lower()
    if v == "":
        return default
    if v in _OFF_WORDS or v in _ON_WORDS:
        return v in _ON_WORDS
    raise ValueError(f"environment variable {var}={raw!r}: expected 0/off/false/no or 1/on/true/yes")


def _env_progress(var: str) -> str:
    """``GPU_ZARR_PROGRESS``: a switch's words for "off" / "on", unset, empty or "auto" for "auto"."""
    raw = os.environ.get(var)
    v = (raw or "").strip().lower()
    if v in ("", "auto"):
        return "auto"
    if v in _OFF_WORDS or v in _ON_WORDS:
        return "on" if v in _ON_WORDS else "off"
    raise ValueError(f"environment variable {var}={raw!r}: expected 0/off/false/no, 1/on/true/yes or auto")


def _defaults() -> dict[str, Any]:
    return {
        "batch_bytes": _env_int("GPU_ZARR_BATCH_MIB", 192 * MiB, MiB),
        "slots": _env_int("GPU_ZARR_SLOTS", 3),
        "lanes": _env_int("GPU_ZARR_LANES", 3),
        "budget_bytes": _env_int("GPU_ZARR_BUDGET_MIB", 0, MiB),  # 0: automatic
        "threads": _env_int("GPU_ZARR_THREADS", max(8, min(32, os.cpu_count() or 8))),
        "reader": os.environ.get("GPU_ZARR_READER", "auto"),
        "direct_raw": os.environ.get("GPU_ZARR_DIRECT_RAW", "1") != "0",
        "pinned_bytes": _env_int("GPU_ZARR_PINNED_MIB", 1024 * MiB, MiB),
        "headroom_bytes": _env_int("GPU_ZARR_HEADROOM_MIB", 0, MiB),  # 0: automatic
        "cache_bytes": _env_int("GPU_ZARR_CACHE_MIB", 1024 * MiB, MiB),
        "small_read": _env_int("GPU_ZARR_SMALL_READ_MIB", min(128, 6 * (os.cpu_count() or 1)) * MiB, MiB),
        "remote_host_read": _env_int("GPU_ZARR_REMOTE_HOST_READ_MIB", min(1024, 8 * (os.cpu_count() or 1)) * MiB,
                                     MiB),
        "metadata_ttl": _env_int("GPU_ZARR_METADATA_TTL_S", 10),
        "shard_bytes": _env_int("GPU_ZARR_SHARD_MIB", 32 * MiB, MiB),
        "write_batch_bytes": _env_int("GPU_ZARR_WRITE_BATCH_MIB", 0, MiB),  # 0: automatic
        "metadata_bytes": _env_int("GPU_ZARR_METADATA_MIB", 8 * MiB, MiB),
        "remote_timeout": _env_int("GPU_ZARR_REMOTE_TIMEOUT_S", 60),
        "remote_min_rate": _env_int("GPU_ZARR_REMOTE_MIN_RATE", 1024),
        "remote_cache_bytes": _env_int("GPU_ZARR_REMOTE_CACHE_MIB", 256 * MiB, MiB),
        "remote_index_bytes": _env_int("GPU_ZARR_REMOTE_INDEX_MIB", 64 * MiB, MiB),
        "remote_requests": _env_int("GPU_ZARR_REMOTE_REQUESTS", 64),
        "native": _env_switch("GPU_ZARR_NATIVE"),
        "native_library": os.environ.get("GPU_ZARR_NATIVE_LIB", ""),
        "native_http": _env_switch("GPU_ZARR_NATIVE_HTTP"),
        "nvcomp_library": os.environ.get("GPU_ZARR_NVCOMP_LIBRARY", ""),
        "progress": _env_progress("GPU_ZARR_PROGRESS"),
        "cache_dir": os.environ.get("GPU_ZARR_CACHE", ""),
    }


_CHECKS: dict[str, Callable[[Any], bool]] = {
    "batch_bytes": lambda v: isinstance(v, int) and v >= MiB,
    "slots": lambda v: isinstance(v, int) and 1 <= v <= 64,
    "lanes": lambda v: isinstance(v, int) and 1 <= v <= 64,
    "budget_bytes": lambda v: isinstance(v, int) and v >= 0,
    "threads": lambda v: isinstance(v, int) and 1 <= v <= 256,
    "reader": lambda v: v in ("auto", "kvikio", "native", "threads"),
    "direct_raw": lambda v: isinstance(v, bool),
    "pinned_bytes": lambda v: isinstance(v, int) and v >= 0,
    "headroom_bytes": lambda v: isinstance(v, int) and v >= 0,
    "small_read": lambda v: isinstance(v, int) and v >= 0,
    "remote_host_read": lambda v: isinstance(v, int) and v >= 0,
    "cache_bytes": lambda v: isinstance(v, int) and v >= 0,
    "metadata_ttl": lambda v: isinstance(v, (int, float)) and v >= 0,
    "shard_bytes": lambda v: isinstance(v, int) and v >= 1,
    "write_batch_bytes": lambda v: isinstance(v, int) and v >= 0,
    "metadata_bytes": lambda v: isinstance(v, int) and v >= 1024,
    "remote_timeout": lambda v: isinstance(v, (int, float)) and v >= 0,
    "remote_min_rate": lambda v: isinstance(v, int) and v >= 1,
    "remote_cache_bytes": lambda v: isinstance(v, int) and v >= 0,
    "remote_index_bytes": lambda v: isinstance(v, int) and v >= 0,
    "remote_requests": lambda v: isinstance(v, int) and v >= 1,
    "native": lambda v: isinstance(v, bool),
    "native_library": lambda v: isinstance(v, str),
    "native_http": lambda v: isinstance(v, bool),
    "nvcomp_library": lambda v: isinstance(v, str),
    "progress": lambda v: v in ("auto", "on", "off"),
    "cache_dir": lambda v: isinstance(v, str),
}
_lock = threading.Lock()
_values: dict[str, Any] = _defaults()
for _k, _v in _values.items():
    if not _CHECKS[_k](_v):
        raise ValueError(f"gpu_zarr setting {_k!r} from the environment is invalid: {_v!r}")


def names() -> tuple[str, ...]:
    """The names of every setting."""
    return tuple(_values)


def get(name: str) -> Any:
    """The current value of setting ``name`` (see the module docstring for the list)."""
    # (no lock: one dict lookup is atomic, and `set` replaces values whole; the lock and its
    # test cost ~1 us a call, a dozen calls before every plane's requests left)
    try:
        return _values[name]
    except KeyError:
        raise KeyError(f"unknown gpu_zarr setting {name!r}; settings are {', '.join(_values)}") from None


class _Restore:
    """Returned by :func:`set`: restores the previous values when used as a context manager."""

    def __init__(self, previous: dict[str, Any]) -> None:
        self._previous = previous

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        with _lock:
            _values.update(self._previous)


def set(**values: Any) -> _Restore:  # noqa: A001 - the kvikio.defaults.set pattern
    """Change settings; use as ``with settings.set(...):`` to restore them afterwards.

    Raises
    ------
    KeyError
        An unknown setting.
    ValueError
        A value out of range (e.g. ``slots=0`` or ``reader="fast"``).
    """
    for k, v in values.items():
        if k not in _CHECKS:
            raise KeyError(f"unknown gpu_zarr setting {k!r}; settings are {', '.join(_values)}")
        if not _CHECKS[k](v):
            raise ValueError(f"gpu_zarr setting {k}={v!r} is out of range")
    with _lock:
        previous = {k: _values[k] for k in values}
        _values.update(values)
    return _Restore(previous)


def snapshot() -> dict[str, Any]:
    """All settings as a dict (a copy)."""
    with _lock:
        return dict(_values)

