"""The executor's error tree; every failure a client can see is one of these.

    ExecutorError                 500 internal_error
    ├── InvalidRequest            400 invalid_request (bad JSON, missing or mistyped fields: 422)
    ├── Unauthorized              401 unauthorized
    ├── Forbidden                 403 forbidden (from_sandbox: a request by code under test)
    ├── NotFound                  404 not_found
    ├── Conflict                  409 conflict
    ├── OverCapacity              429 over_capacity (carries Retry-After)
    │   ├── ShuttingDown          503 shutting_down: draining before exit, no new work taken
    │   └── Unavailable           503 unavailable: the executor failed a step itself (a sandbox
    │                             that did not start, a full disk); the same call may be retried
    └── RepoError                 400 unknown_repo / unknown_commit

Routes raise them; one handler on the app renders
``{"error": {"code", "message", "request_id"}}``, so no traceback ever crosses the wire.
"""

from __future__ import annotations


def http_error_code(reason: str) -> str:
    """The error code of an HTTP error that is not one of ours (raised by Flask/werkzeug, or
    answered by waitress before the app): its reason phrase in snake case."""
    return reason.lower().replace(" ", "_")


class ExecutorError(Exception):
    """Base class: ``code`` and ``http_status`` decide how the error is rendered."""

    code = "internal_error"
    http_status = 500

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def headers(self) -> dict[str, str]:
        return {}


class InvalidRequest(ExecutorError):
    code = "invalid_request"
    http_status = 400


class ValidationFailed(InvalidRequest):
    code = "validation_error"
    http_status = 422


class Unauthorized(ExecutorError):
    code = "unauthorized"
    http_status = 401


class Forbidden(ExecutorError):
    code = "forbidden"
    http_status = 403


class NotFound(ExecutorError):
    code = "not_found"
    http_status = 404


class Conflict(ExecutorError):
    code = "conflict"
    http_status = 409

    def __init__(self, message: str, *, code: str | None = None, retry_after: int = 0) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after else {}


class OverCapacity(ExecutorError):
    code = "over_capacity"
    http_status = 429

    def __init__(self, message: str, *, retry_after: int = 1, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class ShuttingDown(OverCapacity):
    """The executor is draining before it exits: work already running finishes, none starts."""

    code = "shutting_down"
    http_status = 503


class Unavailable(OverCapacity):
    """The executor could not do the call's work for a reason of its own, not the caller's nor
    the agent's (a sandbox that never started a step, its own disk full): nothing was decided,
    and the same call may be retried after ``Retry-After``."""

    code = "unavailable"
    http_status = 503


class RepoError(ExecutorError):
    """The repository or commit a request names cannot be found (the caller's mistake)."""

    code = "unknown_repo"
    http_status = 400
