"""Idempotent pod operations: a create that always learns what it did, and a delete until gone.

These are the error paths of Sandman's table 2, each with its fix:

- *an error answer after the API stored the pod is not proof of no pod*: every create carries a
  nonce label; after a 5xx, a lost reply or a 409 the pod is read back by name and adopted only if
  the nonce is ours. A same-named pod with another nonce belongs to someone else and is left alone.
- a retry reuses the same name and nonce, so an earlier attempt that lands late makes the retry
  answer 409 and is adopted, instead of becoming a second, unowned pod.
- *a sent delete is not a done delete*: deletes are repeated until the API answers 404, and carry
  the pod's uid as a precondition so a same-named stranger is never deleted.

Every wait goes through :class:`Retry`, whose clock and sleep are injectable.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from .api import Pod, PodAPI
from .errors import (
    APIConflictError,
    APIError,
    APINotFoundError,
    APIServerError,
    APITooManyRequests,
    ProvisionerError,
    RequestNotSent,
    TransportError,
)
from .manifests import NONCE_LABEL
from .pacing import Clock, Sleep

log = logging.getLogger(__name__)

CREATED, ABSENT, COLLISION, UNKNOWN = "created", "absent", "collision", "unknown"


@dataclass
class Retry:
    """A deadline plus a backoff sequence (the last value repeats), on an injectable clock."""

    backoff: tuple[float, ...]
    deadline: float
    clock: Clock
    sleep: Sleep
    attempt: int = 0

    def expired(self) -> bool:
        return self.clock() >= self.deadline

    def wait(self, hint: float | None = None) -> bool:
        """Sleep the next backoff (or ``hint``: Retry-After); False once the deadline is past."""
        now = self.clock()
        if now >= self.deadline:
            return False
        delay = hint if hint is not None else self.backoff[min(self.attempt, len(self.backoff) - 1)]
        self.attempt += 1
        self.sleep(min(delay, self.deadline - now))
        return True


@dataclass
class CreateResult:
    """What a create ended as: ``created`` (ours, maybe adopted), ``absent`` (nothing stored),
    ``collision`` (the name belongs to another pod, left alone) or ``unknown`` (deadline passed
    while ambiguous: the name and nonce must be checked again before the slot is freed)."""

    outcome: str
    pod: Pod | None = None
    error: ProvisionerError | None = None
    sent: bool = False
    adopted: bool = False


def nonce_of(pod: Pod) -> str | None:
    return (pod.get("metadata", {}).get("labels") or {}).get(NONCE_LABEL)


_UNANSWERED = object()


def read_back(api: PodAPI, name: str, retry: Retry) -> Any:
    """The pod named ``name``, None if it does not exist, or ``_UNANSWERED`` at the deadline."""
    while True:
        try:
            return api.read(name)
        except APINotFoundError:
            return None
        except APITooManyRequests as exc:
            if not retry.wait(exc.retry_after):
                return _UNANSWERED
        except (APIServerError, TransportError):
            if not retry.wait():
                return _UNANSWERED


def _judge(pod: Pod, nonce: str, result: CreateResult) -> CreateResult:
    if nonce_of(pod) == nonce:
        result.outcome, result.pod, result.adopted = CREATED, pod, True
    else:
        result.outcome = COLLISION  # the name is another pod's: leave it alone
    return result


def create_owned(api: PodAPI, body: Pod, retry: Retry, pace: Callable[[], bool],
                 stop: Callable[[], bool], settle_s: float) -> CreateResult:
    """Create ``body`` and find out for certain whether it exists; never leave a pod unaccounted.

    ``pace`` waits for a token before each attempt (False: withdraw); ``stop`` says the caller has
    given up, which ends retrying but never skips resolving an attempt already sent.
    """
    name, nonce = body["metadata"]["name"], body["metadata"]["labels"][NONCE_LABEL]
    result = CreateResult(ABSENT)
    while True:
        if stop() or not pace():
            return result
        result.sent = True
        try:
            result.pod, result.outcome = api.create(body), CREATED
            return result
        except APITooManyRequests as exc:
            # Priority-and-fairness rejects before storing: honour Retry-After, then try again.
            result.error = exc
            if not retry.wait(exc.retry_after):
                return result
            continue
        except RequestNotSent as exc:
            result.error = exc
            if not retry.wait():
                return result
            continue
        except (APIConflictError, APIServerError, TransportError) as exc:
            result.error = exc  # ambiguous: the pod may exist, ours or someone else's
        except APIError as exc:
            result.error = exc  # refused (403 admission, 422 invalid): nothing was stored
            return result
        found = read_back(api, name, retry)
        if found is _UNANSWERED:
            result.outcome = UNKNOWN
            return result
        if found is not None:
            return _judge(found, nonce, result)
        if stop() or not retry.wait():
            # We will not try again and the pod is not there *yet*: look once more after the
            # create has had time to land, so a slow admission cannot slip a pod past us.
            retry.sleep(settle_s)
            found = read_back(api, name, retry)
            if found is _UNANSWERED:
                result.outcome = UNKNOWN
            elif found is not None:
                return _judge(found, nonce, result)
            return result
        # Retry under the same name and nonce: if the first attempt lands late, this one gets 409.


def delete_until_gone(api: PodAPI, name: str, retry: Retry, poll_s: float,
                      uid: str | None = None, nonce: str | None = None) -> bool:
    """Delete our pod ``name`` and wait until the API says 404; False if the deadline came first.

    Without a ``uid`` the pod is read first and deleted only if its nonce is ``nonce``.
    """
    if uid is None:
        found = read_back(api, name, retry)
        if found is _UNANSWERED:
            return False
        if found is None:
            return True
        if nonce is not None and nonce_of(found) != nonce:
            return True  # not ours: ours never existed under this name
        uid = found["metadata"].get("uid")
    while True:
        try:
            api.delete(name, uid=uid)
        except APINotFoundError:
            return True
        except APIConflictError:
            return True  # the uid precondition failed: the name now holds another pod
        except APITooManyRequests as exc:
            if not retry.wait(exc.retry_after):
                return False
            continue
        except ProvisionerError as exc:
            # 5xx or a lost reply: the delete may or may not have happened; ask again.
            log.debug("delete of pod %s failed (%s); retrying", name, exc)
            if not retry.wait():
                return False
            continue
        while True:  # accepted: the pod may linger while terminating
            if retry.expired():
                return False
            retry.sleep(poll_s)
            try:
                pod = api.read(name)
            except APINotFoundError:
                return True
            except ProvisionerError:
                continue
            if uid and pod["metadata"].get("uid") != uid:
                return True
            if not pod["metadata"].get("deletionTimestamp"):
                break  # our delete did not take effect: send it again


T = TypeVar("T")
R = TypeVar("R")


def run_parallel(fn: Callable[[T], R], items: Iterable[T], workers: int) -> list[R]:
    """``fn`` over ``items`` on up to ``workers`` daemon threads; results in input order.

    Daemon threads rather than an executor: a drain running from ``atexit`` cannot submit to a
    ``ThreadPoolExecutor`` once the interpreter has begun shutting down.
    """
    todo = list(enumerate(items))
    results: dict[int, R] = {}
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                index, item = todo.pop()
            try:
                value = fn(item)
            except Exception:  # one failed item must not strand the rest
                log.exception("parallel pod operation failed")
                continue
            with lock:
                results[index] = value

    threads = []
    for _ in range(min(workers, len(todo))):
        thread = threading.Thread(target=worker, daemon=True, name="dockyard-delete")
        try:
            thread.start()
        except RuntimeError:
            break  # the interpreter refuses new threads this late: finish inline below
        threads.append(thread)
    if not threads:
        worker()
    for thread in threads:
        thread.join()
    return [results[index] for index in sorted(results)]
