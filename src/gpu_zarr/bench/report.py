"""Benchmark output: JSON, Markdown (printed as a table, with rich when installed), PNG,
and the HTML of a notebook cell (the Markdown tables and the PNG inline)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = [
    "write_json",
    "markdown",
    "png",
    "html",
    "throughput_markdown",
    "browse_markdown",
    "stages_markdown",
    "print_tables",
    "throughput_png",
    "browse_png",
    "primary_ours",
]

_PRIMARY = ("ours-auto", "ours-kvikio", "ours-cpu", "ours-zarr-gpu", "ours-engine-cpu")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def write_json(data: dict[str, Any], path: Path) -> Path:
    """Write ``data`` atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(_clean(data), f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)
    return path


def primary_ours(result: dict[str, Any]) -> str | None:
    names = {n for lay in result.get("layouts", []) for n in lay.get("readers", {})}
    for n in _PRIMARY:
        if n in names:
            return n
    return None


def _reader_names(result: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for lay in result.get("layouts", []):
        for n in lay.get("readers", {}):
            if n not in names:
                names.append(n)
    return names


def _cell(rec: dict[str, Any] | None, key: str, fmt: str) -> str:
    if rec is None:
        return ""
    if "skipped" in rec:
        return "skip"
    if "error" in rec:
        return "error"
    if "declined" in rec:
        return "n/a"
    v = rec.get(key)
    if v is None:
        return "-"
    s = format(v, fmt)
    if rec.get("correct") is False:
        s += " (wrong)"
    return s


def _md(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _throughput_rows(result: dict[str, Any], key: str) -> tuple[list[str], list[list[str]]]:
    names = _reader_names(result)
    ours = primary_ours(result)
    peers = [n for n in names if _kind(result, n) == "peer"]
    header = ["layout", "ratio"] + names
    if ours:
        header += [f"{ours} / {p}" for p in peers]
    has_target = key == "gib_per_s" and result.get("device") == "gpu"
    if has_target:
        header += ["target", "peak extra GiB"]
    rows = []
    for lay in result.get("layouts", []):
        recs = lay.get("readers", {})
        row = [lay["name"], f"{lay.get('compression_ratio', float('nan')):.2f}"]
        row += [_cell(recs.get(n), key, ".2f") for n in names]
        if ours:
            o = recs.get(ours, {}).get(key)
            for p in peers:
                pv = recs.get(p, {}).get(key)
                row.append(f"{o / pv:.1f}x" if o and pv else "")
        if has_target:
            tgt = (result.get("targets") or {}).get(lay["name"])
            o = recs.get(ours, {}).get(key) if ours else None
            if tgt is None:
                row.append("")
            elif o is None:
                row.append(f">= {tgt:g}: no result")
            else:
                row.append(f">= {tgt:g}: {'met' if o >= tgt else 'MISSED'}")
            extra = [r.get("extra_gpu_bytes") for r in recs.values() if r.get("kind") == "ours"]
            extra = [e for e in extra if e is not None]
            limit = result.get("extra_gpu_target_bytes")
            over = extra and limit is not None and max(extra) > limit
            row.append((f"{max(extra) / 2**30:.2f}" + (" OVER" if over else "")) if extra else "")
        rows.append(row)
    return header, rows


def _kind(result: dict[str, Any], name: str) -> str:
    for lay in result.get("layouts", []):
        rec = lay.get("readers", {}).get(name)
        if rec is not None:
            return rec.get("kind", "peer")
    return "peer"


def throughput_markdown(result: dict[str, Any]) -> str:
    """Markdown tables: warm GiB/s (and cold GiB/s when measured), ratios, targets."""
    parts = [
        f"Whole-array read, {result['shape']} {result['dtype']} "
        f"({result['nbytes'] / 2**30:.2f} GiB), device {result['device']}"
        + (f" ({result.get('device_name')})" if result.get("device_name") else "")
        + f"; GiB/s of decoded bytes, warm page cache, median of {result['repeat']}"
        + (f" (peers: {result['peer_repeat']})" if result.get("peer_repeat") not in (None, result["repeat"]) else "")
        + ".",
        "",
        _md(*_throughput_rows(result, "gib_per_s")),
    ]
    parts += ["", _cold_markdown(result)]
    stages = stages_markdown(result)
    if stages:
        parts += ["", stages]
    bad = [
        f"{lay['name']}/{n}"
        for lay in result.get("layouts", [])
        for n, r in lay["readers"].items()
        if r.get("correct") is False
    ]
    errs: dict[tuple[str, str], list[str]] = {}
    for lay in result.get("layouts", []):
        if "error" in lay:
            errs.setdefault(("volume", str(lay["error"])[:200]), []).append(lay["name"])
        for n, r in lay.get("readers", {}).items():
            if "error" in r:
                errs.setdefault((n, str(r["error"])[:200]), []).append(lay["name"])
    line = "Correctness vs zarr CPU read: " + (
        "every reader that ran gave equal arrays" if not bad else "MISMATCH in " + ", ".join(bad)
    )
    if errs:
        line += ".\n\nFailed:\n" + "\n".join(
            f"- {n} on {', '.join(lays)}: {msg}" for (n, msg), lays in errs.items()
        )
    declined = _declined(result)
    if declined:
        line += "\n\nn/a = our backend declines the array (it says why; not a failure):\n" + declined
    parts += ["", line]
    return "\n".join(parts) + "\n"


def _declined(result: dict[str, Any]) -> str:
    out: dict[tuple[str, str], list[str]] = {}
    for lay in result.get("layouts", []):
        for n, r in lay.get("readers", {}).items():
            if "declined" in r:
                out.setdefault((n, str(r["declined"])[:160]), []).append(lay["name"])
    return "\n".join(f"- {n} on {', '.join(lays)}: {msg}" for (n, msg), lays in out.items())


def _cold_markdown(result: dict[str, Any]) -> str:
    cold = result.get("cold") or {}
    if not cold.get("requested"):
        return "Cold page cache: not measured (use --cold)."
    disk = cold.get("disk") or {}
    rate = disk.get("gib_per_s")
    head = (
        f"Cold page cache: one read of `{cold.get('reader')}` per layout after dropping the page cache; "
        + (f"the disk's own rate {rate:.2f} GiB/s ({disk.get('threads')} threads reading "
           f"{disk.get('bytes', 0) / 2**30:.2f} GiB of {disk.get('files')} files cold); "
           if rate else f"disk rate not measured ({disk.get('error', 'no result')}); ")
        + "limit = disk rate x compression ratio."
    )
    rows = []
    for lay in result.get("layouts", []):
        rec = (lay.get("readers") or {}).get(cold.get("reader") or "", {})
        if "cold_gib_per_s" in rec:
            lim = rec.get("cold_limit_gib_per_s")
            frac = rec.get("cold_fraction_of_limit")
            rows.append([lay["name"], f"{lay.get('compression_ratio', float('nan')):.2f}",
                         f"{rec['cold_gib_per_s']:.2f}", f"{lim:.2f}" if lim else "",
                         f"{100 * frac:.0f} %" if frac else "", _cell(rec, "gib_per_s", ".2f")])
        else:
            why = rec.get("cold_error") or rec.get("error") or rec.get("skipped") or "not measured"
            rows.append([lay["name"], f"{lay.get('compression_ratio', float('nan')):.2f}", f"- ({why})",
                         "", "", _cell(rec, "gib_per_s", ".2f")])
    return head + "\n\n" + _md(["layout", "ratio", "cold GiB/s", "limit GiB/s", "of limit", "warm GiB/s"], rows)


def _ms(v: float) -> str:
    return f"{v:.2f}" if v >= 1 else f"{v:.3g}"


def _stage_text(stages: dict[str, float], top: int = 5) -> str:
    """``chunkwise 12.1, plan 0.42, ...``: the longest stages first, those under 0.01 ms left out."""
    items = sorted(((k, v) for k, v in stages.items() if v >= 0.01), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {_ms(v)}" for k, v in items[:top])


def stages_markdown(result: dict[str, Any]) -> str:
    """Our readers' engine stages per layout (and pattern): which stage bounds each figure.

    Empty when no reader of ours recorded engine stats (e.g. the resident reader only).
    """
    browse = result.get("mode") == "browse"
    rows = []
    for lay in result.get("layouts", []):
        for name, r in lay.get("readers", {}).items():
            if r.get("kind") != "ours":
                continue
            recs = list((r.get("patterns") or {}).items()) if browse else [("", r)]
            for pat, pr in recs:
                if not pr.get("stages_ms"):
                    continue
                timed = _ms(pr["p50_ms"]) if browse else _ms(1e3 * pr["median_s"]) if "median_s" in pr else "-"
                total = pr.get("engine_total_ms")
                hits = pr.get("cache_hits_median")
                row = [lay["name"]] + ([pat] if browse else []) + [
                    name, timed, _ms(total) if total is not None else "-", str(pr.get("bound_by", "")),
                    _stage_text(pr["stages_ms"]) + (f"; cache hits {hits:g}" if hits else "")]
                rows.append(row)
    if not rows:
        return ""
    what = "p50 ms" if browse else "median ms"
    header = ["layout"] + (["pattern"] if browse else []) + ["reader", what, "engine ms", "bound by",
                                                             "stages (median ms per read)"]
    head = ("Where our time goes: the engine's own per-stage timings, median over the timed reads "
            "(`fused`: the CPU executor: read + decode + place per chunk on native threads; `plan` "
            "includes parsing the selection; `untimed`: the engine's total less its named stages on "
            "the CPU path, i.e. placing chunks from the chunk cache, finishing the output, filling "
            "the cache; on the GPU path the stages overlap, so `bound by` names the longest stage, "
            "not a share of the total).")
    return head + "\n\n" + _md(header, rows)


def browse_markdown(result: dict[str, Any]) -> str:
    """One row per (layout, pattern): ms per plane p50 / p95 of each reader."""
    names = _reader_names(result)
    header = ["layout", "pattern"] + names
    rows = []
    for lay in result.get("layouts", []):
        recs = lay.get("readers", {})
        pats = list(lay.get("patterns") or {}) or ["random"]
        if "error" in lay and not recs:
            rows.append([lay["name"], "", *(["error"] * len(names))])
            continue
        for pat in pats:
            row = [lay["name"], pat]
            for n in names:
                r = recs.get(n)
                pr = (r or {}).get("patterns", {}).get(pat)
                if r is None:
                    row.append("")
                elif "skipped" in r:
                    row.append("skip")
                elif "error" in r:
                    row.append("error")
                elif "declined" in r:
                    row.append("n/a")
                elif pr is None:
                    row.append("-")
                else:
                    cell = f"{_ms(pr['p50_ms'])} / {_ms(pr['p95_ms'])}"
                    if r.get("correct") is False:
                        cell += " (wrong)"
                    row.append(cell)
            rows.append(row)
    n_scroll = next((len(lay["patterns"]["scroll"]) for lay in result.get("layouts", [])
                     if "scroll" in (lay.get("patterns") or {})), None)
    tile = next((lay["tile_shape"] for lay in result.get("layouts", []) if lay.get("tile_shape")), None)
    head = (
        f"Browsing, {result['shape']} {result['dtype']} ({result['nbytes'] / 2**30:.2f} GiB), "
        f"device {result['device']}; ms per plane p50 / p95: `random` over {result['planes']} random planes"
        + (f", `scroll` over {n_scroll - 1} consecutive planes forward then back (after the first)"
           if n_scroll else "")
        + (f", `tile` over {result['planes']} random {tile[0]}x{tile[1]} tiles of random planes" if tile else "")
        + "."
    )
    loads = [
        f"{lay['name']}: {r['load_s']:.2f} s"
        for lay in result.get("layouts", [])
        for n, r in lay["readers"].items()
        if "load_s" in r
    ]
    tail = ("\n\nWhole-volume load for the resident reader: " + "; ".join(loads)) if loads else ""
    errs = [f"{lay['name']}/{n}: {r['error'][:160]}" for lay in result.get("layouts", [])
            for n, r in lay.get("readers", {}).items() if "error" in r]
    if errs:
        tail += "\n\nFailed: " + "; ".join(errs)
    declined = _declined(result)
    if declined:
        tail += "\n\nn/a = our backend declines the array (not a failure):\n" + declined
    stages = stages_markdown(result)
    if stages:
        tail += "\n\n" + stages
    return head + "\n\n" + _md(header, rows) + tail + "\n"


def markdown(result: dict[str, Any]) -> str:
    """The Markdown report of a result (either mode)."""
    return throughput_markdown(result) if result.get("mode") == "throughput" else browse_markdown(result)


def print_tables(markdown: str) -> None:
    """Print Markdown tables: as rich tables when rich is installed, else as text."""
    try:
        from rich.console import Console
        from rich.table import Table
    except Exception:
        print(markdown, flush=True)
        return
    console = Console(width=max(240, _term_width()), soft_wrap=False)
    block: list[str] = []

    def flush() -> None:
        if not block:
            return
        rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in block]
        table = Table(show_lines=False)
        for i, h in enumerate(rows[0]):
            table.add_column(h, justify="left" if i == 0 else "right", no_wrap=i == 0)
        for r in rows[2:]:
            table.add_row(*r)
        console.print(table)
        block.clear()

    for line in markdown.splitlines():
        if line.startswith("|"):
            block.append(line)
        else:
            flush()
            if line.strip():
                console.print(line, markup=False, highlight=False)
    flush()


def _term_width() -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 0


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _bars(ax: Any, groups: list[str], series: dict[str, list[float | None]], ylabel: str, title: str) -> None:
    import numpy as np

    n = max(1, len(series))
    width = 0.8 / n
    x = np.arange(len(groups))
    for i, (name, vals) in enumerate(series.items()):
        ys = [v if v is not None else 0.0 for v in vals]
        bars = ax.bar(x + (i - (n - 1) / 2) * width, ys, width, label=name)
        for b, v in zip(bars, vals, strict=True):
            if v is not None:
                ax.annotate(
                    f"{v:.3g}", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=6, rotation=90,
                )
    ax.set_xticks(x)
    ax.set_xticklabels(groups, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=min(n, 3))
    ax.grid(axis="y", alpha=0.3)


def throughput_png(result: dict[str, Any], path: Path) -> Path:
    """Grouped bars of warm (and cold, when measured) GiB/s per layout and reader."""
    plt = _plt()
    names = _reader_names(result)
    layouts = [lay["name"] for lay in result["layouts"]]
    keys = [("gib_per_s", "warm page cache")]
    if any("cold_gib_per_s" in r for lay in result["layouts"] for r in lay["readers"].values()):
        keys.append(("cold_gib_per_s", "cold page cache"))
    fig, axes = plt.subplots(len(keys), 1, figsize=(max(8, 1.6 * len(layouts) + 3), 4.2 * len(keys)), squeeze=False)
    for ax, (key, what) in zip(axes[:, 0], keys, strict=True):
        series = {
            n: [lay["readers"].get(n, {}).get(key) for lay in result["layouts"]] for n in names
        }
        series = {n: v for n, v in series.items() if any(x is not None for x in v)}
        _bars(
            ax, layouts, series, "GiB/s (decoded)",
            f"Whole-array read {tuple(result['shape'])} {result['dtype']}, {what} "
            f"({result['device']}{', ' + result['device_name'] if result.get('device_name') else ''})",
        )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def browse_png(result: dict[str, Any], path: Path) -> Path:
    """Grouped bars of p50 ms per plane (log scale), p95 as an error bar; one panel per pattern."""
    import numpy as np

    plt = _plt()
    names = _reader_names(result)
    layouts = [lay["name"] for lay in result["layouts"]]
    pats: list[str] = []
    for lay in result["layouts"]:
        for p in lay.get("patterns") or {}:
            if p not in pats:
                pats.append(p)
    pats = pats or ["random"]
    fig, axes = plt.subplots(len(pats), 1, figsize=(max(8, 2.2 * len(layouts) + 3), 4.2 * len(pats)),
                             squeeze=False)
    n = max(1, len(names))
    width = 0.8 / n
    x = np.arange(len(layouts))
    for ax, pat in zip(axes[:, 0], pats, strict=True):
        drawn = False
        for i, name in enumerate(names):
            recs = [lay["readers"].get(name, {}).get("patterns", {}).get(pat, {}) for lay in result["layouts"]]
            p50 = [r.get("p50_ms") for r in recs]
            p95 = [r.get("p95_ms") for r in recs]
            if all(v is None for v in p50):
                continue
            drawn = True
            ys = [v if v is not None else np.nan for v in p50]
            err = [max(0.0, (b or 0) - (a or 0)) if a is not None else 0 for a, b in zip(p50, p95, strict=True)]
            ax.bar(x + (i - (n - 1) / 2) * width, ys, width, yerr=[[0] * len(err), err], capsize=2, label=name)
        if drawn:
            ax.set_yscale("log")
            ax.legend(fontsize=7, ncol=min(n, 3))
        ax.set_xticks(x)
        ax.set_xticklabels(layouts, rotation=15, ha="right", fontsize=8)
        ax.set_ylabel("ms per plane (p50, bar to p95)")
        ax.set_title(
            f"Browsing {tuple(result['shape'])} {result['dtype']}, {pat} planes "
            f"({result['device']}{', ' + result['device_name'] if result.get('device_name') else ''})",
            fontsize=10,
        )
        ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def png(result: dict[str, Any], path: Path) -> Path:
    """The PNG chart of a result (either mode); needs matplotlib."""
    return throughput_png(result, path) if result.get("mode") == "throughput" else browse_png(result, path)


def _md_table_html(lines: list[str]) -> str:
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    head = "".join(f"<th>{_esc(h)}</th>" for h in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows[2:]
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _esc(text: str) -> str:
    import html as _html

    return _html.escape(text.replace("`", ""))


def html(markdown_text: str, png_bytes: bytes | None, note: str = "") -> str:
    """A notebook cell's HTML: the Markdown's text and tables, then the PNG inline (base64)."""
    import base64

    parts: list[str] = []
    block: list[str] = []
    for line in markdown_text.splitlines() + [""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            parts.append(_md_table_html(block))
            block = []
        if line.strip():
            parts.append(f"<p>{_esc(line)}</p>")
    if png_bytes:
        b64 = base64.b64encode(png_bytes).decode("ascii")
        parts.append(f'<img alt="benchmark chart" src="data:image/png;base64,{b64}"/>')
    if note:
        parts.append(f"<p><em>{_esc(note)}</em></p>")
    return '<div class="gpu-zarr-bench">' + "".join(parts) + "</div>"
