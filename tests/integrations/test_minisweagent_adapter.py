"""DockyardEnvironment's own promises, beyond mini-swe-agent's suite (tests/frameworks): the
token never reaches a trajectory, a lost executor is an error and not an observation, commands
are stateless, forward_env, the session it started is closed by cleanup."""

from __future__ import annotations

import os

import pytest

from sandbox_client import SandboxClient
from sandbox_client.errors import ExecutorRejected
from task_executor.demo import DemoTask

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
pytest.importorskip("minisweagent")

from sandbox_client.integrations.minisweagent import DockyardEnvironment  # noqa: E402


def make(demo_task: DemoTask, client: SandboxClient, **kwargs: object) -> DockyardEnvironment:
    return DockyardEnvironment(client=client, task={"repo": demo_task.repo,
                                                    "base_commit": demo_task.base_commit},
                               **kwargs)


def test_the_token_never_reaches_a_trajectory(demo_task: DemoTask, client: SandboxClient) -> None:
    env = make(demo_task, client, token="s3cret-token")
    try:
        assert "s3cret-token" not in repr(env.serialize())
        assert "s3cret-token" not in repr(env.get_template_vars())
        assert env.get_template_vars()["workdir"] == env.session.workdir
    finally:
        env.cleanup()


def test_commands_are_stateless_and_forward_env_is_explicit(
    demo_task: DemoTask, client: SandboxClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORWARDED", "from-host")
    monkeypatch.setenv("NOT_FORWARDED", "secret")
    env = make(demo_task, client, forward_env=["FORWARDED"])
    try:
        env.execute({"command": "cd /; export Y=1"})
        out = env.execute({"command": 'pwd; echo "[$Y][$FORWARDED][$NOT_FORWARDED]"'})
        assert out == {"output": f"{env.session.workdir}\n[][from-host][]\n", "returncode": 0,
                       "exception_info": ""}
    finally:
        env.cleanup()


def test_a_lost_session_raises_instead_of_feeding_the_model(
    demo_task: DemoTask, client: SandboxClient
) -> None:
    env = make(demo_task, client)
    env.cleanup()  # the session is gone on the executor
    with pytest.raises(ExecutorRejected) as lost:
        env.execute({"command": "echo hi"})
    assert lost.value.status == 404
    assert env.session.closed
