"""Fuzzing every route of ``/openapi.json`` with schemathesis against a real executor.

Every operation gets valid and invalid inputs (schemathesis's positive and negative modes); the
executor must answer each with something other than a 5xx, and afterwards nothing may be left
behind: no process carrying the executor's owner variable, no working tree, no session.

Generated data is kept on this machine and bounded in time: a ``repo`` that names a remote (git
would reach out to the network for it) is replaced by a local path that does not exist, and
``timeout`` fields are capped. Half the session routes get the id of a real, live session instead
of a random one, so exec, files, reset and finish are fuzzed on a real shell and tree, not only
through their 404s. The default run is small; ``--run-slow`` runs a heavier one.

Inputs it found that once broke the executor are regular tests at the end of this file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from task_executor.config import Settings
from task_executor.demo import DemoTask, make_demo_task
from task_executor.workspaces.mirrors import is_remote
from tests.conftest import (
    FAST_PYTEST_ENV,
    RunningExecutor,
    _searchable_by_the_sandbox,
    start_executor,
)
from tests.executor.test_lifecycle import assert_nothing_left

TOKEN = "fuzz-token"
MAX_TIMEOUT_S = 3.0
DEFAULT_EXAMPLES = 12
SLOW_EXAMPLES = 150


class FuzzTarget:
    """A running executor, its demo repository and one live session kept for the fuzzer."""

    def __init__(self, executor: RunningExecutor, demo: DemoTask) -> None:
        self.executor = executor
        self.demo = demo
        self._session_id: str | None = None
        self.opened: set[str] = set()
        """Every session id the executor handed out (forks included), to close them at the end."""

    def live_session(self) -> str:
        """The id of a live session, starting a new one when the fuzzer closed the last."""
        if self._session_id is not None:
            state = self.executor.get(f"/session/{self._session_id}")
            if state.status_code == 200:
                return self._session_id
        started = self.executor.post(
            "/session/start",
            json={"repo": self.demo.repo, "base_commit": self.demo.base_commit,
                  "env": FAST_PYTEST_ENV},
        )
        assert started.status_code == 200, started.text
        self._session_id = started.json()["session_id"]
        self.opened.add(self._session_id)
        return self._session_id

    def opened_by_fuzzer(self, session_id: str) -> None:
        """Close a session that a fuzzed start or fork opened, keeping capacity for the next."""
        if session_id != self._session_id:
            closed = self.executor.delete(f"/session/{session_id}")
            assert closed.status_code == 200, closed.text

    def close_sessions(self) -> None:
        for session_id in self.opened:
            self.executor.delete(f"/session/{session_id}")
        self.opened.clear()
        self._session_id = None


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzTarget]:
    root = tmp_path_factory.mktemp("fuzz")
    _searchable_by_the_sandbox(root)  # else the executor refuses to start (fail closed)
    settings_ = Settings(
        base_dir=root / "executor", threads=8, token=TOKEN, task_timeout=10,
        command_timeout=MAX_TIMEOUT_S, max_sessions=8,
    )
    executor, stop = start_executor(settings_)
    target = FuzzTarget(executor, make_demo_task(root / "demo-repo"))
    try:
        yield target
        # Nothing may outlive the fuzzing: with its sessions closed, the executor must be back
        # to no tree and no process -- checked while it still runs.
        target.close_sessions()
        assert executor.get("/health").json()["load"]["sessions"] == 0
        assert_nothing_left(settings_.base_dir, os.getpid())  # in-process: our table is its
    finally:
        stop()
    assert_nothing_left(settings_.base_dir, os.getpid())


@pytest.fixture
def api_schema(fuzz_target: FuzzTarget) -> Any:
    return schemathesis.openapi.from_url(
        fuzz_target.executor.url + "/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}
    )


schema = schemathesis.pytest.from_fixture("api_schema")


def _heads(value: str) -> bool:
    """A coin flip decided by ``value``, so hypothesis can replay and shrink what it found."""
    return hashlib.sha256(value.encode()).digest()[0] % 2 == 0


def keep_local_and_bounded(case: Any, target: FuzzTarget) -> None:
    """Rewrite the generated case so it stays on this machine and finishes quickly, and so half
    the cases reach past the repository lookup into checkout, setup, shells and gradings."""
    if isinstance(case.body, dict):
        repo, commit = case.body.get("repo"), case.body.get("base_commit")
        if isinstance(repo, str) and isinstance(commit, str) and _heads(repo + commit):
            case.body["repo"], case.body["base_commit"] = target.demo.repo, target.demo.base_commit
        elif isinstance(repo, str) and is_remote(repo):
            case.body["repo"] = "/nonexistent/fuzzed-remote"
        for field in ("timeout", "command_timeout"):
            value = case.body.get(field)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                case.body[field] = min(value, MAX_TIMEOUT_S)
    params = case.path_parameters or {}
    session_id = params.get("session_id")
    if isinstance(session_id, str) and _heads(session_id):
        params["session_id"] = target.live_session()


def fuzz(case: Any, target: FuzzTarget) -> None:
    keep_local_and_bounded(case, target)
    response = case.call(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    case.validate_response(response, checks=[not_a_server_error])
    if response.status_code == 200:
        try:
            answer = response.json()
        except ValueError:
            return
        if isinstance(answer, dict) and isinstance(answer.get("session_id"), str):
            target.opened_by_fuzzer(answer["session_id"])


@schema.parametrize()
@settings(
    max_examples=DEFAULT_EXAMPLES, deadline=None, database=None, derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_no_route_answers_5xx(case: Any, fuzz_target: FuzzTarget) -> None:
    fuzz(case, fuzz_target)


@pytest.mark.slow
@schema.parametrize()
@settings(
    max_examples=SLOW_EXAMPLES, deadline=None, database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_route_answers_5xx_heavy(case: Any, fuzz_target: FuzzTarget) -> None:
    fuzz(case, fuzz_target)


# -- regressions: inputs the fuzzer found ------------------------------------------------------


def test_405_answers_say_which_methods_are_allowed(executor):
    # Found by schemathesis (ST204): the JSON error renderer dropped werkzeug's Allow header.
    answer = requests.put(executor.url + "/task/submit", timeout=30)
    assert answer.status_code == 405
    assert "POST" in answer.headers["Allow"]
    assert answer.json()["error"]["code"] == "method_not_allowed"
    assert answer.json()["error"]["request_id"] == answer.headers["X-Request-ID"]


# Found by the fuzzer: input the kernel cannot take used to fail deep inside, as a 500 or an
# execution_error; now refused at the protocol boundary.

BAD_ENVS = [{"A\u0000B": "1"}, {"A": "1\u00002"}, {"A=B": "1"}, {"": "1"}]


@pytest.mark.parametrize("env", BAD_ENVS, ids=["nul-in-name", "nul-in-value", "equals", "empty"])
def test_env_the_kernel_cannot_take_is_refused_at_session_start(executor, demo_task, env):
    answer = executor.post(
        "/session/start",
        json={"repo": demo_task.repo, "base_commit": demo_task.base_commit, "env": env},
    )
    assert answer.status_code == 422, answer.text


@pytest.mark.parametrize("env", BAD_ENVS, ids=["nul-in-name", "nul-in-value", "equals", "empty"])
def test_env_the_kernel_cannot_take_is_refused_at_submit(executor, demo_task, env):
    # Before the protocol refused these: 200 with status execution_error ("internal error:
    # embedded null byte"), which reward code takes for an infrastructure fault and retries.
    answer = executor.submit({**demo_task.request("bad-env", demo_task.gold_patch), "env": env})
    assert answer.status_code == 422, answer.text


def test_setup_commands_with_nul_bytes_are_refused(executor, demo_task):
    answer = executor.post(
        "/session/start",
        json={"repo": demo_task.repo, "base_commit": demo_task.base_commit, "setup": ["a\u0000"]},
    )
    assert answer.status_code in (400, 422), answer.text


@pytest.mark.parametrize("path", ["a" * 300, "/".join(["d"] * 3000)], ids=["name", "path"])
@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_overlong_file_paths_are_a_client_error(executor, demo_task, method, path):
    started = executor.post(
        "/session/start", json={"repo": demo_task.repo, "base_commit": demo_task.base_commit}
    )
    session_id = started.json()["session_id"]
    answer = requests.request(
        method, f"{executor.url}/session/{session_id}/file", params={"path": path},
        data=b"x" if method == "PUT" else None, timeout=30,
    )
    executor.delete(f"/session/{session_id}")
    assert answer.status_code == 400, answer.text
