"""A bounded head+tail byte buffer for command output.

Output is drained continuously while a command runs (so a writer never blocks on a full pipe and
an endless printer still reaches its timeout), but only the first ``head`` and last ``tail`` bytes
are kept: memory stays flat whatever the command prints (Sandman table A27: buffering everything
grew the daemon to three times the output and got it killed).
"""

from __future__ import annotations

import threading

DEFAULT_HEAD = 64 * 1024
DEFAULT_TAIL = 64 * 1024
_MARKER = "\n[... {} bytes omitted ...]\n"


class CappedOutput:
    """Keeps the first ``head`` and the last ``tail`` bytes written; counts everything."""

    def __init__(self, head: int = DEFAULT_HEAD, tail: int = DEFAULT_TAIL) -> None:
        self._head_limit = head
        self._tail_limit = tail
        self._head = bytearray()
        self._tail = bytearray()
        self._total = 0
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            self._total += len(data)
            room = self._head_limit - len(self._head)
            if room > 0:
                self._head += data[:room]
                data = data[room:]
            if not data or self._tail_limit == 0:
                return
            if len(data) >= self._tail_limit:
                self._tail = bytearray(data[-self._tail_limit :])
            else:
                self._tail += data
                excess = len(self._tail) - self._tail_limit
                if excess > 0:
                    del self._tail[:excess]

    @property
    def total_bytes(self) -> int:
        return self._total

    @property
    def truncated(self) -> bool:
        return self._total > len(self._head) + len(self._tail)

    def getvalue(self) -> bytes:
        """The kept bytes; when the middle was dropped, a marker says how much."""
        with self._lock:
            omitted = self._total - len(self._head) - len(self._tail)
            if omitted <= 0:
                return bytes(self._head + self._tail)
            return bytes(self._head) + _MARKER.format(omitted).encode() + bytes(self._tail)

    def text(self) -> str:
        """The kept bytes decoded as UTF-8, undecodable bytes replaced (for JSON answers)."""
        return self.getvalue().decode("utf-8", errors="replace")
