"""Test volumes for the benchmark: layouts, synthetic data, writing and reuse.

Every volume is written through zarr-python 3 / numcodecs, so its metadata is standard
and every peer reads it. The data are smooth structure plus 8 bits of noise per voxel,
which gives a zstd level-1 compression ratio of about 1.35 on uint16 (as in
``figures.md``). The uint8 volumes of the small-chunk layouts are the same data shifted
right by 4 bits (4 bits of noise). A volume is reused when its stored benchmark
attributes match the requested layout and say that writing finished.

The user's own store (``gpu-zarr bench PATH``) is described by :func:`user_volume`
as the same :class:`VolumeInfo`, opened read-only.
"""

from __future__ import annotations

import math
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "GENERATOR_VERSION",
    "Layout",
    "VolumeInfo",
    "THROUGHPUT_SHAPES",
    "BROWSE_SHAPES",
    "THROUGHPUT_LAYOUTS",
    "BROWSE_LAYOUTS",
    "SMALL_CHUNK_LAYOUTS",
    "CHAIN_LAYOUTS",
    "CODECS",
    "parse_shape",
    "scaled_layouts",
    "ensure_volumes",
    "make_slab",
    "stored_bytes",
    "user_volume",
]

#: bump when the data generator changes, so stale volumes are rewritten
GENERATOR_VERSION = 2

DTYPE = np.dtype("uint16")  # the default; a layout may say uint8 (see Layout.dtype)
_AMPLITUDE = 1900.0  # range of the smooth part (tuned for zstd-1 ratio ~1.35 at full size)
_OFFSET = 500.0
_NOISE_MASK = np.uint16(0xFF)  # 8 random low bits

#: volume shapes per ``--size`` (the full sizes are those of figures.md)
THROUGHPUT_SHAPES = {
    "full": (512, 2048, 2048),  # 4 GiB uint16
    "small": (128, 1024, 1024),  # 256 MiB
    "tiny": (16, 128, 128),  # 512 KiB, for tests
}
BROWSE_SHAPES = {
    "full": (256, 2048, 2048),  # 2 GiB uint16
    "small": (64, 1024, 1024),
    "tiny": (16, 128, 128),
}

#: codec name -> (label, who writes it). Blosc settings are those of the writers named.
CODECS: dict[str, str] = {
    "raw": "no compression",
    "zstd": "zstd level 1 (zarr v3 zstd codec / numcodecs Zstd)",
    "blosc-lz4-shuffle": "Blosc lz4 clevel 5, byte shuffle (bioformats2raw, zarr-python 2 default)",
    "blosc-zstd-bitshuffle": "Blosc zstd clevel 5, bitshuffle",
    "blosc-zstd-shuffle": "Blosc zstd clevel 5, byte shuffle (NGFF 0.5 challenge resave, inner chunks)",
    "gzip": "gzip level 1 (numcodecs GZip, zarr-python 2 default level)",
    "zstd-crc32c": "zstd level 1 and a crc32c checksum per chunk (TensorStore, zarrs, ngff-zarr inner chunks)",
    "numcodecs-zstd": "zstd level 1 under its numcodecs.zstd name (zarr v3)",
    "delta-zstd": "Delta filter, then zstd level 1 (a v2 filter; numcodecs.delta in v3)",
    "shuffle-lz4": "a byte Shuffle filter, then numcodecs LZ4 (the v2 lz4 compressor: a size, then one LZ4 block)",
}


