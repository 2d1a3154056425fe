"""The error tree: statuses by class, Retry-After, and transport failures judged by cause."""

from __future__ import annotations

import email.utils

import pytest

pytest.importorskip("kubernetes")

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from sandbox_client.provisioner import errors


@pytest.mark.parametrize(("status", "cls"), [
    (401, errors.APIUnauthorizedError), (403, errors.APIForbiddenError),
    (404, errors.APINotFoundError), (409, errors.APIConflictError),
    (422, errors.APIClientError), (429, errors.APITooManyRequests),
    (500, errors.APIServerError), (503, errors.APIServerError), (0, errors.ReplyLost)])
def test_api_exceptions_map_by_status(status: int, cls: type[Exception]) -> None:
    with pytest.raises(cls) as caught, errors.translate():
        raise ApiException(status=status, reason="x")
    assert isinstance(caught.value.__cause__, ApiException)


def test_retry_after_seconds_and_http_date() -> None:
    exc = ApiException(status=429, reason="Too Many Requests")
    exc.headers = {"Retry-After": "24"}
    assert errors.from_api_exception(exc).retry_after == 24.0  # type: ignore[attr-defined]
    date = email.utils.formatdate(1_000_030.0, usegmt=True)
    assert errors.parse_retry_after(date, now=1_000_000.0) == pytest.approx(30.0)
    assert errors.parse_retry_after("soon") is None
    assert errors.parse_retry_after(None) is None


def test_transport_errors_are_judged_by_cause() -> None:
    pool = urllib3.HTTPConnectionPool("127.0.0.1", 1)
    refused = urllib3.exceptions.NewConnectionError(pool, "refused")  # type: ignore[arg-type]
    lost = urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError())
    timeout = urllib3.exceptions.ReadTimeoutError(pool, "/", "read timed out")
    cases = [
        (refused, errors.RequestNotSent),
        (urllib3.exceptions.MaxRetryError(pool, "/", refused), errors.RequestNotSent),
        (lost, errors.ReplyLost),
        (urllib3.exceptions.MaxRetryError(pool, "/", lost), errors.ReplyLost),
        (timeout, errors.ReplyLost),
    ]
    for exc, cls in cases:
        with pytest.raises(cls), errors.translate():
            raise exc
    pool.close()
