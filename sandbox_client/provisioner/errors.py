"""The provisioner's error tree, and the one place where client exceptions are translated into it.

Kubernetes answers are sorted by status, as kopf does (``kopf/_cogs/clients/errors.py``); transport
failures are sorted by what they prove about the request, because that decides what is safe next::

    ProvisionerError
    ├── APIError                      the API answered with a status (the request was processed)
    │   ├── APIClientError            4xx
    │   │   ├── APIUnauthorizedError  401
    │   │   ├── APIForbiddenError     403 (RBAC, admission, quota: the pod was not stored)
    │   │   ├── APINotFoundError      404 (for a delete or a read-back: confirmed gone)
    │   │   ├── APIConflictError      409 (for a create: the name exists, read it back)
    │   │   └── APITooManyRequests    429 (carries the server's Retry-After)
    │   └── APIServerError            5xx (not proof of no pod: the API may have stored it first)
    ├── TransportError                no answer arrived
    │   ├── RequestNotSent            the connection was never made: nothing reached the server
    │   └── ReplyLost                 the request may have been processed; its answer is lost
    ├── ClusterConfigError            no in-cluster config, no usable kubeconfig
    ├── CapacityError                 the live-pod cap left no room before the caller's deadline
    ├── ReadinessTimeout              fewer pods than required became Ready within the budget
    └── ProvisionerClosed             the provisioner is draining or closed; nothing new is created

The official client raises ``ApiException`` for an answer but lets urllib3 exceptions
(``ProtocolError``, ``ReadTimeoutError``, ``MaxRetryError``...) escape for a dropped reply; both
are turned into this tree by :func:`translate`, and only there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import urllib3.exceptions

from ..client import parse_retry_after  # the client's, for the API's 429s too


class ProvisionerError(Exception):
    """Base of every error the provisioner raises."""


class APIError(ProvisionerError):
    """The Kubernetes API answered with a non-2xx status."""

    def __init__(self, status: int, reason: str = "", body: str = "") -> None:
        super().__init__(f"Kubernetes API answered {status} {reason}".strip())
        self.status = status
        self.reason = reason
        self.body = body


class APIClientError(APIError):
    """A 4xx answer."""


class APIUnauthorizedError(APIClientError):
    """401: the credentials were refused."""


class APIForbiddenError(APIClientError):
    """403: RBAC, an admission webhook or a quota refused the request."""


class APINotFoundError(APIClientError):
    """404: the object does not exist (for deletes and read-backs: confirmed gone)."""


class APIConflictError(APIClientError):
    """409: an object with this name already exists."""


class APITooManyRequests(APIClientError):
    """429: priority-and-fairness throttled us; wait ``retry_after`` seconds before trying again."""

    def __init__(self, status: int, reason: str = "", body: str = "",
                 retry_after: float | None = None) -> None:
        super().__init__(status, reason, body)
        self.retry_after = retry_after


class APIServerError(APIError):
    """A 5xx answer. Not proof that nothing was stored (an admission webhook may fail after)."""


class TransportError(ProvisionerError):
    """No answer arrived."""


class RequestNotSent(TransportError):
    """The connection could not be made, so the request surely never reached the server."""


class ReplyLost(TransportError):
    """The request may have reached the server and been processed, but its answer is lost."""


class ClusterConfigError(ProvisionerError):
    """Neither the in-cluster service account nor a kubeconfig could configure the client."""


class CapacityError(ProvisionerError):
    """The live-pod cap left no room for another pod before the caller's deadline."""


class ReadinessTimeout(ProvisionerError):
    """Fewer pods than required became Ready within the job's readiness budget."""

    def __init__(self, message: str, ready_urls: list[str]) -> None:
        super().__init__(message)
        self.ready_urls = ready_urls


class ProvisionerClosed(ProvisionerError):
    """The provisioner is draining or closed and creates nothing new."""


_BY_STATUS: dict[int, type[APIError]] = {
    401: APIUnauthorizedError,
    403: APIForbiddenError,
    404: APINotFoundError,
    409: APIConflictError,
    429: APITooManyRequests,
}


def _header(headers: Any, name: str) -> str | None:
    if headers is None:
        return None
    getter = getattr(headers, "get", None)
    if getter is None:
        return None
    value = getter(name)
    if value is None:
        value = getter(name.lower())
    return None if value is None else str(value)


def from_api_exception(exc: Any) -> ProvisionerError:
    """Build the tree's error for a kubernetes ``ApiException`` (status, reason, body, headers)."""
    status = int(getattr(exc, "status", 0) or 0)
    reason = str(getattr(exc, "reason", "") or "")
    body = getattr(exc, "body", "") or ""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if status == 429:
        retry_after = parse_retry_after(_header(getattr(exc, "headers", None), "Retry-After"))
        return APITooManyRequests(status, reason, str(body), retry_after)
    if 500 <= status <= 599:
        return APIServerError(status, reason, str(body))
    if status == 0:
        # The client reports any TLS failure as status 0, mid-reply ones included: ambiguous.
        return ReplyLost(f"TLS failure talking to the Kubernetes API: {reason}")
    cls = _BY_STATUS.get(status, APIClientError)
    return cls(status, reason, str(body))


def from_transport_error(exc: urllib3.exceptions.HTTPError) -> TransportError:
    """Decide by cause, not class: only a failed connect proves the request never left."""
    cause: BaseException = exc
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        cause = exc.reason
    # NewConnectionError is a ConnectTimeoutError subclass in urllib3 2; name both for 1.26.
    never_connected = (urllib3.exceptions.NewConnectionError,
                       urllib3.exceptions.ConnectTimeoutError)
    if isinstance(cause, never_connected):
        return RequestNotSent(f"could not connect to the Kubernetes API: {cause}")
    return ReplyLost(f"reply from the Kubernetes API lost: {cause!r}")


@contextmanager
def translate() -> Iterator[None]:
    """Run one API call, re-raising whatever it raises as a :class:`ProvisionerError`."""
    from kubernetes.client.exceptions import ApiException  # the [k8s] extra, imported late

    try:
        yield
    except ApiException as exc:
        raise from_api_exception(exc) from exc
    except urllib3.exceptions.HTTPError as exc:
        raise from_transport_error(exc) from exc
    except (ConnectionError, TimeoutError) as exc:
        # Raw socket errors can escape urllib3 while a response body is being read.
        raise ReplyLost(f"reply from the Kubernetes API lost: {exc!r}") from exc
