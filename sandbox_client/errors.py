"""The client's exceptions: every way a call to an executor can fail, and the caller's own bug.

Nothing else escapes the client: requests, urllib3, JSON and pydantic errors are translated into
these classes at one boundary (``SandboxClient._exchange``) and chained with ``raise ... from``,
so the original cause stays in the traceback. A spec the client refuses before sending anything
is ``SpecError``, a ``ValueError`` and deliberately *not* a ``TaskExecutorError``: it is the
caller's bug, raised at once, and must never be read as "the executors failed" (issue #25: a
spec with two different ids made a whole reward batch look like a dead fleet). The
``TaskExecutorError`` tree says what a caller may safely do next::

    SpecError (ValueError)            a spec the client refuses before sending: .field names
                                      it, .code is invalid_spec; sending it again unchanged, to
                                      any executor, fails the same way (alias: InvalidSpec)

    TaskExecutorError                 anything went wrong talking to an executor
    ├── InvalidConfig                 the client's own configuration is unusable (bad URL,
    │                                 routing; also a ValueError): .code is invalid_config
    ├── ExecutorUnreachable           the request provably never reached a server (connection
    │                                 refused, connect timeout, name resolution): safe to send
    │                                 anywhere else
    ├── ReplyLost                     the request went out but no answer came back: it may have
    │   │                             run; only an idempotent re-submit (same
    │   │                             Idempotency-Key, same executor) is safe
    │   ├── ExecutorTimeout           no answer within the read timeout
    │   └── ConnectionLost            the connection broke mid-call (executor killed, reset)
    ├── ExecutorRejected              the executor answered with an error (code, status, message)
    │   └── ExecutorBusy              429/503 still answered after the retry budget was spent
    └── ProtocolError                 an answer that does not decode or does not validate

Reward code should not branch on these: ``sandbox_client.reward.run_task_safe`` turns all of them
into a ``TaskResult`` with status ``execution_error`` ("no verdict: resample"), never a 0; a
``SpecError`` becomes one too, with error code ``invalid_spec``, which
``reward.no_verdict_cause`` calls ``caller_bug``, never ``infrastructure``.
"""

from __future__ import annotations

from typing import Any, TypeVar

import pydantic

__all__ = [
    "ConnectionLost",
    "ExecutorBusy",
    "ExecutorRejected",
    "ExecutorTimeout",
    "ExecutorUnreachable",
    "InvalidConfig",
    "InvalidSpec",
    "ProtocolError",
    "ReplyLost",
    "SpecError",
    "TaskExecutorError",
    "parse_spec",
]

M = TypeVar("M", bound=pydantic.BaseModel)
E = TypeVar("E", bound=Exception)


class TaskExecutorError(Exception):
    """Base class: a call to a task executor did not produce a usable answer."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        #: Base URL of the executor the call went to (None when no executor was chosen).
        self.url = url

    def __str__(self) -> str:
        return f"{self.message} [{self.url}]" if self.url else self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only fields defeat Exception's default pickling (which replays ``args``); errors
        # must survive a trip through multiprocessing or a process-pool reward worker.
        return (_rebuild, (type(self), dict(self.__dict__)))


def _rebuild(cls: type[E], state: dict[str, Any]) -> E:
    error = cls.__new__(cls)
    Exception.__init__(error, state.get("message", ""))
    error.__dict__.update(state)
    return error


class ExecutorUnreachable(TaskExecutorError):
    """No connection could be made: the request never reached a server."""


class ReplyLost(TaskExecutorError):
    """The request was sent but no answer arrived; the executor may have acted on it."""


class ExecutorTimeout(ReplyLost):
    """The executor did not answer within the read timeout."""


class ConnectionLost(ReplyLost):
    """The connection broke after the request was (perhaps partly) sent."""


class ExecutorRejected(TaskExecutorError):
    """The executor answered with an error status and an ``{"error": {code, message}}`` body."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status: int,
        retry_after: float | None = None,
        url: str | None = None,
    ) -> None:
        super().__init__(message, url=url)
        #: Machine-readable code from the error body (``http_<status>`` when there was none).
        self.code = code
        #: HTTP status of the answer.
        self.status = status
        #: Seconds the executor asked the caller to wait (its ``Retry-After``), if it said.
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {super().__str__()}"


class ExecutorBusy(ExecutorRejected):
    """429 or 503: the executor did not take the request (retried until the budget is spent)."""


class ProtocolError(TaskExecutorError):
    """An answer arrived but is not what protocol v1 says it must be."""


class SpecError(ValueError):
    """A request the client refuses to send: it does not validate against protocol v1. Nothing
    reached an executor; sending it again unchanged fails the same way. The caller's own bug:
    not a ``TaskExecutorError``, so ``except TaskExecutorError`` (executor trouble) never
    swallows it."""

    code = "invalid_spec"

    def __init__(self, message: str, *, field: str, model: str, problem: str = "") -> None:
        super().__init__(message)
        self.message = message
        #: The first offending field, dotted (``fail_to_pass.0``; ``body`` for the whole).
        self.field = field
        #: What is wrong with it (pydantic's message).
        self.problem = problem
        #: The protocol model it was validated as (``TaskSpec``, ``SessionStartSpec`` ...).
        self.model = model

    def __reduce__(self) -> tuple[Any, ...]:
        # As TaskExecutorError's: keyword-only fields, and reward workers may be processes.
        return (_rebuild, (type(self), dict(self.__dict__)))


InvalidSpec = SpecError
"""The name ``SpecError`` had before issue #25 (when it was a ``TaskExecutorError`` too)."""


class InvalidConfig(TaskExecutorError, ValueError):
    """The client's configuration is unusable (no URL, a URL that is not http(s), a routing
    that does not exist); raised when a ``SandboxClient`` or ``ClientConfig`` is made."""

    code = "invalid_config"


def first_problem(exc: pydantic.ValidationError) -> tuple[str, str]:
    """(dotted location, message) of the first error pydantic found."""
    first = exc.errors()[0]
    return ".".join(str(part) for part in first["loc"]) or "body", first["msg"]


def parse_spec(model: type[M], value: Any) -> M:
    """``value`` (a model or a mapping) validated as ``model``; ``SpecError`` naming the field
    otherwise, raised before anything is sent."""
    try:
        return model.model_validate(value)
    except pydantic.ValidationError as exc:
        where, problem = first_problem(exc)
        raise SpecError(
            f"invalid {model.__name__}: {where}: {problem}",
            field=where, model=model.__name__, problem=problem,
        ) from exc
