"""exec's per-call modes through the real routes: cwd, env, stateless, stderr apart, and the
structured syntax-error refusal (issue 25)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox_client.protocol import ExecResult
from task_executor.demo import DemoTask
from tests.conftest import RunningExecutor
from tests.executor import session_fixtures
from tests.executor.test_sessions_api import _exec, _start

# The shared fixtures, made visible to pytest in this module.
shared_executor = session_fixtures.shared_executor
task = session_fixtures.task


@pytest.fixture(scope="module")
def kept(shared_executor: RunningExecutor, task: DemoTask) -> Iterator[str]:
    """One session for the module's cases (each leaves the shell as it found it)."""
    sid = _start(shared_executor, task)
    _exec(shared_executor, sid, "export KEPT=yes; cd calc")
    yield sid
    shared_executor.delete(f"/session/{sid}")


def _run(executor: RunningExecutor, sid: str, command: str, **extra: object) -> dict:
    result = _exec(executor, sid, command, **extra)
    ExecResult.model_validate(result)  # the wire answer is the contract's model
    return result


def test_stateless_changes_do_not_persist(shared_executor, kept):
    ran = _run(shared_executor, kept, "cd /; export GONE=1; f() { :; }; set -u; echo $KEPT",
               stateless=True)
    assert ran["exit_code"] == 0 and ran["output"] == "yes\n"
    after = _run(shared_executor, kept, 'echo "$PWD ${GONE-unset} $(type -t f || echo none)"'
                 ' $-')
    assert after["output"].split()[:3] == [after["output"].split()[0], "unset", "none"]
    assert after["output"].split()[0].endswith("/calc")
    assert "u" not in after["output"].split()[3]


def test_cwd_relative_absolute_and_missing(shared_executor, kept):
    relative = _run(shared_executor, kept, "pwd", cwd="tests")
    assert relative["output"].rstrip().endswith("/tests")
    assert _run(shared_executor, kept, "pwd", cwd="/tmp")["output"] == "/tmp\n"
    missing = _run(shared_executor, kept, "echo ran", cwd="no/such/dir")
    assert missing["exit_code"] == 1
    assert "no/such/dir" in missing["output"] and "ran" not in missing["output"]
    # The session's own shell never moved.
    assert _run(shared_executor, kept, "pwd")["output"].rstrip().endswith("/calc")


def test_env_is_for_this_call_only(shared_executor, kept):
    value = "two words 'quoted' $HOME"
    ran = _run(shared_executor, kept, 'printf "%s|%s" "$ONE" "$KEPT"',
               env={"ONE": value})
    assert ran["output"] == f"{value}|yes"
    assert _run(shared_executor, kept, 'echo "${ONE-unset}"')["output"] == "unset\n"


def test_exit_in_a_stateless_call_keeps_the_shell(shared_executor, kept):
    ran = _run(shared_executor, kept, "exit 7", stateless=True)
    assert ran["exit_code"] == 7 and ran["error"] is None
    assert _run(shared_executor, kept, "echo $KEPT")["output"] == "yes\n"


def test_bad_env_and_cwd_are_refused(shared_executor, kept):
    for body in ({"env": {"1BAD": "x"}}, {"cwd": ""}, {"env": {"A": "nul\u0000"}},
                 {"stderr": "both"}, {"shell": "no/slash"}):
        answer = shared_executor.post(f"/session/{kept}/exec",
                                      json={"command": "true", **body})
        assert answer.status_code == 422, (body, answer.text)
        assert answer.json()["error"]["code"] == "validation_error"


@pytest.mark.parametrize("stateless", [False, True])
def test_stderr_separate(shared_executor, kept, stateless):
    ran = _run(shared_executor, kept,
               "echo out; echo err >&2; printf '%.0sx' {1..100000} >&2; echo tail >&2",
               stderr="separate", stateless=stateless)
    assert ran["output"] == "out\n" and ran["output_bytes"] == 4
    assert ran["stderr"].startswith("err\nxxx") and ran["stderr"].endswith("tail\n")
    assert ran["stderr_bytes"] == 4 + 100000 + 5
    assert len(ran["stderr"]) < 100000  # head and tail kept, the middle dropped
    merged = _run(shared_executor, kept, "echo out; echo err >&2")
    assert merged["output"] == "out\nerr\n"
    assert merged["stderr"] is None and merged["stderr_bytes"] == 0


@pytest.mark.parametrize("extra", [{}, {"stateless": True}, {"cwd": "/tmp"}])
def test_syntax_error_is_structured(shared_executor, kept, extra):
    ran = _run(shared_executor, kept, "echo ok\nif true; then echo 'open", **extra)
    assert ran["not_run"] == "syntax_error" and ran["exit_code"] == 2
    assert ran["syntax_error"].startswith("bash: line 2: ")
    assert "dockyard: not run" not in ran["syntax_error"]
    assert "dockyard: not run" in ran["output"]  # the text marker older clients read
    ok = _run(shared_executor, kept, "echo fine", **extra)
    assert ok["not_run"] is None and ok["syntax_error"] is None
