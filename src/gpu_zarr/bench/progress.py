"""Progress display: a rich progress bar when rich is installed, plain lines otherwise.

Log lines always go to stdout as plain text as well, so a non-interactive run (a
log file, a remote command's output tail) keeps a readable record.
"""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["Progress"]


class Progress:
    """``with Progress() as p: t = p.task("writing", total); p.update(t, done); p.log(msg)``."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._rich: Any = None
        self._plain: dict[int, list[Any]] = {}
        self._t0 = time.perf_counter()

    def __enter__(self) -> Progress:
        if self.enabled:
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    TextColumn,
                    TimeElapsedColumn,
                    TimeRemainingColumn,
                )
                from rich.progress import (
                    Progress as RichProgress,
                )

                console = Console(file=sys.stdout)
                if console.is_terminal:
                    self._rich = RichProgress(
                        TextColumn("[bold]{task.description}"),
                        BarColumn(),
                        MofNCompleteColumn(),
                        TimeElapsedColumn(),
                        TimeRemainingColumn(),
                        console=console,
                        transient=False,
                    )
                    self._rich.__enter__()
            except Exception:
                self._rich = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.__exit__(*exc)
            self._rich = None

    def task(self, description: str, total: int, *, plain_lines: bool = True) -> int:
        """A bar; without rich, ``plain_lines`` prints a line every 10 %."""
        if self._rich is not None:
            return self._rich.add_task(description, total=total)
        tid = len(self._plain)
        self._plain[tid] = [description, total, 0, -1 if plain_lines else 10**9]
        return tid

    def update(self, tid: int, completed: int, total: int | None = None) -> None:
        if self._rich is not None:
            kw = {"completed": completed}
            if total is not None:
                kw["total"] = total
            self._rich.update(tid, **kw)
            return
        st = self._plain.get(tid)
        if st is None or not self.enabled:
            return
        if total is not None:
            st[1] = total
        st[2] = completed
        pct = int(100 * completed / st[1]) if st[1] else 100
        step = pct // 10
        if st[3] < 10**9 and step != st[3]:
            st[3] = step
            self.log(f"{st[0]}: {pct}% ({completed}/{st[1]})")

    def advance(self, tid: int, n: int = 1) -> None:
        if self._rich is not None:
            self._rich.advance(tid, n)
            return
        st = self._plain.get(tid)
        if st is not None:
            self.update(tid, st[2] + n)

    def log(self, msg: str) -> None:
        stamp = f"[{time.perf_counter() - self._t0:7.1f}s]"
        if self._rich is not None:
            self._rich.console.print(f"{stamp} {msg}", markup=False, highlight=False)
        else:
            print(f"{stamp} {msg}", flush=True)
