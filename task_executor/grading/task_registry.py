"""Answers kept for a retry of the same call, so a client that lost a reply gets the first one.

A call is named by its ``Idempotency-Key`` header: the client makes one key per logical
submission (a ``run_task`` call, a session's ``finish``) and sends it again only when it retries
that call. So a new submission always grades afresh, even with a byte-identical body (a preflight
repeat, a ``dockyard grade`` run after its report was deleted): replaying there would hide a
flaky test. A call without a key is never stored and never replayed.

Per key, as in Stripe's API and the IETF idempotency-key draft: the same key with the same
request gets the stored answer (or 409 ``task_in_progress`` while the first is still running:
the retry polls instead of holding a thread, and never starts a second grading); the same key
with a different request is the caller's bug, refused with 422 ``idempotency_key_reused``.
Answers are kept ``ttl`` seconds; the caller decides which are worth keeping (a submit's
``execution_error`` is not, so its retry grades again).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from pydantic import BaseModel

from task_executor.errors import Conflict, ValidationFailed

Answer = TypeVar("Answer", bound=BaseModel)

MAX_KEY_LENGTH = 255


def fingerprint(request: BaseModel) -> str:
    """A digest of the request as validated: a retry's body gives the same one."""
    return hashlib.sha256(request.model_dump_json().encode()).hexdigest()


class TaskRegistry(Generic[Answer]):
    """Calls in progress and the answers of finished ones, each kept for ``ttl`` seconds."""

    def __init__(
        self, ttl: float, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._running: dict[str, str] = {}
        self._done: OrderedDict[str, tuple[float, str, Answer]] = OrderedDict()
        self._lock = threading.Lock()

    def begin(self, key: str | None, digest: str) -> Answer | None:
        """The stored answer for ``key``, or None after marking it running.

        Conflict (409) while it runs, ValidationFailed (422) if ``key`` was used for a different
        request; a None key is never tracked.
        """
        if key is None:
            return None
        with self._lock:
            self._evict()
            if key in self._done:
                _, stored_digest, answer = self._done[key]
                self._check(stored_digest, digest)
                return answer
            if key in self._running:
                self._check(self._running[key], digest)
                raise Conflict(
                    "this call is being graded now; its answer is kept for a retry with the "
                    "same Idempotency-Key",
                    code="task_in_progress",
                    retry_after=5,
                )
            self._running[key] = digest
            return None

    def end(self, key: str | None, answer: Answer | None) -> None:
        """The call under ``key`` ended; ``answer`` (None: nothing worth replaying) is kept."""
        if key is None:
            return
        with self._lock:
            digest = self._running.pop(key, None)
            if answer is not None and digest is not None:
                self._done[key] = (self._clock(), digest, answer)
                self._done.move_to_end(key)
                self._evict()

    @staticmethod
    def _check(stored: str, digest: str) -> None:
        if stored != digest:
            raise ValidationFailed(
                "this Idempotency-Key was already used for a different request; make a new "
                "key for every new submission",
                code="idempotency_key_reused",
            )

    def _evict(self) -> None:
        now = self._clock()
        while self._done:
            key, (stored_at, _, _) = next(iter(self._done.items()))
            if now - stored_at <= self.ttl and len(self._done) <= self.max_entries:
                break
            del self._done[key]