@dataclass(frozen=True)
class Layout:
    """How one test volume is stored.

    ``chunks`` and ``shards`` are given for the full-size volume and scaled with
    :func:`scaled_layouts` for the other sizes, except with ``keep_chunks``: then the
    chunks are only clipped to the array (small chunks are the point of those layouts;
    scaling 64^3 in proportion would give 4^3 chunks of 64 bytes at ``--size tiny``).
    ``codec`` is a key of :data:`CODECS`; ``dtype`` is ``uint16`` or ``uint8``.
    """

    name: str
    label: str
    zarr_format: int
    chunks: tuple[int, ...]
    codec: str
    shards: tuple[int, ...] | None = None
    level: int = 1
    dtype: str = "uint16"
    keep_chunks: bool = False
    endian: str = "little"

    def __post_init__(self) -> None:
        if self.codec not in CODECS:
            raise ValueError(f"layout {self.name}: codec {self.codec!r} is not one of {sorted(CODECS)}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"layout {self.name}: dtype {self.dtype!r} is not one of {list(_DTYPES)}")

    @property
    def np_dtype(self) -> np.dtype:
        dt = np.dtype(self.dtype)
        return dt.newbyteorder(">") if self.endian == "big" and dt.itemsize > 1 else dt

    @property
    def chunk_bytes(self) -> int:
        return math.prod(self.chunks) * self.np_dtype.itemsize

    @property
    def shard_bytes(self) -> int | None:
        return None if self.shards is None else math.prod(self.shards) * self.np_dtype.itemsize

    @property
    def codec_label(self) -> str:
        """``zstd-1``, ``raw``, ``blosc-lz4-shuffle`` ... as recorded in the JSON."""
        label = f"zstd-{self.level}" if self.codec == "zstd" else self.codec
        return label + ("-big-endian" if self.endian == "big" else "")

    def spec(self, shape: tuple[int, ...], seed: int) -> dict[str, Any]:
        """The attributes that identify a finished volume of this layout."""
        return {
            "generator": GENERATOR_VERSION,
            "seed": int(seed),
            "shape": list(shape),
            "dtype": self.np_dtype.str,
            "zarr_format": self.zarr_format,
            "chunks": list(self.chunks),
            "shards": None if self.shards is None else list(self.shards),
            "codec": self.codec,
            "level": self.level if self.codec in ("zstd", "gzip") else None,
            **({"endian": self.endian} if self.endian != "little" else {}),
        }


_DTYPES = ("uint16", "uint8")

_BLOSC_CHUNKS = (1, 1024, 1024)  # 2-D planes of 2 MiB, as bioformats2raw writes them
_SHARDS = (16, 1024, 2048)  # 64 MiB shards
_INNER = (1, 512, 1024)  # of 1 MiB chunks

#: the real-world layouts of issue 8 (both modes): zarr v2 Blosc as bioformats2raw /
#: zarr-python 2 / ome-zarr-py write it, sharded v3 with Blosc zstd inner chunks, gzip v2
_REAL_WORLD: tuple[Layout, ...] = (
    Layout("blosc-lz4-shuffle-v2", "Blosc lz4 + shuffle, v2, 1x1024x1024 chunks", 2,
           _BLOSC_CHUNKS, "blosc-lz4-shuffle"),
    Layout("blosc-zstd-bitshuffle-v2", "Blosc zstd + bitshuffle, v2, 1x1024x1024 chunks", 2,
           _BLOSC_CHUNKS, "blosc-zstd-bitshuffle"),
    Layout("sharded-blosc-zstd-v3", "sharded v3, 64 MiB shards of 1 MiB Blosc zstd + shuffle chunks", 3,
           _INNER, "blosc-zstd-shuffle", shards=_SHARDS),
    Layout("gzip-v2", "gzip level 1, v2, 1x1024x1024 chunks", 2, _BLOSC_CHUNKS, "gzip"),
)

#: small chunks (issue 16, both modes): 3-D chunks of 64^3 uint8 (256 KiB; gzip as
#: zarr-python 2 writes it, Blosc zstd in v3) and 2-D chunks of 256x256 uint16 (128 KiB,
#: Blosc lz4 as bioformats2raw writes it with 256-pixel tiles). Their chunks are kept at
#: every size (only clipped to the array): a plane of the 64^3 layouts touches
#: (Y/64)x(X/64) chunks of which it uses 1/64, a 1024^2 tile of the 256^2 layout 16 chunks.
SMALL_CHUNK_LAYOUTS: tuple[Layout, ...] = (
    Layout("gzip-u8-64x64x64-v2", "gzip level 1, v2, uint8, 64x64x64 chunks (256 KiB)", 2,
           (64, 64, 64), "gzip", dtype="uint8", keep_chunks=True),
    Layout("blosc-zstd-u8-64x64x64-v3", "Blosc zstd + shuffle, v3, uint8, 64x64x64 chunks (256 KiB)", 3,
           (64, 64, 64), "blosc-zstd-shuffle", dtype="uint8", keep_chunks=True),
    Layout("blosc-lz4-1x256x256-v2", "Blosc lz4 + shuffle, v2, uint16, 1x256x256 chunks (128 KiB)", 2,
           (1, 256, 256), "blosc-lz4-shuffle", keep_chunks=True),
)

#: chains beyond one core codec (issue 36, both modes): crc32c inside shards, a numcodecs.*
#: name in v3, v2 filters, numcodecs' LZ4, big-endian elements; and shards of tiny (64 KiB) inner chunks,
#: kept at every size, browsed plane by plane and tile by tile
CHAIN_LAYOUTS: tuple[Layout, ...] = (
    Layout("sharded-zstd-crc32c-v3", "sharded v3, 64 MiB shards of 1 MiB zstd + crc32c chunks", 3,
           _INNER, "zstd-crc32c", shards=_SHARDS),
    Layout("numcodecs-zstd-v3-1MiB", "numcodecs.zstd, v3, 1 MiB chunks", 3, _INNER, "numcodecs-zstd"),
    Layout("delta-zstd-v2", "Delta filter + zstd, v2, 1x1024x1024 chunks", 2, _BLOSC_CHUNKS, "delta-zstd"),
    Layout("shuffle-lz4-v2", "Shuffle filter + numcodecs LZ4, v2, 1x1024x1024 chunks", 2, _BLOSC_CHUNKS,
           "shuffle-lz4"),
    Layout("blosc-lz4-shuffle-big-endian-v2", "Blosc lz4 + shuffle, v2, big-endian uint16, 1x1024x1024 chunks", 2,
           _BLOSC_CHUNKS, "blosc-lz4-shuffle", endian="big"),
    Layout("sharded-zstd-64KiB-v3", "sharded v3, shards of 16x1024x2048 holding 64 KiB zstd chunks (1x128x256)", 3,
           (1, 128, 256), "zstd", shards=_SHARDS, keep_chunks=True),
)

# Full-size (512, 2048, 2048) layouts of figures.md, sharded zstd, the real-world ones, small chunks.
THROUGHPUT_LAYOUTS: tuple[Layout, ...] = (
    Layout("raw-v3-32MiB", "raw v3, 32 MiB chunks", 3, (4, 2048, 2048), "raw"),
    Layout("raw-v2-8MiB", "raw v2, 8 MiB chunks", 2, (1, 2048, 2048), "raw"),
    Layout("zstd-v3-32MiB", "zstd v3, 32 MiB chunks", 3, (4, 2048, 2048), "zstd"),
    Layout("zstd-v3-4MiB", "zstd v3, 4 MiB chunks", 3, (1, 1024, 2048), "zstd"),
    Layout("zstd-v3-1MiB", "zstd v3, 1 MiB chunks", 3, _INNER, "zstd"),
    Layout(
        "sharded-zstd-v3-64MiB-1MiB",
        "sharded zstd v3, 64 MiB shards of 1 MiB chunks",
        3,
        _INNER,
        "zstd",
        shards=_SHARDS,
    ),
    *_REAL_WORLD,
    *SMALL_CHUNK_LAYOUTS,
    *CHAIN_LAYOUTS,
)

# Full-size (256, 2048, 2048) layouts of figures.md's browsing table, the real-world ones, small chunks.
BROWSE_LAYOUTS: tuple[Layout, ...] = (
    Layout("zstd-32x256x256", "zstd chunks 32x256x256 (4 MiB)", 3, (32, 256, 256), "zstd"),
    Layout("zstd-1x512x1024", "zstd chunks 1x512x1024 (1 MiB)", 3, _INNER, "zstd"),
    Layout(
        "sharded-zstd-64MiB-1MiB",
        "sharded zstd: 64 MiB shards of 1 MiB chunks",
        3,
        _INNER,
        "zstd",
        shards=_SHARDS,
    ),
    *_REAL_WORLD,
    *SMALL_CHUNK_LAYOUTS,
    *CHAIN_LAYOUTS,
)


@dataclass
class VolumeInfo:
    """An array on disk that the benchmark reads: a test volume or the user's store.

    ``layout`` is None for the user's store; ``meta`` then describes it (format,
    chunks, shards, codecs, as its metadata says).
    """

    name: str
    path: Path
    shape: tuple[int, ...]
    dtype: str
    reused: bool
    write_s: float
    stored_bytes: int
    layout: Layout | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def ratio(self) -> float:
        return self.nbytes / self.stored_bytes if self.stored_bytes else float("nan")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "path": str(self.path), "shape": list(self.shape),
                               "dtype": self.dtype}
        lay = self.layout
        if lay is not None:
            out.update({
                "label": lay.label,
                "zarr_format": lay.zarr_format,
                "chunks": list(lay.chunks),
                "shards": None if lay.shards is None else list(lay.shards),
                "codec": lay.codec_label,
                "chunk_bytes": lay.chunk_bytes,
                "shard_bytes": lay.shard_bytes,
            })
        out.update(self.meta)
        out.update({
            "nbytes": self.nbytes,
            "stored_bytes": self.stored_bytes,
            "compression_ratio": round(self.ratio, 4),
            "reused": self.reused,
            "write_s": round(self.write_s, 3),
        })
        return out


