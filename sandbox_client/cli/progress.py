"""A one-line progress bar on stderr, with a count per outcome (no dependency).

On a terminal the line is redrawn in place (``\\r``); in a log file it is printed as a new line
every tenth of the way, so CI logs stay short.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import TextIO


class Progress:
    """Counts finished items by category and draws ``label done/total | cat n ... | rate``."""

    def __init__(
        self,
        total: int,
        categories: Sequence[str],
        *,
        label: str = "grading",
        stream: TextIO | None = None,
        live: bool | None = None,
    ) -> None:
        self.total = total
        self.categories = list(categories)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.counts: Counter[str] = Counter()
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._step = max(1, total // 10)
        self._drawn = -1

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    def advance(self, category: str) -> None:
        with self._lock:
            self.counts[category] += 1
            if self.live or self.done % self._step == 0 or self.done == self.total:
                self._draw(final=False)

    def finish(self) -> None:
        with self._lock:
            self._draw(final=True)

    def line(self) -> str:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        counts = " ".join(f"{c.replace('_', ' ')} {self.counts[c]}" for c in self.categories)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        return (
            f"{self.label} {self.done}/{self.total} | {counts} | "
            f"{rate:.2f}/s, {elapsed:.0f}s elapsed, eta {eta:.0f}s"
        )

    def _draw(self, *, final: bool) -> None:
        if self.live:
            end = "\n" if final else ""
            self.stream.write(f"\r\x1b[K{self.line()}{end}")
        elif self._drawn != self.done:
            self.stream.write(self.line() + "\n")
        self._drawn = self.done
        self.stream.flush()
