"""Benchmark output: console table (rich when installed), Markdown, JSON and PNG."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = [
    "write_json",
    "throughput_markdown",
    "browse_markdown",
    "print_tables",
    "throughput_png",
    "browse_png",
    "primary_ours",
]

_PRIMARY = ("ours-auto", "ours-kvikio", "ours-cpu")


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
        + f"; GiB/s of decoded bytes, warm page cache, median of {result['repeat']}.",
        "",
        _md(*_throughput_rows(result, "gib_per_s")),
    ]
    if any("cold_gib_per_s" in r for lay in result.get("layouts", []) for r in lay["readers"].values()):
        parts += ["", "Cold page cache (one read after dropping caches), GiB/s:", ""]
        parts.append(_md(*_throughput_rows(result, "cold_gib_per_s")))
    else:
        parts += ["", f"Cold page cache: {result.get('cold', {}).get('reason', 'not measured')}."]
    bad = [
        f"{lay['name']}/{n}"
        for lay in result.get("layouts", [])
        for n, r in lay["readers"].items()
        if r.get("correct") is False
    ]
    errs = [
        f"{lay['name']}/{n}"
        for lay in result.get("layouts", [])
        for n, r in lay["readers"].items()
        if "error" in r
    ]
    line = "Correctness vs zarr CPU read: " + (
        "every reader that ran gave equal arrays" if not bad else "MISMATCH in " + ", ".join(bad)
    )
    if errs:
        line += "; failed: " + ", ".join(errs)
    parts += ["", line]
    return "\n".join(parts) + "\n"


def _ms(v: float) -> str:
    return f"{v:.2f}" if v >= 1 else f"{v:.3g}"


def browse_markdown(result: dict[str, Any]) -> str:
    names = _reader_names(result)
    header = ["layout"] + names
    rows = []
    for lay in result.get("layouts", []):
        recs = lay.get("readers", {})
        row = [lay["name"]]
        for n in names:
            r = recs.get(n)
            if r is None:
                row.append("")
            elif "skipped" in r:
                row.append("skip")
            elif "error" in r:
                row.append("error")
            else:
                s = f"{_ms(r['p50_ms'])} / {_ms(r['p95_ms'])}"
                if r.get("correct") is False:
                    s += " (wrong)"
                row.append(s)
        rows.append(row)
    head = (
        f"Browsing, {result['shape']} {result['dtype']} ({result['nbytes'] / 2**30:.2f} GiB), "
        f"device {result['device']}; ms per z-plane p50 / p95 over {result['planes']} random planes."
    )
    loads = [
        f"{lay['name']}: {r['load_s']:.2f} s"
        for lay in result.get("layouts", [])
        for n, r in lay["readers"].items()
        if "load_s" in r
    ]
    tail = ("\n\nWhole-volume load for the resident reader: " + "; ".join(loads)) if loads else ""
    return head + "\n\n" + _md(header, rows) + tail + "\n"


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


def _bars(ax, groups: list[str], series: dict[str, list[float | None]], ylabel: str, title: str):
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
    """Grouped bars of p50 ms per plane (log scale), p95 as an error bar."""
    import numpy as np

    plt = _plt()
    names = _reader_names(result)
    layouts = [lay["name"] for lay in result["layouts"]]
    fig, ax = plt.subplots(figsize=(max(8, 2.2 * len(layouts) + 3), 4.5))
    n = max(1, len(names))
    width = 0.8 / n
    x = np.arange(len(layouts))
    for i, name in enumerate(names):
        recs = [lay["readers"].get(name, {}) for lay in result["layouts"]]
        p50 = [r.get("p50_ms") for r in recs]
        p95 = [r.get("p95_ms") for r in recs]
        if all(v is None for v in p50):
            continue
        ys = [v if v is not None else np.nan for v in p50]
        err = [max(0.0, (b or 0) - (a or 0)) if a is not None else 0 for a, b in zip(p50, p95, strict=True)]
        ax.bar(x + (i - (n - 1) / 2) * width, ys, width, yerr=[[0] * len(err), err], capsize=2, label=name)
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels(layouts, rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("ms per z-plane (p50, bar to p95)")
    ax.set_title(
        f"Browsing {tuple(result['shape'])} {result['dtype']}: {result['planes']} random planes "
        f"({result['device']}{', ' + result['device_name'] if result.get('device_name') else ''})",
        fontsize=10,
    )
    ax.legend(fontsize=7, ncol=min(n, 3))
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