def parse_shape(size: str, table: dict[str, tuple[int, int, int]]) -> tuple[int, int, int]:
    """``full``/``small``/``tiny`` or an explicit ``Z,Y,X``."""
    if size in table:
        return table[size]
    try:
        shape = tuple(int(s) for s in size.replace("x", ",").split(","))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(
            f"--size expects one of {sorted(table)} or 'Z,Y,X' with positive integers, got {size!r}"
        )
    return shape


def _scale(full: tuple[int, ...], full_shape: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    # an axis long enough to hold four full-size chunks keeps the full-size chunk, so a
    # shorter stack of the same planes (e.g. 128 x 2048 x 2048) keeps the chunk bytes
    return tuple(
        c if s >= 4 * c else max(1, min(s, round(c * s / fs)))
        for c, fs, s in zip(full, full_shape, shape, strict=True)
    )


def scaled_layouts(
    layouts: tuple[Layout, ...], full_shape: tuple[int, ...], shape: tuple[int, ...]
) -> list[Layout]:
    """Scale each layout's chunks (and shards) in proportion to ``shape / full_shape``.

    Shards are rounded up to a whole number of inner chunks (capped at the array
    extent rounded up), so the sharding codec accepts them. A layout with
    ``keep_chunks`` keeps its chunks, clipped to ``shape``.
    """
    out = []
    for lay in layouts:
        if tuple(shape) == tuple(full_shape):
            out.append(lay)
            continue
        if lay.keep_chunks:
            chunks = tuple(min(c, s) for c, s in zip(lay.chunks, shape, strict=True))
        else:
            chunks = _scale(lay.chunks, full_shape, shape)
        shards = None
        if lay.shards is not None:
            raw = _scale(lay.shards, full_shape, shape)
            shards = tuple(max(c, -(-r // c) * c) for r, c in zip(raw, chunks, strict=True))
        out.append(replace(lay, chunks=chunks, shards=shards))
    return out


# ---------------------------------------------------------------- data


class _Pattern:
    """Two smooth 2-D fields, mixed with a weight that varies slowly along z."""

    def __init__(self, yx: tuple[int, int], seed: int) -> None:
        self.a = self._field(yx, seed * 2 + 1)
        self.b = self._field(yx, seed * 2 + 2)

    @staticmethod
    def _field(yx: tuple[int, int], seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        y = np.linspace(0.0, 1.0, yx[0], dtype=np.float32)[:, None]
        x = np.linspace(0.0, 1.0, yx[1], dtype=np.float32)[None, :]
        f = np.zeros(yx, np.float32)
        for _ in range(6):
            fy, fx, ph = rng.uniform(1, 6), rng.uniform(1, 6), rng.uniform(0, 2 * np.pi)
            f += np.sin(2 * np.pi * fy * y + ph) * np.cos(2 * np.pi * fx * x + 0.5 * ph)
        f -= f.min()
        f /= max(float(f.max()), 1e-12)
        return f * np.float32(_AMPLITUDE)

    def plane(self, z: int, seed: int, out: np.ndarray) -> None:
        w = np.float32(0.5 + 0.5 * math.sin(z / 40.0))
        tmp = self.a * w
        tmp += self.b * (np.float32(1.0) - w)
        tmp += np.float32(_OFFSET)
        out[...] = tmp  # float32 -> uint16 (values in [500, 2400])
        rng = np.random.default_rng([seed, z])
        noise = np.frombuffer(rng.bytes(out.size * 2), np.uint16).reshape(out.shape)
        out += noise & _NOISE_MASK


_PATTERNS: dict[tuple[int, int, int], _Pattern] = {}
_PATTERN_LOCK = threading.Lock()


def make_slab(
    shape: tuple[int, int, int], z0: int, z1: int, seed: int = 0, dtype: str = "uint16"
) -> np.ndarray:
    """Planes ``z0:z1`` of the deterministic test volume of ``shape`` (uint16, or uint8).

    Each plane depends only on ``(shape[1:], seed, z)``, so the volume is the same
    whatever the slab size. The uint8 volume is the uint16 one shifted right by 4 bits.
    """
    key = (shape[1], shape[2], seed)
    with _PATTERN_LOCK:
        pat = _PATTERNS.get(key)
        if pat is None:
            pat = _PATTERNS[key] = _Pattern((shape[1], shape[2]), seed)
    slab = np.empty((z1 - z0, shape[1], shape[2]), DTYPE)
    for i, z in enumerate(range(z0, z1)):
        pat.plane(z, seed, slab[i])
    return _as_dtype(slab, dtype)


def _as_dtype(slab: np.ndarray, dtype: str) -> np.ndarray:
    """The uint16 slab in ``dtype`` (uint8: the top 8 of its 12 significant bits)."""
    if np.dtype(dtype) == slab.dtype:
        return slab
    if np.dtype(dtype) == np.uint8:
        return (slab >> 4).astype(np.uint8)
    raise ValueError(f"no test data for dtype {dtype!r}; choose from {list(_DTYPES)}")


# ---------------------------------------------------------------- writing


def stored_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def _is_complete(path: Path, spec: dict[str, Any]) -> bool:
    import zarr

    try:
        arr = zarr.open_array(str(path), mode="r")
        got = dict(arr.attrs.get("gpu_zarr_bench", {}))  # type: ignore[arg-type]
    except Exception:
        return False
    return bool(got.pop("complete", False)) and got == spec


def _codec_kwargs(lay: Layout) -> dict[str, Any]:
    """``compressors``/``filters``/``shards`` for ``zarr.create_array``."""
    import numcodecs
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    kwargs: dict[str, Any] = {}
    v2 = lay.zarr_format == 2
    if lay.codec == "raw":
        comp = None
    elif lay.codec == "zstd":
        comp = numcodecs.Zstd(level=lay.level) if v2 else ZstdCodec(level=lay.level)
    elif lay.codec in ("zstd-crc32c", "numcodecs-zstd", "delta-zstd", "shuffle-lz4"):
        return _chain_kwargs(lay)
    elif lay.codec == "gzip":
        comp = numcodecs.GZip(level=lay.level) if v2 else GzipCodec(level=lay.level)
    else:  # blosc-<cname>-<shuffle>
        _, cname, shuffle = lay.codec.split("-")
        if v2:
            mode = numcodecs.Blosc.BITSHUFFLE if shuffle == "bitshuffle" else numcodecs.Blosc.SHUFFLE
            comp = numcodecs.Blosc(cname=cname, clevel=5, shuffle=mode, blocksize=0)
        else:
            comp = BloscCodec(cname=cname, clevel=5, shuffle=shuffle, typesize=lay.np_dtype.itemsize)  # type: ignore[arg-type]
    kwargs["compressors"] = comp
    if v2:
        kwargs["filters"] = None
    else:
        if lay.shards is not None:
            kwargs["shards"] = lay.shards
        if lay.endian == "big":
            from zarr.codecs import BytesCodec

            kwargs["serializer"] = BytesCodec(endian="big")
    return kwargs


def _numcodecs_v3() -> Any:
    """zarr v3's wrappers of numcodecs codecs: in zarr from 3.2, in numcodecs.zarr3 before."""
    try:
        from zarr.codecs import numcodecs as nc
    except ImportError:
        import numcodecs.zarr3 as nc  # type: ignore[no-redef]
    return nc


def _chain_kwargs(lay: Layout) -> dict[str, Any]:
    """``compressors``/``filters``/``shards`` of the chain layouts (:data:`CHAIN_LAYOUTS`)."""
    import numcodecs
    from zarr.codecs import Crc32cCodec, ZstdCodec

    v2 = lay.zarr_format == 2
    kwargs: dict[str, Any] = {"filters": None}
    if lay.codec == "zstd-crc32c":
        kwargs["compressors"] = [ZstdCodec(level=lay.level), Crc32cCodec()]
    elif lay.codec == "numcodecs-zstd":
        kwargs["compressors"] = [_numcodecs_v3().Zstd(level=lay.level)]
    elif lay.codec == "shuffle-lz4":
        size = lay.np_dtype.itemsize
        if v2:
            kwargs.update(filters=[numcodecs.Shuffle(elementsize=size)], compressors=numcodecs.LZ4())
        else:
            kwargs.update(compressors=[_numcodecs_v3().Shuffle(elementsize=size), _numcodecs_v3().LZ4()])
    else:  # delta-zstd
        dt = lay.np_dtype.str
        if v2:
            kwargs.update(filters=[numcodecs.Delta(dtype=dt)], compressors=numcodecs.Zstd(level=lay.level))
        else:
            kwargs.update(filters=[_numcodecs_v3().Delta(dtype=dt)], compressors=[ZstdCodec(level=lay.level)])
    if not v2 and lay.shards is not None:
        kwargs["shards"] = lay.shards
    return kwargs


def _create(path: Path, lay: Layout, shape: tuple[int, ...], spec: dict[str, Any]) -> Any:
    import zarr

    if path.exists():
        shutil.rmtree(path)
    return zarr.create_array(
        store=str(path),
        shape=shape,
        chunks=lay.chunks,
        dtype=lay.np_dtype,
        fill_value=0,
        zarr_format=2 if lay.zarr_format == 2 else 3,
        attributes={"gpu_zarr_bench": {**spec, "complete": False}},
        overwrite=True,
        **_codec_kwargs(lay),
    )


def _slab_planes(layouts: list[Layout], shape: tuple[int, ...], target_bytes: int) -> int:
    """Planes per slab: a multiple of every layout's z-extent of a chunk or shard."""
    step = 1
    for lay in layouts:
        zc = (lay.shards or lay.chunks)[0]
        step = step * zc // math.gcd(step, zc)
    plane_bytes = shape[1] * shape[2] * DTYPE.itemsize
    n = max(1, target_bytes // max(1, plane_bytes * step))
    return min(step * n, max(step, shape[0]))


_Todo = list[tuple[Layout, Path, dict[str, Any]]]


def _check_space(base: Path, todo: _Todo, nbytes: int) -> None:
    """Refuse to start writing volumes that would not fit (raw about 1x, compressed 0.8x)."""
    need = sum(nbytes * lay.np_dtype.itemsize / DTYPE.itemsize * (1.0 if lay.codec == "raw" else 0.8)
               for lay, _, _ in todo)
    free = shutil.disk_usage(base).free
    if need > free * 0.95:
        raise RuntimeError(
            f"not enough disk space in {base}: the volumes need about {need / 2**30:.1f} GiB, "
            f"{free / 2**30:.1f} GiB free; choose another --workdir or a smaller --size"
        )


def _fill(
    arrays: list[tuple[Layout, Path, dict[str, Any], Any]],
    shape: tuple[int, int, int],
    seed: int,
    total: int,
    progress: Callable[[int, int], None] | None,
    threads: int | None,
) -> None:
    """Write the data into every array in one pass: each slab of planes is generated once (on
    worker threads) and written to every array; then each array is marked complete."""
    import zarr

    planes = _slab_planes([lay for lay, *_ in arrays], shape, 256 << 20)
    slabs = [(z, min(z + planes, shape[0])) for z in range(0, shape[0], planes)]
    ncpu = os.cpu_count() or 4
    workers = threads or max(2, min(8, ncpu // 2))

    def write_slab(z0: int, z1: int) -> int:
        slab = make_slab(shape, z0, z1, seed)
        as_dtype: dict[str, np.ndarray] = {DTYPE.name: slab}
        written = 0
        for lay, _path, _spec, arr in arrays:
            data = as_dtype.get(lay.dtype)
            if data is None:
                data = as_dtype[lay.dtype] = _as_dtype(slab, lay.dtype)
            arr[z0:z1] = data
            written += data.nbytes
        return written

    with zarr.config.set(
        {"async.concurrency": max(64, 4 * ncpu), "threading.max_workers": max(8, ncpu)}
    ):
        with ThreadPoolExecutor(max_workers=workers) as pool:
            done = 0  # summed in this thread, as the slabs' results come back
            for n in pool.map(lambda s: write_slab(*s), slabs):
                done += n
                if progress is not None:
                    progress(done, total)
        for _lay, _path, spec, arr in arrays:
            arr.attrs["gpu_zarr_bench"] = {**spec, "complete": True}


def _write_volumes(
    base: Path,
    todo: _Todo,
    shape: tuple[int, int, int],
    seed: int,
    log: Callable[[str], None],
    progress: Callable[[int, int], None] | None,
    threads: int | None,
) -> dict[str, VolumeInfo]:
    """Create and write the volumes of ``todo``; returns them by layout name."""
    nbytes = math.prod(shape) * DTYPE.itemsize
    _check_space(base, todo, nbytes)
    log(
        f"writing {len(todo)} volume(s) of shape {tuple(shape)} "
        f"({nbytes / 2**30:.2f} GiB each as uint16) under {base}: "
        + ", ".join(lay.name + ("" if lay.dtype == DTYPE.name else f" ({lay.dtype})") for lay, _, _ in todo)
    )
    t0 = time.perf_counter()
    arrays = [(lay, path, spec, _create(path, lay, shape, spec)) for lay, path, spec in todo]
    total = sum(nbytes * lay.np_dtype.itemsize // DTYPE.itemsize for lay, *_ in arrays)
    _fill(arrays, shape, seed, total, progress, threads)
    dt = time.perf_counter() - t0
    log(f"wrote {total / 2**30:.2f} GiB in {dt:.1f} s ({total / 2**30 / dt:.2f} GiB/s)")
    return {lay.name: VolumeInfo(lay.name, path, tuple(shape), lay.dtype, False, dt, stored_bytes(path), lay)
            for lay, path, _spec, _arr in arrays}


def ensure_volumes(
    workdir: Path,
    group: str,
    layouts: list[Layout],
    shape: tuple[int, int, int],
    *,
    seed: int = 0,
    rewrite: bool = False,
    log: Callable[[str], None] = print,
    progress: Callable[[int, int], None] | None = None,
    threads: int | None = None,
) -> list[VolumeInfo]:
    """Create (or reuse) one zarr array per layout under ``workdir/group``.

    All missing volumes are written in one pass over the data: each slab of planes
    is generated once and written to every layout that needs it.

    Parameters
    ----------
    progress
        Called as ``progress(done_bytes, total_bytes)`` while writing.
    """
    base = Path(workdir) / group / "x".join(str(s) for s in shape)
    base.mkdir(parents=True, exist_ok=True)
    infos: dict[str, VolumeInfo] = {}
    todo: _Todo = []
    for lay in layouts:
        path = base / f"{lay.name}.zarr"
        spec = lay.spec(shape, seed)
        if not rewrite and _is_complete(path, spec):
            infos[lay.name] = VolumeInfo(lay.name, path, tuple(shape), lay.dtype, True, 0.0, stored_bytes(path), lay)
        else:
            todo.append((lay, path, spec))
    if todo:
        infos.update(_write_volumes(base, todo, shape, seed, log, progress, threads))
    return [infos[lay.name] for lay in layouts]


# ---------------------------------------------------------------- the user's store


def _codec_names(codecs: Any) -> list[str]:
    out = []
    for c in codecs or ():
        if c is None:
            continue
        cfg = c.get_config() if hasattr(c, "get_config") else getattr(c, "to_dict", lambda: {})()
        name = cfg.get("id") or cfg.get("name") or type(c).__name__
        extra = ",".join(f"{k}={v}" for k, v in cfg.items()
                         if k in ("cname", "clevel", "shuffle", "level") and v is not None)
        out.append(f"{name}({extra})" if extra else str(name))
    return out


def user_volume(path: str | os.PathLike[str], level: int = 0) -> VolumeInfo:
    """The user's array (or OME-Zarr image level ``level``), described read-only.

    Parameters
    ----------
    path
        A zarr array, or an OME-Zarr image group (then ``level`` picks the array).
    level
        OME-Zarr resolution level (ignored for a plain array).

    Raises
    ------
    gpu_zarr.errors.NotAZarrError
        ``path`` is neither a zarr array nor an OME-Zarr image (the message says what
        it found).
    """
    from gpu_zarr.omezarr import is_ome_zarr, read_omezarr
    from gpu_zarr.store import open_array

    p = Path(path)
    ome_level: int | None = None
    if is_ome_zarr(p):
        arr, _res = read_omezarr(p, level=level)
        ome_level = level
    else:
        arr = open_array(p)
    root = getattr(arr.store, "root", None)
    if root is None:
        raise ValueError(f"{path}: gpu-zarr bench reads local stores only (found {type(arr.store).__name__})")
    array_path = Path(root) / arr.path if arr.path else Path(root)
    if arr.ndim < 1:
        raise ValueError(f"{array_path}: a 0-d array has nothing to benchmark")
    meta: dict[str, Any] = {
        "label": f"{p.name}" + (f" level {ome_level}" if ome_level is not None else ""),
        "user_store": str(p),
        "ome_level": ome_level,
        "zarr_format": int(arr.metadata.zarr_format),
        "chunks": list(arr.chunks),
        "shards": None if arr.shards is None else list(arr.shards),
        "codec": "+".join(_codec_names(getattr(arr, "filters", ())) + _codec_names(arr.compressors))
        or "raw",
    }
    meta["chunk_bytes"] = math.prod(arr.chunks) * arr.dtype.itemsize
    name = p.name + (f"[{ome_level}]" if ome_level is not None else "")
    return VolumeInfo(name, array_path, tuple(int(s) for s in arr.shape), np.dtype(arr.dtype).name,
                      True, 0.0, stored_bytes(array_path), None, meta)
