"""Values computed once per key and kept: the first caller computes, concurrent callers wait.

The control runs and the conditions probe both cost a sandboxed run and both are needed by every
rollout of a task at once (a GRPO group arrives together): one run serves them all. A computation
that raised is not kept, so the next caller tries again; callers that waited for it get the error.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Entry(Generic[T]):
    done: threading.Event = field(default_factory=threading.Event)
    value: T | None = None
    error: BaseException | None = None


class OnceCache(Generic[T]):
    """Values by key, the newest ``max_entries`` kept; thread-safe."""

    def __init__(self, max_entries: int = 512) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, _Entry[T]] = OrderedDict()
        self._lock = threading.Lock()
        self.computed = 0
        """Computations started (one that callers waited for counts once)."""

    def get(self, key: str, compute: Callable[[], T]) -> tuple[T, bool]:
        """The value for ``key`` and whether this call computed it (False: kept, or computed by
        a concurrent caller this one waited for); ``compute``'s exception propagates."""
        with self._lock:
            entry = self._entries.get(key)
            owner = entry is None
            if entry is None:
                entry = self._entries[key] = _Entry()
                self.computed += 1
            self._entries.move_to_end(key)
        if owner:
            try:
                entry.value = compute()
            except BaseException as exc:
                entry.error = exc
                with self._lock:
                    if self._entries.get(key) is entry:
                        del self._entries[key]
                raise
            finally:
                entry.done.set()
                self._trim()
            return entry.value, True
        entry.done.wait()
        if entry.error is not None:
            raise RuntimeError(f"the computation this call waited for failed: {entry.error}")
        return entry.value, False  # type: ignore[return-value]

    def peek(self, key: str) -> T | None:
        """The kept value for ``key``, if one is done (never waits)."""
        with self._lock:
            entry = self._entries.get(key)
        return entry.value if entry is not None and entry.done.is_set() else None

    def offer(self, key: str, value: T) -> None:
        """Keep ``value`` for ``key`` unless one is kept or being computed."""
        with self._lock:
            if key in self._entries:
                return
            entry = self._entries[key] = _Entry(value=value)
            entry.done.set()
        self._trim()

    def _trim(self) -> None:
        with self._lock:
            while len(self._entries) > self.max_entries:
                oldest = next(iter(self._entries))
                if not self._entries[oldest].done.is_set():
                    break
                del self._entries[oldest]
