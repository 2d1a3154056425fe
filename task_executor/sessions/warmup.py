"""Shells launched after their start has answered (``DOCKYARD_SESSION_LAUNCH=background``).

A session start spends most of its time launching the shell: bubblewrap's namespaces and mounts,
then bash answering its first ping (20-30 ms of CPU here, against ~5 ms for the tree). An agent's
first command comes after a model call, seconds later, so with ``background`` the start answers
once the tree is ready and its shell is started *parked* (see ``idle``); one thread here then
launches the parked shells, oldest first. A call that comes first starts the shell itself (the
runner's lock orders the two: never two shells, never a refused call), and a launch that fails
leaves the shell parked, for the next call to try again and answer why.

A shell queued longer than the idle stop would be stopped as soon as it ran, so it is left for its
first call instead: under a burst of starts the queue costs no more CPU than the idle stop allows.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)


class Launchable(Protocol):
    def launch_parked(self) -> bool: ...


class Warmup:
    """One thread launching the shells handed to :meth:`submit`, in order."""

    def __init__(self, max_wait: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        """``max_wait``: seconds a shell may wait in the queue (None: no limit)."""
        self._max_wait = max_wait
        self._clock = clock
        self._queue: queue.SimpleQueue[tuple[Launchable, float] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()
        self._closed = False
        self.launched = 0
        self.skipped = 0

    def submit(self, shell: Launchable) -> None:
        with self._guard:
            if self._closed:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="shell-warmup", daemon=True)
                self._thread.start()
            self._queue.put((shell, self._clock()))

    def close(self) -> None:
        """Stop launching (at shutdown); a launch in progress finishes."""
        with self._guard:
            self._closed = True
            thread = self._thread
        self._queue.put(None)
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None or self._closed:
                return
            shell, queued_at = item
            if self._max_wait is not None and self._clock() - queued_at > self._max_wait:
                self.skipped += 1
                continue
            try:
                if shell.launch_parked():
                    self.launched += 1
            except Exception as error:  # the shell stays parked: its first call tries again
                log.warning("a session's shell did not start in the background: %s", error)
