"""A seeded corpus of damaged and hostile zarr stores, written into a temporary folder.

Every case is a folder ``<root>/<name>/`` holding an OME-Zarr image group ``img`` whose one
level ``img/0`` is the (damaged) array: plain-array entry points read ``img/0``, OME ones
read ``img``. Everything is deterministic: fixed seeds, fixed damage positions.

Case kinds:

- ``codec``: an intact store of every codec the project reads (the control group);
- ``damage``: one chunk (or one inner chunk of a shard) of a codec store damaged
  (truncations, bit and byte flips in header and body, same-length garbage, empty, another
  array's chunk that decodes bigger or smaller, shard-index lies);
- ``meta``: hostile metadata written by hand (overflowing, zero and negative shapes, absurd
  but honest shapes, unknown codecs, non-JSON, object dtypes, pickle, paths outside the store).

HCS plates (:class:`PlateCase`, :func:`build_plates`; written by ome-zarr-py through
tests/plates.py): a well with a truncated or garbage chunk, and well metadata that is hostile
(field paths leading out of the store, relative or absolute; ``images`` not a list; a field
whose array is pickled objects).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, ZstdCodec

SHAPE = (20, 24)
CHUNKS = (8, 8)
SHARDS = (16, 16)
DTYPE = "<u2"
#: the region read by the region entry points: it covers the damaged chunk (1, 1) whole
REGION = (slice(2, 20), slice(3, 21))
DAMAGED = (1, 1)  # chunk grid position (inner position (1, 1) of shard (0, 0) when sharded)

BLOSC_CNAMES = ("lz4", "lz4hc", "zstd", "zlib")
SHUFFLES = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}


@dataclass(frozen=True)
class Case:
    """One store of the corpus.

    Attributes
    ----------
    name : str
        Unique; also the folder name (so every clear message names it).
    kind : {"codec", "damage", "meta"}
    fmt : int
        Zarr format of the store.
    codec : str
        Base codec ("raw", "zstd", "blosc-lz4-1", "sharded-zstd", ...), "" for meta cases.
    chunk_key : str
        Key of the damaged chunk (the shard's key when sharded), "" when no chunk is damaged.
    inner : tuple of int or None
        Inner position of the damaged chunk in its shard.
    hostile_shape : bool
        Metadata whose shape could make a careless reader allocate too much or hang: read
        in a subprocess with a wall-clock and memory bound.
    """

    name: str
    kind: str
    fmt: int
    codec: str
    chunk_key: str = ""
    inner: tuple[int, ...] | None = None
    hostile_shape: bool = False

    def root(self, base: Path) -> Path:
        return base / self.name

    def array(self, base: Path) -> Path:
        return base / self.name / "img" / "0"

    def image(self, base: Path) -> Path:
        return base / self.name / "img"


# -- writing ---------------------------------------------------------------------------------
def values(seed: int = 0, shape: tuple[int, ...] = SHAPE) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # smooth plus noise: compressible (so codecs really compress) yet not constant
    base = np.add.outer(np.arange(shape[0]) * 7, np.arange(shape[1]) * 3)
    return (base + rng.integers(0, 40, size=shape)).astype(DTYPE)


def _v2_compressor(codec: str):
    if codec == "raw":
        return None
    if codec == "zstd":
        return numcodecs.Zstd(level=3)
    if codec == "gzip":
        return numcodecs.GZip(level=5)
    if codec == "zlib":
        return numcodecs.Zlib(level=5)
    if codec == "lz4":
        return numcodecs.LZ4()
    _, cname, shuffle = codec.split("-")
    return numcodecs.Blosc(cname=cname, clevel=5, shuffle=int(shuffle))


def _v3_chain(codec: str) -> list:
    if codec == "raw":
        return []
    if codec == "zstd":
        return [ZstdCodec(level=3)]
    if codec == "gzip":
        return [GzipCodec(level=5)]
    if codec in ("zlib", "lz4"):  # numcodecs' zarr v3 codecs (zarr v3 itself has neither)
        import warnings

        from numcodecs.zarr3 import LZ4, Zlib
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not in the Zarr v3 specification"
            return [Zlib(level=5) if codec == "zlib" else LZ4()]
    _, cname, shuffle = codec.split("-")
    return [BloscCodec(cname=cname, clevel=5, shuffle=SHUFFLES[int(shuffle)], typesize=2)]


def write_array(path: Path, fmt: int, codec: str, *, shape=SHAPE, chunks=CHUNKS, seed: int = 0) -> np.ndarray:
    """Write ``values(seed)`` as an array with ``codec``; return what was written."""
    vals = values(seed, shape)
    kw: dict = {}
    if codec.startswith("sharded-"):
        inner = [BytesCodec()] + _v3_chain(codec.removeprefix("sharded-"))
        kw["serializer"] = ShardingCodec(chunk_shape=chunks, codecs=inner, index_codecs=[BytesCodec(), Crc32cCodec()])
        kw["compressors"] = None
        chunks = SHARDS
    elif fmt == 2:
        kw["compressors"] = _v2_compressor(codec)
    else:
        kw["compressors"] = _v3_chain(codec) or None
    arr = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype=DTYPE, zarr_format=fmt, fill_value=0,
                            overwrite=True, **kw)
    arr[...] = vals
    return vals


def _ome_group(image: Path, fmt: int) -> None:
    """Make ``image`` an OME-NGFF image group (0.4 on v2, 0.5 on v3) whose level is ``0``."""
    ms = {"axes": [{"name": "y", "type": "space"}, {"name": "x", "type": "space"}],
          "datasets": [{"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1.0, 1.0]}]}]}
    image.mkdir(parents=True, exist_ok=True)
    if fmt == 2:
        (image / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
        (image / ".zattrs").write_text(json.dumps({"multiscales": [{**ms, "version": "0.4"}]}))
    else:
        (image / "zarr.json").write_text(json.dumps({
            "zarr_format": 3, "node_type": "group",
            "attributes": {"ome": {"version": "0.5", "multiscales": [ms]}}}))


def chunk_key(fmt: int, coords: tuple[int, ...]) -> str:
    return ".".join(map(str, coords)) if fmt == 2 else "c/" + "/".join(map(str, coords))


def codecs(fmt: int) -> list[str]:
    blosc = [f"blosc-{c}-{s}" for c in BLOSC_CNAMES for s in SHUFFLES]
    if fmt == 2:
        return ["raw", "zstd", "gzip", "zlib", "lz4", *blosc]
    return ["raw", "zstd", "gzip", "zlib", "lz4", *blosc, "sharded-raw", "sharded-zstd", "sharded-gzip",
            "sharded-lz4", "sharded-blosc-lz4-1", "sharded-blosc-zstd-2"]


# -- damages ---------------------------------------------------------------------------------
def _flip_bit(b: bytes, pos: int, bit: int = 0) -> bytes:
    a = bytearray(b)
    a[pos % len(a)] ^= 1 << bit
    return bytes(a)


def _garbage(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


#: damages of one whole chunk file: name -> new bytes from the old ones
CHUNK_DAMAGES: dict[str, Callable[[bytes], bytes]] = {
    "trunc-half": lambda b: b[: len(b) // 2],
    "trunc-1": lambda b: b[:1],
    "trunc-last": lambda b: b[:-1],
    "empty": lambda b: b"",
    "flip-header0": lambda b: _flip_bit(b, 0, 3),
    "flip-header3": lambda b: _flip_bit(b, 3, 1),
    "flip-header12": lambda b: _flip_bit(b, 12, 7),
    "flip-body": lambda b: _flip_bit(b, len(b) // 2, 4),
    "byte-last": lambda b: b[:-1] + bytes([b[-1] ^ 0xFF]),
    "garbage": lambda b: _garbage(len(b), 7),
    "extra": lambda b: b + b"\0" * 16,
}
#: damages that replace the chunk by one of another array (same codec)
OTHER_CHUNK = {"bigger": (16, 8), "smaller": (8, 4), "other-chunk": None}
#: damages of a shard (the damaged inner chunk is at ``DAMAGED``)
SHARD_DAMAGES = ("inner-flip", "inner-trunc", "index-offset-out", "index-size-huge", "index-size-0",
                 "index-overlap", "index-crc", "shard-trunc", "shard-empty")


def _damage_shard(path: Path, how: str) -> None:
    raw = path.read_bytes()
    n = (SHARDS[0] // CHUNKS[0]) * (SHARDS[1] // CHUNKS[1])
    isize = n * 16 + 4
    body, index = raw[:-isize], bytearray(raw[-isize:])
    table = np.frombuffer(bytes(index[: n * 16]), "<u8").reshape(n, 2).copy()
    k = DAMAGED[0] * (SHARDS[1] // CHUNKS[1]) + DAMAGED[1]
    off, nb = int(table[k, 0]), int(table[k, 1])
    if how == "inner-flip":
        path.write_bytes(_flip_bit(body, off + nb // 2, 2) + bytes(index))
        return
    if how == "inner-trunc":  # the inner chunk's last half replaced by the next bytes: same index
        path.write_bytes(body[: off + nb // 2] + _garbage(nb - nb // 2, 3) + body[off + nb:] + bytes(index))
        return
    if how == "shard-trunc":
        path.write_bytes(raw[: len(raw) // 2])
        return
    if how == "shard-empty":
        path.write_bytes(b"")
        return
    if how == "index-offset-out":
        table[k, 0] = len(raw) * 4
    elif how == "index-size-huge":
        table[k, 1] = 2**62
    elif how == "index-size-0":
        table[k, 1] = 0
    elif how == "index-overlap":  # the damaged chunk's entry points at chunk 0's bytes, 1 byte short
        table[k] = (table[0, 0], max(1, int(table[0, 1]) - 1))
    new = table.astype("<u8").tobytes()
    if how == "index-crc":
        crc = bytes(index[n * 16:])
        path.write_bytes(body + new + bytes([crc[0] ^ 1]) + crc[1:])
        return
    import google_crc32c

    # an honest checksum of a lying index: only the bounds checks can catch it
    path.write_bytes(body + new + google_crc32c.value(new).to_bytes(4, "little"))


# -- hostile metadata ------------------------------------------------------------------------
def _zarray(shape, chunks, *, dtype="<u2", compressor=None, filters=None, fill_value=0, order="C") -> dict:
    return {"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype, "compressor": compressor,
            "filters": filters, "fill_value": fill_value, "order": order}


def _zarrjson(shape, chunks, *, dtype="uint16", codecs=None, fill_value=0) -> dict:
    return {"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": fill_value, "codecs": codecs or [{"name": "bytes", "configuration": {"endian": "little"}}],
            "attributes": {}}


_BIG = 2**40
#: name -> (format, metadata (a dict, or raw bytes for non-JSON), hostile shape?, chunks to write)
META: dict[str, tuple[int, object, bool]] = {
    # shape products that wrap int64: 2**64 -> 0, 2**63 + ... -> negative
    "shape-wrap0-v2": (2, _zarray([2**32, 2**32], [1, 1], dtype="|u1"), True),
    "shape-wrap0-v3": (3, _zarrjson([2**32, 2**32], [1, 1], dtype="uint8"), True),
    "shape-wrapneg-v2": (2, _zarray([2**62, 3], [2**20, 1]), True),
    "shape-wrapneg-v3": (3, _zarrjson([2**62, 3], [2**20, 1]), True),
    "shape-huge-chunk-v2": (2, _zarray([2**31, 2**31], [2**31, 2**31], dtype="|u1"), True),
    "shape-huge-chunk-v3": (3, _zarrjson([2**40, 2**40], [2**40, 2**40], dtype="uint8"), True),
    "shape-6tib-v2": (2, _zarray([3 * 2**20, 2**20], [4096, 4096]), True),
    "shape-6tib-v3": (3, _zarrjson([3 * 2**20, 2**20], [4096, 4096]), True),
    "shape-big-v3": (3, _zarrjson([_BIG, _BIG, 7], [64, 64, 7]), True),
    "shape-zero-v2": (2, _zarray([0, 24], [8, 8]), False),
    "shape-zero-v3": (3, _zarrjson([20, 0], [8, 8]), False),
    "shape-negative-v2": (2, _zarray([-20, 24], [8, 8]), False),
    "shape-negative-v3": (3, _zarrjson([20, -24], [8, 8]), False),
    "chunks-zero-v2": (2, _zarray([20, 24], [0, 8]), False),
    "chunks-zero-v3": (3, _zarrjson([20, 24], [8, 0]), False),
    "chunks-negative-v2": (2, _zarray([20, 24], [-8, 8]), False),
    "codec-unknown-v2": (2, _zarray([20, 24], [8, 8], compressor={"id": "no-such-codec"}), False),
    "codec-unknown-v3": (3, _zarrjson([20, 24], [8, 8], codecs=[{"name": "bytes"}, {"name": "no-such-codec"}]),
                         False),
    "filter-unknown-v2": (2, _zarray([20, 24], [8, 8], filters=[{"id": "no-such-filter"}]), False),
    "dtype-unknown-v2": (2, _zarray([20, 24], [8, 8], dtype="<q9"), False),
    "dtype-unknown-v3": (3, _zarrjson([20, 24], [8, 8], dtype="uint99"), False),
    "object-pickle-v2": (2, _zarray([20, 24], [8, 8], dtype="|O", filters=[{"id": "pickle", "protocol": 5}]),
                         False),
    "object-pickle-compressor-v2": (2, _zarray([20, 24], [8, 8], dtype="|O", compressor={"id": "pickle"}), False),
    "pickle-filter-u2-v2": (2, _zarray([20, 24], [8, 8], filters=[{"id": "pickle", "protocol": 5}]), False),
    "object-nofilter-v2": (2, _zarray([20, 24], [8, 8], dtype="|O"), False),
    "object-vlen-v2": (2, _zarray([20, 24], [8, 8], dtype="|O", filters=[{"id": "vlen-utf8"}]), False),
    "nonjson-v2": (2, b"\x00\xffnot json{", False),
    "nonjson-v3": (3, b"{\"zarr_format\": 3, \"node_type\": ", False),
    "json-list-v2": (2, b"[1, 2, 3]", False),
    "json-list-v3": (3, b"[1, 2, 3]", False),
    "fill-bad-v3": (3, _zarrjson([20, 24], [8, 8], fill_value="not a number"), False),
}
#: OME groups whose metadata points outside the store (the array itself is a good one)
OME_META = ("ome-path-parent", "ome-path-absolute", "ome-path-missing", "ome-axes-wrong", "ome-nonjson-attrs",
            "ome-multiscales-notlist", "group-pickle-member")


def _write_meta(arr: Path, fmt: int, meta: object) -> None:
    arr.mkdir(parents=True, exist_ok=True)
    name = ".zarray" if fmt == 2 else "zarr.json"
    (arr / name).write_bytes(meta if isinstance(meta, bytes) else json.dumps(meta).encode())


def _write_ome_hostile(case_root: Path, how: str, outside: Path) -> None:
    image = case_root / "img"
    write_array(image / "0", 2, "zstd")
    _ome_group(image, 2)
    attrs = json.loads((image / ".zattrs").read_text())
    ds = attrs["multiscales"][0]["datasets"][0]
    if how == "ome-path-parent":
        ds["path"] = "../../" + outside.name + "/0"
    elif how == "ome-path-absolute":
        ds["path"] = str(outside / "0")
    elif how == "ome-path-missing":
        ds["path"] = "7"
    elif how == "ome-axes-wrong":
        attrs["multiscales"][0]["axes"] = [{"name": "x", "type": "space"}]
    elif how == "ome-multiscales-notlist":
        attrs["multiscales"] = "yes"
    if how == "group-pickle-member":  # a plain group: the napari reader lists its arrays
        (image / ".zattrs").write_text("{}")
        bad = image / "bad"
        _write_meta(bad, 2, _zarray([20, 24], [8, 8], dtype="|O", filters=[{"id": "pickle", "protocol": 5}]))
        (bad / "0.0").write_bytes(b"\x80\x05N.")
        return
    if how == "ome-nonjson-attrs":
        (image / ".zattrs").write_bytes(b"\x00{multiscales")
    else:
        (image / ".zattrs").write_text(json.dumps(attrs))


# -- the corpus ------------------------------------------------------------------------------
#: Blosc variants whose chunks are damaged in the default (CI) corpus: every cname and every
#: shuffle at least once; ``GPU_ZARR_FUZZ_FULL=1`` damages all twelve
DAMAGED_BLOSC = ("blosc-lz4-0", "blosc-lz4-1", "blosc-lz4hc-2", "blosc-zstd-0", "blosc-zstd-2", "blosc-zlib-1")


def full() -> bool:
    return os.environ.get("GPU_ZARR_FUZZ_FULL", "") not in ("", "0")


def cases() -> list[Case]:
    """Every case, in a fixed order (the names are the test ids)."""
    out: list[Case] = []
    for fmt in (2, 3):
        for codec in codecs(fmt):
            out.append(Case(f"v{fmt}-{codec}", "codec", fmt, codec))
            if codec.startswith("blosc-") and codec not in DAMAGED_BLOSC and not full():
                continue
            if codec.startswith("sharded-"):
                key = chunk_key(fmt, (0, 0))
                out.extend(Case(f"v{fmt}-{codec}-{d}", "damage", fmt, codec, key, DAMAGED) for d in SHARD_DAMAGES)
                continue
            key = chunk_key(fmt, DAMAGED)
            out.extend(Case(f"v{fmt}-{codec}-{d}", "damage", fmt, codec, key) for d in CHUNK_DAMAGES)
            out.extend(Case(f"v{fmt}-{codec}-{d}", "damage", fmt, codec, key) for d in OTHER_CHUNK)
    for name, (fmt, _, hostile) in META.items():
        out.append(Case(name, "meta", fmt, "", hostile_shape=hostile))
    out.extend(Case(name, "meta", 2, "") for name in OME_META)
    return out


def _damage_of(case: Case) -> str:
    return case.name.removeprefix(f"v{case.fmt}-{case.codec}-")


def build(base: Path) -> list[Case]:
    """Write the whole corpus under ``base``; return its cases."""
    outside = base / "_outside"  # a good array outside every case's store
    write_array(outside / "0", 2, "raw", seed=5)
    all_cases = cases()
    for case in all_cases:
        root = case.root(base)
        if case.kind == "meta":
            if case.name in META:
                fmt, meta, _ = META[case.name]
                _write_meta(case.array(base), fmt, meta)
                _ome_group(case.image(base), fmt)
                if case.name.startswith(("object-", "pickle-")):  # a chunk for the codec to be asked about
                    (case.array(base) / "0.0").write_bytes(b"\x80\x05N.")  # pickle of None
            else:
                _write_ome_hostile(root, case.name, outside)
            continue
        arr = case.array(base)
        write_array(arr, case.fmt, case.codec)
        _ome_group(case.image(base), case.fmt)
        if case.kind != "damage":
            continue
        how = _damage_of(case)
        chunk = arr / case.chunk_key
        if case.codec.startswith("sharded-"):
            _damage_shard(chunk, how)
        elif how in CHUNK_DAMAGES:
            chunk.write_bytes(CHUNK_DAMAGES[how](chunk.read_bytes()))
        elif how == "other-chunk":  # chunk (0, 0) of this array, in chunk (1, 1)'s place: valid data
            chunk.write_bytes((arr / chunk_key(case.fmt, (0, 0))).read_bytes())
        else:
            other = base / "_other" / case.name
            write_array(other, case.fmt, case.codec, shape=OTHER_CHUNK[how], chunks=OTHER_CHUNK[how], seed=3)
            chunk.write_bytes((other / chunk_key(case.fmt, (0, 0))).read_bytes())
            shutil.rmtree(other)
    return all_cases


def digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (its relative path -> hex digest)."""
    out = {}
    for dirpath, _, files in os.walk(folder):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def iter_names() -> Iterator[str]:
    yield from (c.name for c in cases())


# -- HCS plates ------------------------------------------------------------------------------
#: every plate: one row "A", two wells A/1 and A/2 of one field each, one level ``s0`` of
#: PLATE_SHAPE (czyx) in PLATE_CHUNKS, written by ome-zarr-py (tests/plates.py); well A/2 is
#: the damaged or hostile one
PLATE_SHAPE = (1, 1, 16, 24)
PLATE_CHUNKS = (1, 1, 8, 8)
PLATE_WELLS = ("A/1", "A/2")
PLATE_BAD_WELL = "A/2"
PLATE_LEVEL = "s0"
#: the region the plate entry points read: both wells, the damaged chunk (0, 0, 1, 1) of A/2 whole
PLATE_REGION = (0, 0, slice(2, 15), slice(3, 45))
#: damages of a plate: a chunk of well A/2 (chunk-*), or A/2's well metadata (well-*)
PLATE_DAMAGES = ("chunk-trunc", "chunk-garbage", "well-path-outside", "well-path-absolute", "well-images-notlist",
                 "well-pickle-field")


@dataclass(frozen=True)
class PlateCase:
    """One HCS plate of the corpus (its folder ``<base>/<name>`` is the plate group)."""

    name: str
    version: str  # "0.4" (zarr v2) or "0.5" (zarr v3)
    damage: str

    @property
    def fmt(self) -> int:
        return 2 if self.version == "0.4" else 3

    @property
    def chunk_key(self) -> str:
        """Key of the damaged chunk in its array (``A/2/0/s0``), "" for metadata damages."""
        if not self.damage.startswith("chunk-"):
            return ""
        return ("" if self.fmt == 2 else "c/") + "0/0/1/1"

    def root(self, base: Path) -> Path:
        return base / self.name

    def well(self, base: Path) -> Path:
        return base / self.name / PLATE_BAD_WELL

    def field_array(self, base: Path, well: str) -> Path:
        return base / self.name / well / "0" / PLATE_LEVEL


def plate_cases() -> list[PlateCase]:
    """The plate cases: each damage once, on 0.4 or 0.5 (chunk truncation on both)."""
    out = [PlateCase("plate-v04-chunk-trunc", "0.4", "chunk-trunc")]
    for i, d in enumerate(PLATE_DAMAGES):
        v = "0.5" if i % 2 == 0 else "0.4"
        out.append(PlateCase(f"plate-v{v.replace('.', '')}-{d}", v, d))
    return out


def _well_meta(well: Path, version: str, edit: Callable[[dict], None]) -> None:
    """Edit a well group's ``well`` metadata in place."""
    f = well / (".zattrs" if version == "0.4" else "zarr.json")
    doc = json.loads(f.read_text())
    attrs = doc if version == "0.4" else doc["attributes"]["ome"]
    edit(attrs["well"])
    f.write_text(json.dumps(doc))


def build_plates(base: Path) -> list[PlateCase]:
    """Write every plate case under ``base`` (two plates written, then copied and damaged)."""
    from plates import write_plate

    kw = {"rows": "A", "columns": ("1", "2"), "wells": PLATE_WELLS, "fields": 1, "shape": PLATE_SHAPE,
          "chunks": PLATE_CHUNKS, "levels": 1, "drop_well": None, "drop_field": None}
    good = {v: write_plate(base / "_plates" / f"good-{v}.zarr", version=v, seed=3, **kw) for v in ("0.4", "0.5")}
    # an image outside every plate, with other values: a well pointing to it must not show them
    other = write_plate(base / "_plates" / "other.zarr", version="0.4", seed=11, **kw)
    shutil.copytree(other / "A" / "1" / "0", base / "_outside_img")
    cases = plate_cases()
    for case in cases:
        root = case.root(base)
        shutil.copytree(good[case.version], root)
        bad = case.well(base)
        if case.damage.startswith("chunk-"):
            chunk = case.field_array(base, PLATE_BAD_WELL) / case.chunk_key
            raw = chunk.read_bytes()
            chunk.write_bytes(raw[: len(raw) // 2] if case.damage == "chunk-trunc" else _garbage(len(raw), 9))
        elif case.damage == "well-path-outside":  # relative, from <root>/A/2 to <base>/_outside_img
            _well_meta(bad, case.version, lambda w: w.update(images=[{"path": "../../../_outside_img"}]))
        elif case.damage == "well-path-absolute":
            _well_meta(bad, case.version, lambda w: w.update(images=[{"path": str(base / "_outside_img")}]))
        elif case.damage == "well-images-notlist":
            _well_meta(bad, case.version, lambda w: w.update(images="yes"))
        elif case.damage == "well-pickle-field":
            arr = case.field_array(base, PLATE_BAD_WELL)
            assert case.fmt == 2, "pickle is a zarr v2 filter"
            _write_meta(arr, 2, _zarray(list(PLATE_SHAPE), list(PLATE_CHUNKS), dtype="|O",
                                        filters=[{"id": "pickle", "protocol": 5}]))
    return cases
