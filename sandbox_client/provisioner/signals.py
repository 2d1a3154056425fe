"""SIGTERM and SIGINT turned into an orderly unwind, so a killed trainer still drains its pods.

Sandman's pods outlived their job when a teardown hook did not run (table A47). A handler here
raises in the main thread (``SystemExit(143)`` for SIGTERM, ``KeyboardInterrupt`` for SIGINT),
which unwinds through ``with Provisioner(...)`` and so through the drain; ``atexit`` covers code
that never entered the context. A second signal during the drain is logged and ignored: cutting
a drain short is exactly how pods leak.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)


class SignalDrain:
    """Installs and restores the handlers for one provisioner; main thread only (Python's rule)."""

    def __init__(self, draining: Callable[[], bool], label: str) -> None:
        self._draining = draining
        self._label = label
        self._signalled = False
        self._previous: dict[int, Any] = {}

    def install(self) -> bool:
        """Install the handlers; False (nothing done) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        return True

    def restore(self) -> None:
        """Put back whatever handlers were there before."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._signalled or self._draining():
            log.warning("signal %d while draining %s: finishing the drain first", signum,
                        self._label)
            return
        self._signalled = True
        log.warning("signal %d: unwinding to drain %s", signum, self._label)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)
