"""Control runs: the task's tests without the agent's patch, run once per task and kept.

A control is keyed by everything that decides its outcome and nothing the agent controls: the
template key (repository source, commit sha, setup, environment), the test patch, the test command
and parser, egress and the wall clock. The agent's patch is never part of it, and the control runs
in a fresh workspace of the template, whose copy-on-write layers no grading can write through; so
no patch can choose the control its own run is judged by.

The first grading that needs a key runs it; gradings that need the same key meanwhile wait for that
run instead of starting their own (the template cache's single-flight rule). A run that raised
(an infrastructure fault) is not kept: the next grading that needs it tries again.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from .consistency import RunEvidence


def control_key(template: str, test_patch: str, command: str, parser: str, deny_network: bool,
                timeout: float) -> str:
    material = json.dumps([template, test_patch, command, parser, deny_network, timeout])
    return hashlib.sha256(material.encode("utf-8", "surrogateescape")).hexdigest()[:32]


@dataclass
class _Entry:
    done: threading.Event = field(default_factory=threading.Event)
    run: RunEvidence | None = None
    error: BaseException | None = None


class ControlCache:
    """Control runs by key, the newest ``max_entries`` kept; thread-safe."""

    def __init__(self, max_entries: int = 512) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.runs = 0
        """Control runs started (a run a grading waited for counts once)."""

    def get(self, key: str, run: Callable[[], RunEvidence]) -> tuple[RunEvidence, bool]:
        """The control for ``key`` and whether this call ran it (False: kept, or run by a
        concurrent caller that this one waited for); ``run``'s exception propagates."""
        with self._lock:
            entry = self._entries.get(key)
            owner = entry is None
            if entry is None:
                entry = self._entries[key] = _Entry()
                self.runs += 1
            self._entries.move_to_end(key)
        if owner:
            try:
                entry.run = run()
            except BaseException as exc:
                entry.error = exc
                with self._lock:
                    if self._entries.get(key) is entry:
                        del self._entries[key]
                raise
            finally:
                entry.done.set()
                self._trim()
            return entry.run, True
        entry.done.wait()
        if entry.run is None:
            raise RuntimeError(f"the control run this grading waited for failed: {entry.error}")
        return entry.run, False

    def offer(self, key: str, run: RunEvidence) -> None:
        """Keep ``run`` as the control for ``key`` unless one is kept or running (a grading of
        the empty patch *is* the control run)."""
        with self._lock:
            if key in self._entries:
                return
            entry = self._entries[key] = _Entry(run=run)
            entry.done.set()
        self._trim()

    def _trim(self) -> None:
        with self._lock:
            while len(self._entries) > self.max_entries:
                oldest = next(iter(self._entries))
                if not self._entries[oldest].done.is_set():
                    break
                del self._entries[oldest]
