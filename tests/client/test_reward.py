"""Reward mapping and the never-raising run_task_safe."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import responses

import sandbox_client
from sandbox_client import SandboxClient, reward_from_result, run_task_safe
from sandbox_client.protocol import TaskResult

from .conftest import task_result, task_spec

Make = Callable[..., SandboxClient]


@pytest.mark.parametrize(
    ("status", "reward"),
    [
        ("resolved", 1.0),
        ("unresolved", 0.0),
        ("timeout", 0.0),
        ("patch_apply_failed", 0.0),
        ("execution_error", None),
    ],
)
def test_reward_mapping(status: str, reward: float | None) -> None:
    assert reward_from_result(TaskResult.model_validate(task_result(status=status))) == reward


def test_safe_run_turns_unreachable_into_execution_error(
    closed_port_url: str, make_client: Make
) -> None:
    result = run_task_safe(task_spec("t-7"), client=make_client(closed_port_url))
    assert (result.task_id, result.status, result.resolved) == ("t-7", "execution_error", None)
    assert result.error_code == "executor_unreachable"
    assert "could not connect" in (result.error or "")
    assert reward_from_result(result) is None


def test_safe_run_turns_rejection_into_execution_error(
    mocked: responses.RequestsMock, make_client: Make
) -> None:
    error = {"error": {"code": "invalid_request", "message": "nope"}}
    mocked.post("http://a:1/task/submit", json=error, status=422)
    result = run_task_safe(task_spec(), client=make_client("http://a:1"))
    assert (result.status, result.error_code) == ("execution_error", "invalid_request")


def test_safe_run_survives_a_bad_spec(make_client: Make) -> None:
    result = run_task_safe({"instance_id": "x"}, client=make_client("http://a:1"))
    assert (result.task_id, result.status, result.error_code) == (
        "x", "execution_error", "invalid_spec")
    assert "invalid TaskSpec: repo: Field required" in (result.error or "")


def test_module_functions_use_the_configured_default(
    mocked: responses.RequestsMock,
) -> None:
    mocked.post("http://cfg:1/task/submit", json=task_result())
    client = sandbox_client.configure(config={"env": {"code": {"sandbox_urls": ["http://cfg:1"]}}})
    try:
        assert sandbox_client.default_client() is client
        assert sandbox_client.run_task(task_spec()).status == "resolved"
        assert run_task_safe(task_spec()).status == "resolved"
    finally:
        sandbox_client.configure()
