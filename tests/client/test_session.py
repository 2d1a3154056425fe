"""RemoteSession: every verb, byte-exact files, finish, and close-on-exit."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import pytest
import requests
import responses

from sandbox_client import ExecutorRejected, ProtocolError, SandboxClient
from sandbox_client.protocol import FinishSpec

from .conftest import body_of, task_result

A = "http://exec-a:9090"
S = f"{A}/session/s-1"
Make = Callable[..., SandboxClient]
START = {"session_id": "s-1", "workdir": "/work/repo", "base_commit": "abc"}
SPEC = {"repo": "/srv/repo", "base_commit": "abc", "command_timeout": 30}


@pytest.fixture
def session_mock(mocked: responses.RequestsMock) -> responses.RequestsMock:
    mocked.post(f"{A}/session/start", json=START)
    return mocked


def test_start_exec_state_finish(session_mock: responses.RequestsMock, make_client: Make) -> None:
    session_mock.post(f"{S}/exec", json={"exit_code": 0, "output": "hi\n", "duration_s": 0.1})
    state = {
        "session_id": "s-1",
        "alive": True,
        "cwd": "/work/repo",
        "age_s": 1,
        "idle_s": 0,
        "commands_run": 1,
    }
    session_mock.get(S, json=state)
    finish = {"patch": "diff --git a/x b/x\n", "result": task_result("s-1")}
    session_mock.post(f"{S}/finish", json=finish)
    deleted = session_mock.delete(S, status=204)

    client = make_client(A)
    with client.start_session(SPEC) as session:
        assert (session.session_id, session.workdir) == ("s-1", "/work/repo")
        result = session.exec("echo hi", timeout=5)
        assert (result.exit_code, result.output) == (0, "hi\n")
        assert session.state().commands_run == 1
        done = session.finish(test_patch="P", FAIL_TO_PASS='["t::a"]')
        assert done.result.status == "resolved" and session.finished
    assert deleted.call_count == 0  # finish closed it server-side

    exec_call, finish_call = session_mock.calls[1], session_mock.calls[3]
    assert body_of(exec_call) == {"command": "echo hi", "timeout": 5}
    assert exec_call.request.req_kwargs["timeout"][1] == 5 + client.config.timeout_margin
    assert body_of(finish_call)["fail_to_pass"] == ["t::a"]


def test_exec_without_timeout_uses_the_session_default(
    session_mock: responses.RequestsMock, make_client: Make
) -> None:
    session_mock.post(f"{S}/exec", json={"exit_code": 0, "output": ""})
    client = make_client(A)
    client.start_session(SPEC).exec("true")
    assert session_mock.calls[1].request.req_kwargs["timeout"][1] == (
        30 + client.config.timeout_margin
    )


def test_with_closes_unfinished_session(
    session_mock: responses.RequestsMock, make_client: Make
) -> None:
    deleted = session_mock.delete(S, status=204)
    with pytest.raises(RuntimeError), make_client(A).start_session(SPEC):
        raise RuntimeError("agent crashed")
    assert deleted.call_count == 1


def test_close_is_idempotent_and_tolerates_404(
    session_mock: responses.RequestsMock, make_client: Make
) -> None:
    gone = {"error": {"code": "session_not_found", "message": "no such session"}}
    deleted = session_mock.delete(S, json=gone, status=404)
    session = make_client(A).start_session(SPEC)
    session.close()
    session.close()
    assert session.closed and deleted.call_count == 1


def test_files_round_trip_bytes_exactly(
    session_mock: responses.RequestsMock, make_client: Make
) -> None:
    data = b"\xef\xbb\xbfline\r\n\xff\xfe not utf-8\n"
    digest = hashlib.sha256(data).hexdigest()
    stored: dict[str, bytes] = {}

    def put(request: requests.PreparedRequest) -> tuple[int, dict[str, str], str]:
        body = request.body if isinstance(request.body, bytes) else b""
        stored["x"] = body
        answer = {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
        return 200, {}, json.dumps(answer)

    session_mock.add_callback(responses.PUT, f"{S}/file", callback=put)
    headers = {"X-File-Size": str(len(data)), "X-File-SHA256": digest}
    session_mock.get(f"{S}/file", body=data, headers=headers)
    session = make_client(A).start_session(SPEC)
    assert session.write_file("a b/ü.txt", data).sha256 == digest
    assert stored["x"] == data
    assert session.read_file("a b/ü.txt") == data
    assert "path=a+b%2F%C3%BC.txt" in session_mock.calls[-1].request.url


def test_read_file_digest_mismatch_is_protocol_error(
    session_mock: responses.RequestsMock, make_client: Make
) -> None:
    headers = {"X-File-SHA256": hashlib.sha256(b"other").hexdigest()}
    session_mock.get(f"{S}/file", body=b"data", headers=headers)
    with pytest.raises(ProtocolError, match="SHA256"):
        make_client(A).start_session(SPEC).read_file("x")


def test_write_file_digest_mismatch_is_protocol_error(
    session_mock: responses.RequestsMock, make_client: Make
) -> None:
    session_mock.put(f"{S}/file", json={"size": 3, "sha256": "0" * 64})
    with pytest.raises(ProtocolError, match="stored"):
        make_client(A).start_session(SPEC).write_file("x", b"abc")


def test_unknown_session_is_rejected(
    session_mock: responses.RequestsMock, make_client: Make
) -> None:
    gone = {"error": {"code": "session_not_found", "message": "no such session"}}
    session_mock.post(f"{S}/reset", json=gone, status=404)
    with pytest.raises(ExecutorRejected) as info:
        make_client(A).start_session(SPEC).reset()
    assert (info.value.code, info.value.status) == ("session_not_found", 404)


def test_finish_accepts_a_spec_and_applies_the_task_timeout(
    session_mock: responses.RequestsMock, make_client: Make
) -> None:
    session_mock.post(f"{S}/finish", json={"patch": "", "result": task_result("s-1")})
    client = make_client(A, task_timeout=77)
    client.start_session(SPEC).finish(FinishSpec(test_patch="P"))
    assert body_of(session_mock.calls[1])["timeout"] == 77
