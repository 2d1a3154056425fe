"""One thread working through a queue beside the requests: the shape of ``Warmup`` (shells started
after their start answered) and ``Reclaimer`` (workspaces removed after their DELETE answered).

The thread starts with the first item, so an executor that never needs it never has it. Items are
handled in order, one at a time; a failure is the subclass's to report and never stops the thread.
At shutdown ``close`` lets the item in hand finish and returns what still waits, for the caller to
finish in bulk or drop.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from typing import Generic, TypeVar

Item = TypeVar("Item")


class QueueWorker(Generic[Item]):
    """Handles the items given to :meth:`put` on a thread of its own (see the module)."""

    thread_name = "queue-worker"
    nice: int | None = None
    """The thread's nice value, when its work should yield the CPU to the requests (Linux)."""

    def __init__(self, limit: int | None = None) -> None:
        """``limit``: items waiting at most (the one in hand included); None: no limit."""
        self._limit = limit
        self._queue: queue.SimpleQueue[Item | None] = queue.SimpleQueue()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Items given and not handled yet (the one in hand included)."""
        return self._waiting

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def put(self, item: Item) -> bool:
        """Queue ``item``; False when closed or full (the caller does the work itself)."""
        with self._guard:
            if self._closed or (self._limit is not None and self._waiting >= self._limit):
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.thread_name,
                                                daemon=True)
                self._thread.start()
            self._waiting += 1
            self._queue.put(item)
            return True

    def close(self) -> list[Item]:
        """Stop (the item in hand is finished) and return the items that still wait."""
        with self._guard:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join()
        left: list[Item] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return left
            if item is not None:
                left.append(item)

    def handle(self, item: Item) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        if self.nice is not None:
            with contextlib.suppress(OSError):  # a thread's own nice value
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self.handle(item)
            finally:
                with self._guard:
                    self._waiting -= 1
            if self._closed:
                return
