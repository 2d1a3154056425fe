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
import time
from collections.abc import Callable
from typing import Protocol

from .worker import QueueWorker

log = logging.getLogger(__name__)


class Launchable(Protocol):
    def launch_parked(self) -> bool: ...


class Warmup(QueueWorker[tuple[Launchable, float]]):
    """One thread launching the shells handed to :meth:`submit`, in order."""

    thread_name = "shell-warmup"

    def __init__(self, max_wait: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        """``max_wait``: seconds a shell may wait in the queue (None: no limit)."""
        super().__init__()
        self._max_wait = max_wait
        self._clock = clock
        self.launched = 0
        self.skipped = 0

    def submit(self, shell: Launchable) -> None:
        """Launch ``shell`` soon (nothing once closed: its first call starts it)."""
        self.put((shell, self._clock()))

    def handle(self, item: tuple[Launchable, float]) -> None:
        shell, queued_at = item
        if self._max_wait is not None and self._clock() - queued_at > self._max_wait:
            self.skipped += 1
            return
        try:
            if shell.launch_parked():
                self.launched += 1
        except Exception as error:  # the shell stays parked: its first call tries again
            log.warning("a session's shell did not start in the background: %s", error)
