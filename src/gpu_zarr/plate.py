"""OME-NGFF high-content screening (HCS) plates and wells, as lazy tiled arrays.

A plate (``plate`` metadata: rows, columns, wells, acquisitions) holds wells (``well``
metadata: fields of view), each field an OME-Zarr multiscale image. :func:`open_plate`
reads the plate's metadata and its first well's first field (levels, axes, channels);
:meth:`Plate.level` gives one resolution level as a :class:`TiledArray`: every well's
field placed in the plate's row/column grid, exactly as napari-ome-zarr and ome-zarr-py
tile it (each tile the first field's shape at that level, missing wells or fields filled).
A well opens (:func:`open_well`) as the almost-square grid of its fields, as
ome-zarr-py's ``Well`` does. OME-NGFF 0.4 (zarr v2) and 0.5 (zarr v3). Read-only.

Reads are lazy: only the metadata of the plate, the first well and the first field is
read when a plate opens; each tile's well and field metadata are read the first time a
read touches the tile. A read gathers the tiles it touches and reads the chunks of all of
them with ONE engine read (:func:`gpu_zarr.engine.read_many`: native threads for a small
read, GPU decode for a big one), into their places in the result. Tiles one engine read
cannot serve together (another codec, dtype or chunk shape than the others, a backend
other than the engine's, a remote store, a stepped selection, a GPU-resident level) are read
one by one and concurrently, each through :class:`gpu_zarr.lazy.GpuLazyArray`; missing
wells and fields are filled. ``TiledArray.read_counts`` says which path served the reads.

Examples
--------
>>> from gpu_zarr.plate import open_plate
>>> plate = open_plate("plate.ome.zarr")                  # doctest: +SKIP
>>> plate.rows, plate.columns, len(plate.wells)           # doctest: +SKIP
(['A', 'B'], ['1', '2', '3'], 5)
>>> view = plate.level(1)                                 # doctest: +SKIP
>>> tile = view[0, 0, 0, :256, :256]                      # host numpy
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr

from .errors import GpuZarrError, InvalidOmeMetadata, NotOmeZarrError, UnsupportedArrayError
from .location import path_and_options
from .omezarr import OmeImage, check_inside, ome_attrs, open_node, open_ome

__all__ = [
    "Plate",
    "TiledArray",
    "Well",
    "WellRef",
    "is_plate",
    "is_plate_attrs",
    "is_well",
    "is_well_attrs",
    "open_plate",
    "open_well",
]


@dataclass(frozen=True)
class WellRef:
    """One well listed in a plate's metadata.

    Attributes
    ----------
    path : str
        Path relative to the plate, ``"<row>/<column>"`` (e.g. ``"A/1"``).
    row, column : int
        Indices into the plate's rows and columns.
    name : str
        Row name and column name together (e.g. ``"A1"``).
    """

    path: str
    row: int
    column: int
    name: str


@dataclass
class Well:
    """An HCS well: its fields of view.

    Attributes
    ----------
    path : str
        Location of the well group.
    version : str
        OME-NGFF version (``"0.4"``, ``"0.5"``).
    fields : list of str
        Field paths relative to the well, in metadata order.
    acquisitions : list of int or None
        The acquisition id of each field (None when not given).
    image : OmeImage
        Metadata of the first field (levels, axes, channels).
    storage_options : dict
        The remote store's options; every field opens with them (not in the repr).
    """

    path: str
    version: str
    fields: list[str]
    acquisitions: list[int | None]
    image: OmeImage
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def grid(self) -> tuple[int, int]:
        """(rows, columns) of the almost-square field grid (ome-zarr-py's)."""
        return _field_grid(len(self.fields))

    @property
    def levels(self) -> int:
        """Number of resolution levels (the first field's)."""
        return len(self.image.levels)

    def field_path(self, index: int = 0) -> str:
        """Location of one field's image group."""
        return _join(self.path, self.fields[index])

    def level(self, level: int = 0, *, backend: str = "auto", fill_value: Any = 0,
              kind: type[TiledArray] | None = None) -> TiledArray:
        """One resolution level as the grid of the well's fields (lazy).

        Parameters
        ----------
        level : int
            Index into the first field's levels (negative counts from the smallest).
        backend : {"auto", "kvikio", "zarr-gpu", "cpu"}
            How each field is read.
        fill_value : scalar
            Value of grid cells without a field (or whose field is missing).
        kind : subclass of TiledArray, optional
            The class of the result (napari's reader: one that gives napari's tile lazily).
        """
        lv = _check_level(level, len(self.image.levels), self.path)
        ds = self.image.levels[lv]
        rows, cols = self.grid
        cells: dict[tuple[int, int], _Cell] = {}
        for i, f in enumerate(self.fields):
            cells[(i // cols, i % cols)] = _Cell(_join(_join(self.path, f), ds.path),
                                                 storage_options=self.storage_options)
        return (kind or TiledArray)(ds.shape, ds.dtype, (rows, cols), cells, backend=backend,
                                    fill_value=fill_value, name=f"{self.path} level {lv}")

    def views(self, **kwargs: Any) -> list[TiledArray]:
        """Every level as a :class:`TiledArray`, highest resolution first."""
        return [self.level(i, **kwargs) for i in range(self.levels)]


@dataclass
class Plate:
    """An HCS plate: its grid, wells and acquisitions, and its first field's image metadata.

    Attributes
    ----------
    path : str
        Location of the plate group.
    version : str
        OME-NGFF version (``"0.4"``, ``"0.5"``).
    name : str
        Plate name (the metadata's, or the folder's).
    rows, columns : list of str
        Row and column names.
    wells : list of WellRef
        Wells listed in the metadata (plates need not fill every cell).
    acquisitions : list of dict
        The plate's ``acquisitions`` entries (``id``, ``name``, ``maximumfieldcount``...).
    field_count : int or None
        The metadata's ``field_count``.
    first_well : Well
        The first well (in sorted path order, as napari-ome-zarr takes it).
    image : OmeImage
        Metadata of the first well's first field: levels, axes, channels.
    storage_options : dict
        The remote store's options; every well and field opens with them (not in the repr).
    """

    path: str
    version: str
    name: str
    rows: list[str]
    columns: list[str]
    wells: list[WellRef]
    acquisitions: list[dict[str, Any]] = field(default_factory=list)
    field_count: int | None = None
    first_well: Well | None = None
    image: OmeImage | None = None
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def levels(self) -> int:
        """Number of resolution levels (the first field's)."""
        assert self.image is not None
        return len(self.image.levels)

    @property
    def grid(self) -> tuple[int, int]:
        """(rows, columns) of the plate."""
        return len(self.rows), len(self.columns)

    def well(self, name_or_path: str) -> Well:
        """Open one well by name (``"A1"``) or path (``"A/1"``)."""
        for w in self.wells:
            if name_or_path in (w.name, w.path):
                return open_well(_join(self.path, w.path), storage_options=self.storage_options)
        raise KeyError(f"no well {name_or_path!r} in {self.path}: wells are {[w.name for w in self.wells]}")

    def level(self, level: int = 0, *, field_index: int = 0, acquisition: int | None = None,
              backend: str = "auto", fill_value: Any = 0, kind: type[TiledArray] | None = None) -> TiledArray:
        """One resolution level as the plate's grid of wells (lazy).

        Each well contributes one field, placed at its row and column; every tile has the
        shape of the first well's first field at this level (as in napari-ome-zarr).

        Parameters
        ----------
        level : int
            Index into the first field's levels (negative counts from the smallest).
        field_index : int
            Which field of each well (0: the first, napari-ome-zarr's choice).
        acquisition : int, optional
            Count ``field_index`` among the fields of this acquisition only.
        backend : {"auto", "kvikio", "zarr-gpu", "cpu"}
            How each well's field is read.
        fill_value : scalar
            Value of cells without a well, or whose well or field is missing.
        kind : subclass of TiledArray, optional
            The class of the result (napari's reader: one that gives napari's tile lazily).
        """
        assert self.image is not None
        lv = _check_level(level, len(self.image.levels), self.path)
        ds = self.image.levels[lv]
        cells = {(w.row, w.column): _Cell(_join(self.path, w.path), well=True, level_path=ds.path,
                                          field_index=field_index, acquisition=acquisition,
                                          storage_options=self.storage_options)
                 for w in self.wells}
        return (kind or TiledArray)(ds.shape, ds.dtype, self.grid, cells, backend=backend,
                                    fill_value=fill_value, name=f"{self.path} level {lv}")

    def views(self, **kwargs: Any) -> list[TiledArray]:
        """Every level as a :class:`TiledArray`, highest resolution first."""
        return [self.level(i, **kwargs) for i in range(self.levels)]

    def well_names(self) -> list[list[str | None]]:
        """The plate grid of well names (None where no well is listed)."""
        grid: list[list[str | None]] = [[None] * len(self.columns) for _ in self.rows]
        for w in self.wells:
            grid[w.row][w.column] = w.name
        return grid


def _join(base: str, sub: str) -> str:
    if "://" in base:
        return base.rstrip("/") + "/" + sub
    return os.path.join(base, sub)


def _check_level(level: int, n: int, path: str) -> int:
    if not isinstance(level, int) or isinstance(level, bool):
        raise TypeError(f"level must be an int, got {type(level).__name__} {level!r}")
    if not -n <= level < n:
        raise IndexError(f"level {level} does not exist in {path}: the image has {n} level(s) "
                         f"(valid: 0..{n - 1}, or -{n}..-1)")
    return level % n


def _field_grid(n: int) -> tuple[int, int]:
    cols = max(1, math.ceil(math.sqrt(n)))
    return max(1, math.ceil(n / cols)), cols


def _names(raw: Any, key: str, where: str) -> list[str]:
    if not isinstance(raw, list) or not raw:
        raise InvalidOmeMetadata(f"{where}: plate '{key}' must be a non-empty list of {{'name': ...}}, found {raw!r}")
    out = []
    for r in raw:
        if not isinstance(r, Mapping) or "name" not in r:
            raise InvalidOmeMetadata(f"{where}: each plate '{key}' entry needs a 'name', found {r!r}")
        out.append(str(r["name"]))
    return out


def _group_ome(path: str, key: str, opts: Mapping[str, Any] | None = None) -> tuple[zarr.Group, dict[str, Any], str]:
    node = open_node(path, opts)
    if not isinstance(node, zarr.Group):
        raise NotOmeZarrError(f"expected an OME-Zarr {key} group at {path}, found a zarr array "
                              f"(shape {node.shape}); open its parent group instead")
    ome, version = ome_attrs(node.attrs)
    if not (is_plate_attrs if key == "plate" else is_well_attrs)(ome):
        raise NotOmeZarrError(f"expected OME-NGFF '{key}' metadata in {path}, found {sorted(ome) or 'no attributes'}")
    return node, ome, version


def _has(path: str | os.PathLike[str], key: str, storage_options: Mapping[str, Any] | None) -> bool:
    try:
        p, opts = path_and_options(path, storage_options)
        _group_ome(p, key, opts)
        return True
    except Exception:  # noqa: BLE001 - sniffing never raises
        return False


def is_plate_attrs(ome: Mapping[str, Any]) -> bool:
    """True when a group's OME attributes (:func:`gpu_zarr.omezarr.ome_attrs`) describe a plate."""
    return isinstance(ome.get("plate"), Mapping)


def is_well_attrs(ome: Mapping[str, Any]) -> bool:
    """True when a group's OME attributes (:func:`gpu_zarr.omezarr.ome_attrs`) describe a well."""
    return isinstance(ome.get("well"), Mapping)


def is_plate(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> bool:
    """True when ``path`` is a zarr group with OME-NGFF ``plate`` metadata. Never raises.

    ``storage_options``: options of a remote store (see :mod:`gpu_zarr.location`)."""
    return _has(path, "plate", storage_options)


def is_well(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> bool:
    """True when ``path`` is a zarr group with OME-NGFF ``well`` metadata. Never raises.

    ``storage_options``: options of a remote store (see :mod:`gpu_zarr.location`)."""
    return _has(path, "well", storage_options)


def _well_fields(ome: Mapping[str, Any], where: str) -> tuple[list[str], list[int | None]]:
    images = ome["well"].get("images")
    if not isinstance(images, list):
        raise InvalidOmeMetadata(f"{where}: well 'images' must be a list of {{'path': ...}}, found {images!r}")
    paths: list[str] = []
    acqs: list[int | None] = []
    for im in images:
        if not isinstance(im, Mapping) or "path" not in im:
            raise InvalidOmeMetadata(f"{where}: each well image needs a 'path', found {im!r}")
        check_inside(where, "well image path", str(im["path"]))  # never a field outside the well
        paths.append(str(im["path"]))
        a = im.get("acquisition")
        acqs.append(int(a) if isinstance(a, (int, float)) and not isinstance(a, bool) else None)
    return paths, acqs


def open_well(path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None) -> Well:
    """Read an HCS well's metadata and its first field's image metadata.

    Parameters
    ----------
    path : str or os.PathLike
        The well group (``well`` metadata).
    storage_options : mapping, optional
        Options of a remote store (see :mod:`gpu_zarr.location`); every field opens with them.

    Raises
    ------
    NotOmeZarrError
        A zarr node without ``well`` metadata.
    InvalidOmeMetadata
        Malformed well metadata, or a well without fields.
    """
    p, opts = path_and_options(path, storage_options)
    _, ome, version = _group_ome(p, "well", opts)
    fields, acqs = _well_fields(ome, p)
    if not fields:
        raise InvalidOmeMetadata(f"{p}: the well lists no fields (well 'images' is empty)")
    image = open_ome(_join(p, fields[0]), with_labels=False, storage_options=opts)
    return Well(path=p, version=version or image.version, fields=fields, acquisitions=acqs, image=image,
                storage_options=opts)


def open_plate(path: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None) -> Plate:
    """Read an HCS plate's metadata (rows, columns, wells, acquisitions) and its first field's.

    Parameters
    ----------
    path : str or os.PathLike
        The plate group (``plate`` metadata), OME-NGFF 0.4 (zarr v2) or 0.5 (zarr v3).
    storage_options : mapping, optional
        Options of a remote store (see :mod:`gpu_zarr.location`); every well opens with them.

    Returns
    -------
    Plate
        Its :meth:`Plate.level` views read the wells lazily.

    Raises
    ------
    NotOmeZarrError
        A zarr node without ``plate`` metadata.
    InvalidOmeMetadata
        Malformed plate metadata, no wells, or no readable first well.
    """
    p, opts = path_and_options(path, storage_options)
    _, ome, version = _group_ome(p, "plate", opts)
    meta = ome["plate"]
    rows = _names(meta.get("rows"), "rows", p)
    cols = _names(meta.get("columns"), "columns", p)
    raw_wells = meta.get("wells")
    if not isinstance(raw_wells, list) or not raw_wells:
        raise InvalidOmeMetadata(f"{p}: plate 'wells' must be a non-empty list of {{'path': ...}}, found {raw_wells!r}")
    wells: list[WellRef] = []
    for w in raw_wells:
        if not isinstance(w, Mapping) or "path" not in w:
            raise InvalidOmeMetadata(f"{p}: each plate well needs a 'path', found {w!r}")
        wp = str(w["path"])
        check_inside(p, "plate well path", wp, "A/1")  # rows or columns named '..' must not lead out
        parts = wp.split("/")
        if len(parts) != 2 or parts[0] not in rows or parts[1] not in cols:
            raise InvalidOmeMetadata(f"{p}: well path {wp!r} is not '<row>/<column>' of rows {rows} and columns {cols}")
        wells.append(WellRef(wp, rows.index(parts[0]), cols.index(parts[1]), parts[0] + parts[1]))
    wells.sort(key=lambda w: w.path)  # napari-ome-zarr's order: the first well is the first sorted path
    first: Well | None = None
    problems = []
    for w in wells:  # the first well that opens gives the shapes, as in napari-ome-zarr
        try:
            first = open_well(_join(p, w.path), storage_options=opts)
            break
        except GpuZarrError as exc:
            problems.append(f"{w.path}: {exc}")
    if first is None:
        raise InvalidOmeMetadata(f"{p}: no well of the plate could be opened ({'; '.join(problems[:3])})")
    acqs = [dict(a) for a in meta.get("acquisitions") or [] if isinstance(a, Mapping)]
    fc = meta.get("field_count")
    return Plate(path=p, version=version or first.version,
                 name=str(meta.get("name") or os.path.basename(p.rstrip("/")).removesuffix(".zarr")),
                 rows=rows, columns=cols, wells=wells, acquisitions=acqs,
                 field_count=int(fc) if isinstance(fc, int) else None, first_well=first, image=first.image,
                 storage_options=opts)


class _Cell:
    """One tile of a grid: an array path, or a well whose field is found on first use."""

    def __init__(self, path: str, *, well: bool = False, level_path: str = "", field_index: int = 0,
                 acquisition: int | None = None, storage_options: Mapping[str, Any] | None = None) -> None:
        self.path = path
        self.storage_options = dict(storage_options or {})
        self.well = well
        self.level_path = level_path
        self.field_index = field_index
        self.acquisition = acquisition
        self.lock = threading.Lock()
        self.resolved = False
        self.array: Any = None  # GpuLazyArray, or None when missing

    def array_path(self) -> str | None:
        if not self.well:
            return self.path
        _, ome, _ = _group_ome(self.path, "well", self.storage_options)
        fields, acqs = _well_fields(ome, self.path)
        if self.acquisition is not None:
            fields = [f for f, a in zip(fields, acqs, strict=True) if a == self.acquisition]
        if not 0 <= self.field_index < len(fields):
            return None
        return _join(_join(self.path, fields[self.field_index]), self.level_path)

    def get(self, backend: str) -> Any:
        """The tile's lazy array, or None when the well, field or array is missing."""
        with self.lock:
            if not self.resolved:
                from .lazy import GpuLazyArray
                from .store import open_array

                try:
                    ap = self.array_path()
                    self.array = None if ap is None else GpuLazyArray(open_array(ap, self.storage_options), backend)
                except (GpuZarrError, KeyError, FileNotFoundError):
                    self.array = None  # missing wells and fields are filled, not fatal
                self.resolved = True
            return self.array


def _axis_plan(sel: int | slice, tile: int, n_tiles: int) -> list[tuple[int, Any, slice | None]]:
    """Per tile touched along one grid axis: (tile index, key inside the tile, output slice).

    ``sel`` is normalised with a positive step; ints give (tile, local int, None).
    """
    if isinstance(sel, int):
        return [(sel // tile, sel % tile, None)]
    out: list[tuple[int, Any, slice | None]] = []
    start, stop, step = sel.start, sel.stop, sel.step
    r = range(start, stop, step)
    if len(r) == 0:
        return out
    pos = 0
    for t in range(r[0] // tile, min(n_tiles - 1, (r[-1]) // tile) + 1):
        lo, hi = t * tile, (t + 1) * tile
        sub = r[max(0, math.ceil((lo - start) / step)):max(0, math.ceil((hi - start) / step))]
        if len(sub) == 0:
            continue
        out.append((t, slice(sub[0] - lo, sub[-1] - lo + 1, step), slice(pos, pos + len(sub))))
        pos += len(sub)
    return out


class TiledArray:
    """A lazy array-like of tiles in a 2-D grid over the last two axes (a plate or well level).

    napari and numpy see one array (``shape``, ``dtype``, ``ndim``, ``__getitem__`` returning
    host numpy, ``__array__``): the tiles' shape times the grid along y and x. A read touches
    only the tiles its selection covers and reads them with one engine read where their
    arrays share a chunk format (else tile by tile, concurrently); cells without a tile are
    ``fill_value``.

    Parameters
    ----------
    tile_shape : tuple of int
        Shape of every tile (the first field's, at this level).
    dtype : str or numpy.dtype
    grid : (int, int)
        Tiles along y and x.
    cells : dict of (row, column) to _Cell
        What each occupied cell holds.
    backend : str
        How each tile is read (see :class:`gpu_zarr.lazy.GpuLazyArray`).
    fill_value : scalar
        Value of empty cells (and of the part of a cell a smaller tile leaves).

    Attributes
    ----------
    read_counts : dict
        Reads so far: ``batched_reads`` (engine reads of several tiles at once),
        ``batched_tiles`` (the tiles they read) and ``tile_reads`` (tiles read alone).
    last_batched : dict or None
        The last read of several tiles at once: ``tiles``, ``reason`` (how it was read) and
        the engine's ``stats``.
    """

    def __init__(self, tile_shape: Sequence[int], dtype: Any, grid: tuple[int, int],
                 cells: Mapping[tuple[int, int], _Cell], *, backend: str = "auto", fill_value: Any = 0,
                 name: str = "", _fixed: tuple[tuple[int, int], ...] = ()) -> None:
        if len(tile_shape) < 2:
            raise InvalidOmeMetadata(f"{name}: tiles need 2 or more dimensions (y, x), found shape {tuple(tile_shape)}")
        self._tile_shape = tuple(int(s) for s in tile_shape)
        self._dtype = np.dtype(dtype)
        self.grid = (int(grid[0]), int(grid[1]))
        self._cells = dict(cells)
        self.backend = backend
        self.fill_value = fill_value
        self.name = name
        self._fixed = tuple(_fixed)  # (axis of the tile, index), axes before y/x only
        fixed_axes = {a for a, _ in self._fixed}
        nd = len(self._tile_shape)
        full = list(self._tile_shape)
        full[-2] *= self.grid[0]
        full[-1] *= self.grid[1]
        self._free = tuple(i for i in range(nd) if i not in fixed_axes)
        self._shape = tuple(full[i] for i in self._free)
        self._lock = threading.Lock()
        self.read_counts = {"batched_reads": 0, "batched_tiles": 0, "tile_reads": 0}
        self.last_batched: dict[str, Any] | None = None

    # -- array protocol ------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return int(np.prod(self._shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self._dtype.itemsize

    @property
    def tile_shape(self) -> tuple[int, ...]:
        """Shape of one tile (of this view: fixed axes left out)."""
        return tuple(self._tile_shape[i] for i in self._free)

    def __len__(self) -> int:
        return self._shape[0]

    def __repr__(self) -> str:
        return (f"TiledArray(shape={self.shape}, dtype={self.dtype}, grid={self.grid}, "
                f"tiles={len(self._cells)}, {self.name})")

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self[...]
        return out if dtype is None else out.astype(dtype, copy=False)

    def index_axis(self, axis: int, index: int) -> TiledArray:
        """A view with ``axis`` (not y or x) fixed at ``index``, e.g. one channel."""
        if not -self.ndim <= axis < self.ndim:
            raise IndexError(f"axis {axis} out of range for a {self.ndim}-d array")
        axis %= self.ndim
        base = self._free[axis]
        if base >= len(self._tile_shape) - 2:
            raise IndexError("index_axis fixes an axis before y and x; use indexing for y or x")
        n = self._tile_shape[base]
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of bounds for axis {axis} with size {n}")
        return type(self)(self._tile_shape, self._dtype, self.grid, self._cells, backend=self.backend,
                          fill_value=self.fill_value, name=self.name,
                          _fixed=(*self._fixed, (base, index % n)))

    def cells(self) -> list[tuple[int, int]]:
        """Occupied grid cells (row, column)."""
        return sorted(self._cells)

    # -- reading -------------------------------------------------------------------
    def __getitem__(self, key: Any) -> np.ndarray:
        """Read ``key`` (basic indexing) and return host numpy."""
        from .lazy import normalize_key

        sel = normalize_key(key, self._shape)
        if sel is None:
            raise IndexError(f"plate and well views support basic indexing only (ints, slices, ...), got {key!r}")
        full: list[int | slice] = [slice(None)] * len(self._tile_shape)
        for a, i in self._fixed:
            full[a] = i
        for a, s in zip(self._free, sel, strict=True):
            full[a] = s
        # read with positive steps, flip afterwards
        fwd: list[int | slice] = []
        flip: list[slice] = []
        for s in full:
            if isinstance(s, int):
                fwd.append(s)
                continue
            if s.start is None:  # fixed axes left as slice(None) never occur: all normalised
                s = slice(0, 0, 1)
            r = range(s.start, s.stop, s.step)
            if s.step > 0:
                fwd.append(s)
                flip.append(slice(None))
            else:
                fwd.append(slice(r[-1], r[0] + 1, -s.step) if len(r) else slice(0, 0, 1))
                flip.append(slice(None, None, -1))
        out = self._gather(tuple(fwd))
        return out[tuple(flip)] if any(f.step == -1 for f in flip) else out

    def _gather(self, fwd: tuple[int | slice, ...]) -> np.ndarray:
        th, tw = self._tile_shape[-2:]
        lead = fwd[:-2]
        ys = _axis_plan(fwd[-2], th, self.grid[0])
        xs = _axis_plan(fwd[-1], tw, self.grid[1])
        box_shape = tuple(1 if isinstance(s, int) else len(range(s.start, s.stop, s.step)) for s in fwd)
        out_shape = tuple(n for s, n in zip(fwd, box_shape) if isinstance(s, slice))
        out = np.full(out_shape, self.fill_value, dtype=self._dtype)
        jobs = []
        for ty, ky, oy in ys:
            for tx, kx, ox in xs:
                cell = self._cells.get((ty, tx))
                if cell is not None:
                    jobs.append((cell, (*lead, ky, kx), tuple(o for o in (oy, ox) if o is not None)))
        if not jobs or out.size == 0:
            return out
        from .engine import get_runtime

        pool = get_runtime().pool("plate", min(16, max(2, (os.cpu_count() or 2) * 2)))
        cells = [j[0] for j in jobs]
        if sum(not c.resolved for c in cells) > 1:  # each well's metadata on first use, concurrently
            list(pool.map(lambda c: c.get(self.backend), cells))
        tiles: list[_Tile] = []
        for cell, k, o in jobs:
            arr = cell.get(self.backend)
            if arr is None:
                continue  # a missing well or field: its cell stays filled
            k, o = _clip(k, o, arr.shape, self._tile_shape)
            if k is not None:
                tiles.append((arr, k, o))
        groups, singles = _batch_groups(tiles)

        def one(tile: _Tile) -> None:
            arr, k, o = tile
            out[(Ellipsis, *o)] = arr[k]
            self._count("tile_reads", 1)

        futures = [pool.submit(one, t) for t in singles]  # beside the batched reads below
        box = out.reshape(box_shape)
        for group in groups:
            try:
                self._read_batched(group, box)
            except UnsupportedArrayError:  # the engine declined after all: tile by tile
                futures += [pool.submit(one, t) for t in group]
        for f in futures:
            f.result()
        return out

    def _read_batched(self, group: list[_Tile], box: np.ndarray) -> None:
        """ONE engine read of the tiles of ``group`` (arrays of one chunk format) into ``box``
        (the output with every axis kept, integer-indexed ones of length 1)."""
        from .engine import EngineOptions
        from .engine.plan import Part

        parts = []
        for arr, k, o in group:
            start = tuple(s if isinstance(s, int) else s.start for s in k)
            stop = tuple(s + 1 if isinstance(s, int) else s.stop for s in k)
            outs = iter(o)
            yx = tuple(0 if isinstance(s, int) else next(outs).start for s in k[-2:])
            parts.append(Part(arr.prepared().layout, start, stop, (0,) * (len(k) - 2) + yx))
        impl = group[0][0].prepared().backend_impl
        stats, why = impl.read_parts_into(parts, box, options=EngineOptions(cache=True))
        self._count("batched_reads", 1, "batched_tiles", len(group))
        with self._lock:
            self.last_batched = {"tiles": len(group), "reason": why.removeprefix("; "), "stats": stats}

    def _count(self, *pairs: Any) -> None:
        with self._lock:
            for name, n in zip(pairs[::2], pairs[1::2]):
                self.read_counts[name] += n


_Tile = tuple[Any, tuple[Any, ...], Any]  # (lazy array, key in it, output slices of y and x)


def _batch_groups(tiles: list[_Tile]) -> tuple[list[list[_Tile]], list[_Tile]]:
    """Tiles that one engine read can serve together, in groups (the same backend and chunk
    format: :func:`gpu_zarr.engine.layout.batch_key`), and the rest, read one by one: steps
    other than 1, GPU-resident levels, backends or arrays the engine does not read (zarr-python
    backends, remote stores), and groups of one."""
    from .engine.layout import batch_key

    groups: dict[Any, list[_Tile]] = {}
    singles: list[_Tile] = []
    for tile in tiles:
        arr, k, _ = tile
        key = None
        if all(isinstance(s, int) or s.step == 1 for s in k) and not arr.is_resident:
            prepared = arr.prepared()
            impl = prepared.backend_impl
            if prepared.layout is not None and hasattr(impl, "read_parts_into"):
                fmt = batch_key(prepared.layout)
                key = None if fmt is None else (type(impl), prepared.backend, fmt)
        if key is None:
            singles.append(tile)
        else:
            groups.setdefault(key, []).append(tile)
    batched = [g for g in groups.values() if len(g) > 1]
    singles += [g[0] for g in groups.values() if len(g) == 1]
    return batched, singles

def _clip(key: tuple[Any, ...], outs: tuple[slice, ...], shape: tuple[int, ...],
          tile: tuple[int, ...]) -> tuple[Any, Any]:
    """Restrict a tile's key to an array smaller than the tile (the rest stays filled).

    Returns (key, output slices) or (None, None) when nothing of the array is selected.
    Arrays of another rank than the tile are skipped (the cell stays filled).
    """
    if tuple(shape) == tile:
        return key, outs
    if len(shape) != len(tile):
        return None, None
    new_key = list(key)
    new_out = list(outs)
    oi = len(outs) - sum(1 for k in key[-2:] if isinstance(k, slice))  # first y/x output slice
    for a in range(len(key)):
        k = key[a]
        n = shape[a]
        if isinstance(k, int):
            if k >= n:
                return None, None
            continue
        r = range(k.start, k.stop, k.step)
        m = len([v for v in r if v < n]) if k.step > 0 else 0
        if m == 0:
            return None, None
        if a >= len(key) - 2:
            new_key[a] = slice(r[0], r[m - 1] + 1, k.step)
            o = new_out[oi]
            new_out[oi] = slice(o.start, o.start + m)
            oi += 1
        elif m != len(r):
            return None, None  # a smaller leading axis than the tile's: leave the cell filled
    return tuple(new_key), tuple(new_out)
