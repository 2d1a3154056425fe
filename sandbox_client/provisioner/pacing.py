"""Token-bucket pacing of pod creates, with an injectable clock so tests need not wait.

Sandman's unpaced bursts took down a shared admission webhook and drew 429s from the API server's
priority-and-fairness limits (tables A14, A41, A43); paced creates had neither. A bucket holds up to
``burst`` tokens and refills at ``rate`` per second; each create takes one. Callers that find the
bucket empty *reserve* a future token (the bucket goes into debt), so concurrent callers are
served in order without a thundering herd, and a caller that gives up before its turn can hand
its reservation back.

Jitter (:meth:`TokenBucket.jitter_delay`) delays a send by a random extra in ``[0, jitter]``
seconds *after* its token is taken. The bucket keeps refilling meanwhile, so the next caller's
token is not pushed back: sends spread inside their slots, the long-run rate stays as configured.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

Clock = Callable[[], float]
Sleep = Callable[[float], None]


@dataclass
class TokenBucket:
    """Paces events to ``rate`` per second with bursts of up to ``burst``; thread-safe."""

    rate: float
    burst: int = 1
    jitter: float = 0.0
    clock: Clock = time.monotonic
    sleep: Sleep = time.sleep
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError("rate must be positive")
        if self.burst < 1:
            raise ValueError("burst must be at least 1")
        if self.jitter < 0:
            raise ValueError("jitter must not be negative")
        self._lock = threading.Lock()
        self._tokens = float(self.burst)
        self._stamp = self.clock()

    def reserve(self) -> float:
        """Take a token now or in the future; return the clock time at which to send."""
        with self._lock:
            now = self.clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= 1.0
            return now if self._tokens >= 0 else now + (-self._tokens) / self.rate

    def jitter_delay(self) -> float:
        """A random extra delay for one send, in ``[0, jitter]`` seconds."""
        with self._lock:
            return self.rng.uniform(0.0, self.jitter) if self.jitter else 0.0

    def refund(self) -> None:
        """Give back a reserved token that was not used (its caller withdrew before sending)."""
        with self._lock:
            self._tokens = min(float(self.burst), self._tokens + 1.0)

    def acquire(self, deadline: float | None = None,
                cancelled: Callable[[], bool] | None = None) -> bool:
        """Wait for a token; False (token refunded) if ``deadline`` or ``cancelled()`` comes first.

        ``deadline`` is a time on this bucket's clock. Waiting happens in short steps so that a
        cancellation withdraws a queued create promptly instead of sending it late. Jitter is
        not applied here: the caller sleeps :meth:`jitter_delay` once it no longer blocks others.
        """
        due = self.reserve()
        while True:
            if cancelled is not None and cancelled():
                self.refund()
                return False
            now = self.clock()
            if now >= due:
                return True
            if deadline is not None and now >= deadline:
                self.refund()
                return False
            step = due - now
            if deadline is not None:
                step = min(step, max(0.0, deadline - now))
            if cancelled is not None:
                step = min(step, 0.05)
            self.sleep(step)
