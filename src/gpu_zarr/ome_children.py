"""Which child nodes an OME-NGFF node names: what a reader opens next.

The OME knowledge the remote metadata prefetch (:mod:`gpu_zarr.location`) uses to ask for a
node's children before zarr-python does, from the raw documents of one node: multiscale levels,
a labels group's label images, a plate's wells, a well's fields. It sits beside the OME parser
(:mod:`gpu_zarr.omezarr`, :mod:`gpu_zarr.plate`; ``omezarr.child_nodes`` is :func:`children`)
and below it: it imports nothing of the package, so the location of stores, which the parser
opens its nodes through, can use it. Unlike the parser it never raises: anything unreadable names no child (a prefetch
is only a head start).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["child_lists", "children", "image_of_labels", "label_levels_guessed"]


def child_lists(docs: Mapping[str, bytes | None] | None) -> dict[str, list[str]]:
    """The child paths a node's OME attributes (0.4 ``.zattrs`` or 0.5 ``zarr.json``, raw) name,
    by kind: ``levels`` (multiscale datasets), ``labels`` (a labels group's label images),
    ``wells`` (a plate's), ``fields`` (a well's images). Anything unreadable gives none; paths
    that leave the node (``..``, a URL) are dropped."""
    if not docs:
        return {}
    attrs: Any = {}
    try:
        if docs.get("zarr.json"):
            attrs = json.loads(docs["zarr.json"] or b"{}").get("attributes", {})
        elif docs.get(".zattrs"):
            attrs = json.loads(docs[".zattrs"] or b"{}")
        ome = attrs.get("ome", attrs) if isinstance(attrs, dict) else {}
        out: dict[str, list[str]] = {
            "levels": [str(d["path"]) for ms in ome.get("multiscales", []) or []
                       for d in ms.get("datasets", []) if isinstance(d, dict) and "path" in d],
            "labels": [str(p) for p in ome.get("labels", []) or [] if isinstance(p, str)],
            "wells": [str(w["path"]) for w in (ome.get("plate") or {}).get("wells", []) or []
                      if isinstance(w, dict) and "path" in w],
            "fields": [str(i["path"]) for i in (ome.get("well") or {}).get("images", []) or []
                       if isinstance(i, dict) and "path" in i],
        }
    except (ValueError, TypeError, AttributeError, KeyError):
        return {}
    return {kind: [c.strip("/") for c in dict.fromkeys(paths) if c and ".." not in c.split("/") and "://" not in c]
            for kind, paths in out.items()}


def children(docs: Mapping[str, bytes | None] | None) -> list[str]:
    """Child nodes an OME-NGFF reader opens next, from a node's documents: multiscale levels
    (and the image's ``labels`` group), label images, a plate's wells, a well's fields."""
    kinds = child_lists(docs)
    levels = kinds.get("levels", [])
    out = [*levels, *(["labels"] if levels else []), *kinds.get("labels", []), *kinds.get("wells", []),
           *kinds.get("fields", [])]
    return [c for c in dict.fromkeys(out) if c.strip("/")]


def image_of_labels(node: str) -> str | None:
    """The image node whose ``labels`` group ``node`` is (a path from the root), or None."""
    if node != "labels" and not node.endswith("/labels"):
        return None
    return node.removesuffix("labels").rstrip("/")


def label_levels_guessed(labels_docs: Mapping[str, bytes | None] | None,
                         image_docs: Mapping[str, bytes | None] | None) -> list[str]:
    """For an image's ``labels`` group: each label image's levels, guessed to have the paths of
    the image's own levels (the writers' habit: ome-zarr-py, bioformats2raw), relative to the
    labels group."""
    names = child_lists(labels_docs).get("labels", [])
    paths = child_lists(image_docs).get("levels", []) if names else []
    return [f"{name}/{p}" for name in names for p in paths]
