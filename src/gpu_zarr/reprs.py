"""Rich (HTML) and plain-text representations for notebooks.

The ``_repr_mimebundle_`` / ``_repr_html_`` methods of :class:`gpu_zarr.zarr_io.ReadResult`,
:class:`gpu_zarr.capabilities.Capabilities`, :class:`gpu_zarr.omezarr.OmeImage` and
:class:`gpu_zarr.controller.RunRecord` delegate here, and the notebook widget builds its
result, history and chart from the same functions.

Every builder is cheap and never does I/O: it reads attributes already in memory (never
array *data*: a cupy result is described by its shape, dtype and device, never copied),
and every value that comes from a store or the user is HTML-escaped.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "best_chart_svg",
    "bundle",
    "capabilities_html",
    "capabilities_text",
    "codec_names",
    "format_bytes",
    "history_html",
    "history_text",
    "ome_image_html",
    "ome_image_text",
    "read_result_html",
    "read_result_text",
    "run_record_html",
    "run_record_text",
]

_COLORS = {"kvikio": "#76b900", "zarr-gpu": "#1f77b4", "cpu": "#888888"}
_TABLE = "border-collapse:collapse;font-size:12px;margin:2px 0"
_TH = "text-align:left;padding:1px 8px 1px 0;font-weight:600;vertical-align:top"
_TD = "text-align:left;padding:1px 8px 1px 0;vertical-align:top"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def bundle(text: str, html_text: str) -> dict[str, str]:
    """The mime bundle IPython displays: plain text and HTML."""
    return {"text/plain": text, "text/html": html_text}


def format_bytes(n: float | None) -> str:
    """``1536`` -> ``"1.5 KiB"`` (binary units, as GiB/s is)."""
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"  # pragma: no cover


def _shape(shape: Iterable[int] | None) -> str:
    return "?" if shape is None else "×".join(str(int(s)) for s in shape) or "()"


def _rows(pairs: Iterable[tuple[str, str]], *, escape_values: bool = True) -> str:
    return "".join(f"<tr><th style='{_TH}'>{_e(k)}</th><td style='{_TD}'>{_e(v) if escape_values else v}</td></tr>"
                   for k, v in pairs)


def _box(title: str, body: str, css_class: str) -> str:
    return (f"<div class='gpu-zarr-repr {css_class}' style='font-family:var(--jp-ui-font-family,sans-serif);"
            f"line-height:1.35'><div style='font-weight:600;margin-bottom:2px'>{title}</div>{body}</div>")


def _text_table(pairs: Iterable[tuple[str, str]]) -> str:
    pairs = list(pairs)
    w = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"  {k.ljust(w)}  {v}" for k, v in pairs)


# -- read results -----------------------------------------------------------------------
def _where(data: Any) -> str:
    """Where an array lives, from its type alone (no transfer, no synchronisation)."""
    if data is None:
        return "not kept (the data were dropped)"
    if hasattr(data, "__cuda_array_interface__"):
        dev = getattr(getattr(data, "device", None), "id", None)
        return f"GPU memory (cupy, device {dev})" if dev is not None else "GPU memory (cupy)"
    mod = type(data).__module__.split(".")[0]
    return "host memory (numpy)" if mod == "numpy" else f"host memory ({type(data).__name__})"


def _result_pairs(r: Any) -> list[tuple[str, str]]:
    data = getattr(r, "data", None)
    pairs = [
        ("backend", str(r.backend)),
        ("why", str(r.reason)),
        ("read", f"{format_bytes(r.nbytes)} in {r.seconds:.3f} s"),
        ("throughput", f"{r.gib_per_s:.2f} GiB/s"),
        ("GPU memory", format_bytes(r.gpu_bytes) if r.gpu_bytes else "none (host result)"),
    ]
    if data is not None:
        pairs.append(("array", f"{_shape(getattr(data, 'shape', None))} {getattr(data, 'dtype', '?')}"))
    pairs.append(("data in", _where(data)))
    return pairs


def read_result_text(r: Any) -> str:
    """Plain-text summary of a :class:`~gpu_zarr.zarr_io.ReadResult`."""
    return "ReadResult\n" + _text_table(_result_pairs(r))


def read_result_html(r: Any) -> str:
    """HTML summary of a :class:`~gpu_zarr.zarr_io.ReadResult` (never touches its data)."""
    pairs = _result_pairs(r)
    body = f"<table style='{_TABLE}'>{_rows(pairs)}</table>"
    title = f"ReadResult: <b>{_e(r.backend)}</b>, {r.gib_per_s:.2f} GiB/s"
    return _box(title, body, "gpu-zarr-read-result")


# -- the machine ------------------------------------------------------------------------
def capabilities_text(c: Any) -> str:
    """Plain-text machine report (:meth:`Capabilities.report`)."""
    return "gpu_zarr capabilities\n" + c.report()


def capabilities_html(c: Any) -> str:
    """HTML machine report: GPU, kvikio mode, nvCOMP and every backend with its reason."""
    gib = 2**30
    if c.gpu:
        mem = f", {c.free_bytes / gib:.1f} of {c.total_bytes / gib:.1f} GiB free" if c.total_bytes else ""
        gpu = f"{c.device_name}{mem}"
    else:
        gpu = "none usable" + ("" if c.cupy else " (cupy not installed)")
    if c.kvikio:
        kv = ("compat (POSIX) mode" if c.kvikio_compat else "native mode") + \
             f"; GDS native: {'yes' if c.gds_native else 'no'}"
    else:
        kv = "not installed"
    pairs = [("GPU", gpu), ("kvikio", kv),
             ("nvCOMP", "installed (GPU zstd decode)" if c.nvcomp else "not installed")]
    from gpu_zarr.backends import BACKENDS

    rows = []
    for b in BACKENDS:
        ok, why = c.backend_status(b)
        mark = "<span style='color:#2e7d32'>✔ yes</span>" if ok else "<span style='color:#c62828'>✘ no</span>"
        rows.append(f"<tr><td style='{_TD}'><code>{_e(b)}</code></td><td style='{_TD}'>{mark}</td>"
                    f"<td style='{_TD}'>{_e(why)}</td></tr>")
    backends = (f"<table style='{_TABLE}'><tr><th style='{_TH}'>backend</th><th style='{_TH}'>usable</th>"
                f"<th style='{_TH}'>why</th></tr>{''.join(rows)}</table>")
    notes = "".join(f"<li>{_e(n)}</li>" for n in c.notes)
    body = (f"<table style='{_TABLE}'>{_rows(pairs)}</table>{backends}"
            + (f"<ul style='margin:2px 0;padding-left:18px;font-size:12px'>{notes}</ul>" if notes else ""))
    return _box("gpu_zarr: what this machine offers", body, "gpu-zarr-capabilities")


# -- OME images -------------------------------------------------------------------------
def codec_names(array: Any) -> tuple[str, ...]:
    """Short names of an open zarr array's filters and compressors, e.g. ``("zstd(level=3)",)``.

    Reads the metadata already in memory (no I/O); ``("raw",)`` when uncompressed.
    """
    out = []
    for codec in (*getattr(array, "filters", ()), *getattr(array, "compressors", ())):
        if hasattr(codec, "to_dict"):
            d = codec.to_dict()
            name, conf = str(d.get("name", type(codec).__name__)), dict(d.get("configuration") or {})
        elif hasattr(codec, "get_config"):
            conf = dict(codec.get_config())
            name = str(conf.pop("id", type(codec).__name__))
        else:
            name, conf = type(codec).__name__, {}
        keep = {k: v for k, v in conf.items() if k in ("level", "clevel", "cname", "shuffle")}
        out.append(name + (f"({', '.join(f'{k}={v}' for k, v in keep.items())})" if keep else ""))
    return tuple(out) or ("raw",)


def _scale_text(level: Any, axes: Sequence[Any]) -> str:
    parts = []
    for ax, s in zip(axes, level.scale):
        if ax.type == "channel" or (ax.type is None and ax.name.lower() == "c"):
            continue
        parts.append(f"{ax.name} {s:g}")
    return ", ".join(parts)


def _level_rows(img: Any) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for i, lv in enumerate(img.levels):
        chunks = _shape(lv.chunks)
        shards = getattr(lv, "shards", None)
        if shards:
            chunks += f" in {_shape(shards)} shards"
        codecs = ", ".join(getattr(lv, "codecs", ()) or ("?",))
        rows.append((str(i), lv.path, _shape(lv.shape), str(lv.dtype), chunks, codecs,
                     format_bytes(lv.nbytes), _scale_text(lv, img.axes)))
    return rows


_LEVEL_HEAD = ("level", "path", "shape", "dtype", "chunks", "codecs", "size", "pixel size")


def ome_image_text(img: Any) -> str:
    """Plain-text summary of an :class:`~gpu_zarr.omezarr.OmeImage`."""
    axes = ", ".join(a.name + (f" ({a.unit})" if a.unit else "") for a in img.axes)
    lines = [f"OmeImage {img.name!r} (OME-NGFF {img.version or '?'}) at {img.path}", f"  axes: {axes}"]
    for row in _level_rows(img):
        lines.append("  level " + row[0] + ": " + f"{row[2]} {row[3]}, chunks {row[4]}, {row[5]}, {row[6]}")
    for ch in img.channels:
        lines.append(f"  channel {ch.name}: {ch.color}" + (
            f", window {ch.start:g}..{ch.end:g}" if ch.start is not None and ch.end is not None else ""))
    if img.labels:
        lines.append("  labels: " + ", ".join(img.labels))
    return "\n".join(lines)


def ome_image_html(img: Any) -> str:
    """HTML summary of an OME image: axes and units, levels, channels with colours, labels."""
    axes = "".join(
        f"<tr><td style='{_TD}'><code>{_e(a.name)}</code></td><td style='{_TD}'>{_e(a.type or '')}</td>"
        f"<td style='{_TD}'>{_e(a.unit or '')}</td></tr>" for a in img.axes)
    axes_t = (f"<table style='{_TABLE}'><tr><th style='{_TH}'>axis</th><th style='{_TH}'>type</th>"
              f"<th style='{_TH}'>unit</th></tr>{axes}</table>")
    head = "".join(f"<th style='{_TH}'>{h}</th>" for h in _LEVEL_HEAD)
    body = "".join("<tr>" + "".join(f"<td style='{_TD}'>{_e(c)}</td>" for c in row) + "</tr>"
                   for row in _level_rows(img))
    levels_t = f"<table style='{_TABLE}'><tr>{head}</tr>{body}</table>"
    chans = ""
    if img.channels:
        items = []
        for ch in img.channels:
            window = (f" window {ch.start:g}..{ch.end:g}" if ch.start is not None and ch.end is not None else "")
            swatch = (f"<span style='display:inline-block;width:10px;height:10px;margin-right:4px;"
                      f"border:1px solid #999;background:{_e(ch.color)}'></span>")
            items.append(f"<span style='margin-right:12px'>{swatch}{_e(ch.name)} <code>{_e(ch.color)}</code>"
                         f"{_e(window)}{'' if ch.active else ' (hidden)'}</span>")
        chans = f"<div style='font-size:12px;margin:2px 0'><b>channels</b>: {''.join(items)}</div>"
    labels = (f"<div style='font-size:12px'><b>labels</b>: {_e(', '.join(img.labels))}</div>" if img.labels else "")
    title = (f"OME-Zarr image <b>{_e(img.name)}</b> (OME-NGFF {_e(img.version or '?')}"
             f"{', label image' if img.is_label else ''}) <span style='font-weight:400;opacity:.7'>"
             f"{_e(img.path)}</span>")
    return _box(title, axes_t + levels_t + chans + labels, "gpu-zarr-ome-image")


# -- the loader's history ---------------------------------------------------------------
def run_record_text(rec: Any) -> str:
    """One line for a :class:`~gpu_zarr.controller.RunRecord`."""
    if rec.status != "ok":
        return f"{rec.layer} level {rec.level} ({rec.requested}): {rec.status}"
    return (f"{rec.layer} level {rec.level}: {rec.backend} read {format_bytes(rec.nbytes)} in "
            f"{rec.seconds:.3f} s = {rec.gib_per_s:.2f} GiB/s ({rec.reason})")


def run_record_html(rec: Any, say: Any = None) -> str:
    """A load's outcome: backend and why, bytes, seconds, GiB/s, GPU memory (``say``: how the
    reason is said, e.g. without an install command shown above)."""
    reason = say(rec.reason) if say is not None else rec.reason
    if rec.status != "ok":
        text = "Cancelled." if rec.status == "cancelled" else f"Load failed: {reason}"
        return f"<div class='gpu-zarr-result gpu-zarr-failed' style='line-height:1.4'>{_e(text)}</div>"
    kept = "kept on the GPU" if rec.resident else ("freed" if rec.gpu_bytes else "host memory")
    return (f"<div class='gpu-zarr-result' style='line-height:1.4'>{_e(rec.layer)} level {rec.level}: <b>{_e(rec.backend)}</b> "
            f"({_e(reason)})<br>"
            f"{_e(format_bytes(rec.nbytes))} in {rec.seconds:.3f} s = <b>{rec.gib_per_s:.2f} GiB/s</b><br>"
            f"GPU memory used: {_e(format_bytes(rec.gpu_bytes))} ({kept})</div>")


_HISTORY_HEAD = ("Image", "Level", "Asked", "Backend", "MiB", "Seconds", "GiB/s", "GPU MiB", "Status")


def _history_cells(rec: Any) -> tuple[str, ...]:
    mib = 2**20
    ok = rec.status == "ok"
    return (rec.layer, str(rec.level), rec.requested, rec.backend,
            f"{rec.nbytes / mib:,.1f}" if ok else "", f"{rec.seconds:.3f}" if ok else "",
            f"{rec.gib_per_s:.2f}" if ok else "", f"{rec.gpu_bytes / mib:,.1f}" if ok else "",
            ("ok, resident" if rec.resident else "ok") if ok else rec.status)


def history_text(records: Sequence[Any]) -> str:
    """The history as aligned text columns."""
    rows = [_HISTORY_HEAD] + [_history_cells(r) for r in records]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HISTORY_HEAD))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def history_html(records: Sequence[Any]) -> str:
    """The history table (one ``tr.gpu-zarr-run`` per load; the reason as a tooltip)."""
    head = "".join(f"<th style='{_TH}'>{h}</th>" for h in _HISTORY_HEAD)
    body = "".join(
        f"<tr class='gpu-zarr-run' title='{_e(r.reason)}'>"
        + "".join(f"<td style='{_TD}'>{_e(c)}</td>" for c in _history_cells(r)) + "</tr>"
        for r in records)
    if not records:
        body = f"<tr><td colspan='{len(_HISTORY_HEAD)}' style='{_TD};opacity:.6'>no load yet</td></tr>"
    return f"<table class='gpu-zarr-history' style='{_TABLE}'><tr>{head}</tr>{body}</table>"


def best_chart_svg(best: Mapping[str, float], *, width: int = 320, height: int = 150) -> str:
    """An inline SVG bar chart of the best GiB/s per backend (no plotting library)."""
    names = list(best)
    top = max(best.values(), default=0.0) or 1.0
    slots = max(len(names), 3)
    left, bottom, pad = 36, 22, 12
    plot_w, plot_h = width - left - 8, height - bottom - pad
    bw = plot_w / slots * 0.6
    parts = [(f"<svg class='gpu-zarr-chart' xmlns='http://www.w3.org/2000/svg' width='{width}' "
              f"height='{height}' viewBox='0 0 {width} {height}' style='font:10px sans-serif'>"),
             f"<line x1='{left}' y1='{pad}' x2='{left}' y2='{pad + plot_h}' stroke='#888'/>",
             f"<line x1='{left}' y1='{pad + plot_h}' x2='{width - 8}' y2='{pad + plot_h}' stroke='#888'/>",
             (f"<text transform='translate(11 {pad + plot_h / 2:.0f}) rotate(-90)' fill='currentColor' "
              "text-anchor='middle'>GiB/s (best)</text>")]
    for i, n in enumerate(names):
        v = float(best[n])
        h = plot_h * v / top
        x = left + (i + 0.5) * plot_w / slots - bw / 2
        y = pad + plot_h - h
        parts.append(f"<rect class='gpu-zarr-bar' data-backend='{_e(n)}' x='{x:.1f}' y='{y:.1f}' "
                     f"width='{bw:.1f}' height='{h:.1f}' fill='{_COLORS.get(n, '#999')}'>"
                     f"<title>{_e(n)}: {v:.2f} GiB/s</title></rect>")
        parts.append(f"<text x='{x + bw / 2:.1f}' y='{max(y - 2, 9):.1f}' text-anchor='middle' "
                     f"fill='currentColor'>{v:.2f}</text>")
        parts.append(f"<text x='{x + bw / 2:.1f}' y='{pad + plot_h + 14}' text-anchor='middle' "
                     f"fill='currentColor'>{_e(n)}</text>")
    if not names:
        parts.append(f"<text x='{left + plot_w / 2}' y='{pad + plot_h / 2}' text-anchor='middle' "
                     "fill='gray'>load a level to compare backends</text>")
    parts.append("</svg>")
    return "".join(parts)
