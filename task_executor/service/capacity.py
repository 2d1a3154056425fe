"""Bounded concurrency: a fixed number of slots, refused (429) rather than queued when full.

Grading work never waits in an unbounded queue: a caller that finds no free slot is told to come
back later (Retry-After) and can try another executor meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from task_executor.errors import OverCapacity


class Slots:
    """``limit`` slots; ``hold()`` takes one or raises OverCapacity (``code``) at once."""

    def __init__(
        self, limit: int, what: str, retry_after: int = 2, code: str = "over_capacity"
    ) -> None:
        self.limit = limit
        self.what = what
        self.retry_after = retry_after
        self.code = code
        self._in_use = 0
        self._lock = threading.Lock()

    @property
    def in_use(self) -> int:
        return self._in_use

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._lock:
            if self._in_use >= self.limit:
                raise OverCapacity(
                    f"all {self.limit} {self.what} slots are busy; retry later",
                    retry_after=self.retry_after,
                    code=self.code,
                )
            self._in_use += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_use -= 1
