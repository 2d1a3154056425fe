"""Recent results by task, so a client that retries after a lost reply gets the first verdict.

The key is the task_id together with a digest of the whole request: RL trainers send many rollouts
of one SWE-bench instance under the same instance_id, and each different patch must be graded;
only a byte-identical resubmission is answered from here. Results without a verdict
(execution_error) are not kept, so a retry runs again.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from sandbox_client.protocol import TaskResult, TaskSpec
from task_executor.errors import Conflict


def request_key(spec: TaskSpec) -> str:
    digest = hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:32]
    return f"{spec.task_id}:{digest}"


class TaskRegistry:
    """Tasks in progress and finished results, each finished one kept for ``ttl`` seconds."""

    def __init__(
        self, ttl: float, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._running: set[str] = set()
        self._done: OrderedDict[str, tuple[float, TaskResult]] = OrderedDict()
        self._lock = threading.Lock()

    def begin(self, key: str) -> TaskResult | None:
        """The stored result for ``key``, or None after marking it running (Conflict if it is)."""
        with self._lock:
            self._evict()
            if key in self._done:
                return self._done[key][1]
            if key in self._running:
                raise Conflict(
                    "this task is being graded now; its result will be kept for a retry",
                    code="task_in_progress",
                    retry_after=5,
                )
            self._running.add(key)
            return None

    def end(self, key: str, result: TaskResult | None) -> None:
        with self._lock:
            self._running.discard(key)
            if result is not None and result.status != "execution_error":
                self._done[key] = (self._clock(), result)
                self._done.move_to_end(key)
                self._evict()

    def _evict(self) -> None:
        now = self._clock()
        while self._done:
            key, (stored_at, _) = next(iter(self._done.items()))
            if now - stored_at <= self.ttl and len(self._done) <= self.max_entries:
                break
            del self._done[key]
