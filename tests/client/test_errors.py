"""Error mapping: every transport, HTTP and protocol failure becomes one TaskExecutorError class,
chosen by cause, raised with the original exception chained."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any

import pydantic
import pytest
import requests
import responses
from urllib3.exceptions import MaxRetryError, NewConnectionError
from urllib3.exceptions import ProtocolError as Urllib3Error

from sandbox_client import (
    ClientConfig,
    ConnectionLost,
    ExecutorBusy,
    ExecutorRejected,
    ExecutorTimeout,
    ExecutorUnreachable,
    InvalidConfig,
    InvalidSpec,
    ProtocolError,
    ReplyLost,
    SandboxClient,
    SpecError,
    TaskExecutorError,
)
from sandbox_client.client import parse_retry_after

from .conftest import RawServer, task_result, task_spec

URL = "http://exec-a:9090"
Make = Callable[..., SandboxClient]


def test_tree_has_one_root() -> None:
    for cls in (
        ExecutorUnreachable,
        ReplyLost,
        ExecutorTimeout,
        ConnectionLost,
        ExecutorRejected,
        ExecutorBusy,
        ProtocolError,
        InvalidConfig,
    ):
        assert issubclass(cls, TaskExecutorError)
    assert issubclass(ExecutorTimeout, ReplyLost) and issubclass(ConnectionLost, ReplyLost)
    assert issubclass(ExecutorBusy, ExecutorRejected)
    # The caller's own bug is outside the tree: no "except TaskExecutorError" takes it for the
    # executors' failure (issue #25).
    assert InvalidSpec is SpecError and issubclass(SpecError, ValueError)
    assert not issubclass(SpecError, TaskExecutorError)


def test_errors_survive_pickling() -> None:
    error = ExecutorBusy("full", code="busy", status=503, retry_after=2.0, url=URL)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.code, copy.status, copy.retry_after, copy.url) == (
        ExecutorBusy,
        "busy",
        503,
        2.0,
        URL,
    )
    assert str(copy) == str(error)


def test_malformed_json_is_protocol_error(
    mocked: responses.RequestsMock, make_client: Make
) -> None:
    mocked.post(f"{URL}/task/submit", body="{not json", status=200)
    with pytest.raises(ProtocolError) as info:
        make_client(URL).run_task(task_spec())
    assert isinstance(info.value.__cause__, pydantic.ValidationError)
    assert info.value.url == URL


def test_invalid_model_is_protocol_error(mocked: responses.RequestsMock, make_client: Make) -> None:
    mocked.post(f"{URL}/task/submit", json={"task_id": "t-1", "status": "maybe"})
    with pytest.raises(ProtocolError, match="status"):
        make_client(URL).run_task(task_spec())


def test_4xx_is_rejected_with_code(mocked: responses.RequestsMock, make_client: Make) -> None:
    error = {"error": {"code": "invalid_request", "message": "base_commit: required"}}
    call = mocked.post(f"{URL}/task/submit", json=error, status=422)
    with pytest.raises(ExecutorRejected) as info:
        make_client(URL).run_task(task_spec())
    assert (info.value.code, info.value.status) == ("invalid_request", 422)
    assert info.value.message == "base_commit: required"
    assert not isinstance(info.value, ExecutorBusy)
    assert call.call_count == 1  # a rejection is final: never retried


def test_401_is_rejected(mocked: responses.RequestsMock, make_client: Make) -> None:
    error = {"error": {"code": "unauthorized", "message": "bad token"}}
    mocked.post(f"{URL}/task/submit", json=error, status=401)
    with pytest.raises(ExecutorRejected, match="unauthorized"):
        make_client(URL, token="wrong").run_task(task_spec())
    assert mocked.calls[0].request.headers["Authorization"] == "Bearer wrong"


def test_non_protocol_error_body(mocked: responses.RequestsMock, make_client: Make) -> None:
    mocked.post(f"{URL}/task/submit", body="<html>Bad Gateway</html>", status=502)
    with pytest.raises(ExecutorRejected) as info:
        make_client(URL).run_task(task_spec())
    assert (info.value.code, info.value.status) == ("http_502", 502)
    assert "Bad Gateway" in info.value.message


def test_refused_connection_is_unreachable(closed_port_url: str, make_client: Make) -> None:
    with pytest.raises(ExecutorUnreachable) as info:
        make_client(closed_port_url).run_task(task_spec())
    # The summary error chains the per-executor one, which chains requests' own.
    assert isinstance(info.value.__cause__, ExecutorUnreachable)
    assert isinstance(info.value.__cause__.__cause__, requests.ConnectionError)


def test_read_timeout_is_executor_timeout(silent_server: RawServer, make_client: Make) -> None:
    config = ClientConfig(urls=(silent_server.url,), timeout_margin=0.2, resubmits=0)
    with pytest.raises(ExecutorTimeout) as info:
        make_client(silent_server.url, config=config).run_task(task_spec(timeout=0.1))
    assert isinstance(info.value.__cause__, requests.ReadTimeout)


def test_hangup_is_connection_lost(hangup_server: RawServer, make_client: Make) -> None:
    config = ClientConfig(urls=(hangup_server.url,), resubmits=0)
    with pytest.raises(ConnectionLost):
        make_client(hangup_server.url, config=config).run_task(task_spec())


def test_decided_by_cause_not_class(mocked: responses.RequestsMock, make_client: Make) -> None:
    """A requests.ConnectionError is 'unreachable' only when a failed connect caused it."""
    refused = requests.ConnectionError(
        MaxRetryError(None, URL, NewConnectionError(None, "Connection refused"))
    )
    aborted = requests.ConnectionError(Urllib3Error("Connection aborted.", ConnectionResetError()))
    mocked.post(f"{URL}/task/submit", body=refused)
    with pytest.raises(ExecutorUnreachable):
        make_client(URL).run_task(task_spec())
    mocked.replace(responses.POST, f"{URL}/task/submit", body=aborted)
    config = ClientConfig(urls=(URL,), resubmits=0)
    with pytest.raises(ConnectionLost):
        make_client(URL, config=config).run_task(task_spec())


def test_busy_carries_retry_after(mocked: responses.RequestsMock, make_client: Make) -> None:
    error = {"error": {"code": "busy", "message": "all workers taken"}}
    mocked.post(f"{URL}/task/submit", json=error, status=503, headers={"Retry-After": "7"})
    config = ClientConfig(urls=(URL,), busy_retries=0)
    with pytest.raises(ExecutorBusy) as info:
        make_client(URL, config=config).run_task(task_spec())
    assert (info.value.status, info.value.code, info.value.retry_after) == (503, "busy", 7.0)


def test_retry_after_forms() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("-1") == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    later = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    assert 25 <= (parse_retry_after(later) or 0) <= 31


def test_ok_result_decodes(mocked: responses.RequestsMock, make_client: Make) -> None:
    mocked.post(f"{URL}/task/submit", json=task_result(duration_s=1.5))
    result = make_client(URL).run_task(task_spec())
    assert (result.status, result.resolved, result.duration_s) == ("resolved", True, 1.5)


def test_the_seed_names_import_from_the_package() -> None:
    import sandbox_client
    from sandbox_client import protocol

    for name in ("TaskSpec", "TaskResult", "SessionStartSpec", "ExecResult", "FinishResult",
                 "FinishSpec", "SessionState", "SnapshotInfo", "HealthResponse"):
        assert getattr(sandbox_client, name) is getattr(protocol, name)
        assert name in sandbox_client.__all__
    for name in ("TaskExecutorError", "InvalidConfig"):
        assert issubclass(getattr(sandbox_client, name), TaskExecutorError)
    assert "SpecError" in sandbox_client.__all__ and sandbox_client.InvalidSpec is SpecError


@pytest.mark.parametrize(
    ("call", "model", "field"),
    [
        (lambda c, s: c.run_task({"task_id": "t", "repo": "/r"}), "TaskSpec", "base_commit"),
        (lambda c, s: c.run_task(task_spec(FAIL_TO_PASS="[not json")), "TaskSpec",
         "FAIL_TO_PASS"),
        (lambda c, s: c.run_task(task_spec(tpyo=1)), "TaskSpec", "tpyo"),
        (lambda c, s: c.start_session({"repo": "/r", "base_commit": "abc", "env": {"1x": "v"}}),
         "SessionStartSpec", "env"),
        (lambda c, s: s.exec("echo \0"), "ExecRequest", "command"),
        (lambda c, s: s.exec("true", timeout=-1), "ExecRequest", "timeout"),
        (lambda c, s: s.finish(fail_to_pass=7), "FinishSpec", "fail_to_pass"),
        (lambda c, s: s.snapshot(".."), "SnapshotRequest", "name"),
        (lambda c, s: s.snapshot("a/b"), "SnapshotRequest", "name"),
    ],
)
def test_a_spec_the_client_refuses_is_invalid_spec_naming_the_field(
    mocked: responses.RequestsMock, make_client: Make, call: Any, model: str, field: str
) -> None:
    """A ValueError (as pydantic's was), outside the executors' tree; nothing sent."""
    start = mocked.post(f"{URL}/session/start",
                        json={"session_id": "s", "workdir": "/testbed", "base_commit": "abc"})
    client = make_client(URL)
    session = client.start_session({"repo": "/r", "base_commit": "abc"})
    with pytest.raises(InvalidSpec) as info:
        call(client, session)
    assert not isinstance(info.value, TaskExecutorError) and isinstance(info.value, ValueError)
    assert (info.value.model, info.value.field, info.value.code) == (model, field, "invalid_spec")
    assert str(info.value).startswith(f"invalid {model}: {field}")
    assert isinstance(info.value.__cause__, pydantic.ValidationError)
    assert len(mocked.calls) == start.call_count == 1  # only the session's own start


def test_an_unusable_configuration_is_invalid_config() -> None:
    for bad in ({"urls": "ftp://x"}, {"urls": []}, {"urls": "http://a:1", "routing": "random"},
                {"urls": "http://a:1", "timeout": "soon"}, {"urls": "http://a:1", "timeout": (1,)},
                {"urls": "http://a:1", "config": {"env": {"code": {"task_timeout": "x"}}}}):
        with pytest.raises(InvalidConfig) as info:
            SandboxClient(**bad)
        assert isinstance(info.value, ValueError) and info.value.code == "invalid_config"
