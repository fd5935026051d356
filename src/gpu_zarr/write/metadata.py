"""Zarr metadata documents, built by zarr-python itself.

An array's or group's metadata is created with ``zarr.create_array`` / ``zarr.create_group``
in a :class:`zarr.storage.MemoryStore` (which writes only the metadata: no chunk is touched),
and the documents it produced (``zarr.json``; ``.zarray``/``.zattrs``/``.zgroup``) are what
the writer puts on disk. So every document is exactly what zarr-python writes for the same
array, whatever zarr version is installed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_zarr.write.codecs import CodecSpec
from gpu_zarr.write.plan import WritePlan

__all__ = ["ZARR_DOCS", "array_documents", "group_documents"]

#: the documents that make a folder (or an object prefix) a zarr node
ZARR_DOCS = ("zarr.json", ".zarray", ".zgroup", ".zattrs")


def _documents(store_dict: Mapping[str, Any]) -> dict[str, bytes]:
    return {key: buf.to_bytes() for key, buf in store_dict.items()}


def array_documents(plan: WritePlan, spec: CodecSpec, *, fill_value: Any = 0,
                    attributes: Mapping[str, Any] | None = None,
                    dimension_names: Sequence[str] | None = None) -> dict[str, bytes]:
    """The metadata documents of one array, keyed by their names relative to the array."""
    import zarr
    from zarr.storage import MemoryStore

    docs: dict[str, Any] = {}
    kwargs: dict[str, Any] = {}
    if plan.zarr_format == 3:
        kwargs["compressors"] = spec.v3_compressors()
        kwargs["shards"] = plan.shards
        kwargs["chunk_key_encoding"] = {"name": "default", "separator": plan.separator}
        if dimension_names is not None:
            kwargs["dimension_names"] = list(dimension_names)
    else:
        kwargs["compressors"] = spec.v2_compressor()
        kwargs["chunk_key_encoding"] = {"name": "v2", "separator": plan.separator}
    zarr.create_array(MemoryStore(docs), shape=plan.shape, dtype=plan.dtype, chunks=plan.chunks,
                      fill_value=fill_value, zarr_format=plan.zarr_format,  # type: ignore[arg-type]
                      attributes=dict(attributes or {}), **kwargs)
    return _documents(docs)


def group_documents(zarr_format: int, attributes: Mapping[str, Any] | None = None) -> dict[str, bytes]:
    """The metadata documents of one group, keyed by their names relative to the group."""
    import zarr
    from zarr.storage import MemoryStore

    docs: dict[str, Any] = {}
    zarr.create_group(MemoryStore(docs), zarr_format=zarr_format,  # type: ignore[arg-type]
                      attributes=dict(attributes or {}))
    return _documents(docs)
