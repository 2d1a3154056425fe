"""Interrupt and named shells through the real routes (issue 25): a running command stopped
while the shell and its state survive; several shells with their own state in one session."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from task_executor.sessions.manager import MAX_SHELLS
from tests.conftest import RunningExecutor
from tests.executor import session_fixtures
from tests.executor.test_sessions_api import _exec, _start
from tests.processes import wait_until

# The shared fixtures, made visible to pytest in this module.
session = session_fixtures.session
shared_executor = session_fixtures.shared_executor
task = session_fixtures.task


def _exec_in_background(executor: RunningExecutor, sid: str, body: dict) -> tuple[
        threading.Thread, list[dict]]:
    answers: list[dict] = []

    def run() -> None:
        answer = executor.post(f"/session/{sid}/exec", json=body)
        answers.append({"status": answer.status_code, **answer.json()})

    thread = threading.Thread(target=run)
    thread.start()
    return thread, answers


def _interrupt_when_running(executor: RunningExecutor, sid: str, pattern: str,
                            shell: str = "default") -> dict:
    """Interrupt once the command's process shows in the sandbox (seen from the host)."""
    wait_until(lambda: _running(pattern), timeout=30)
    answer = executor.post(f"/session/{sid}/interrupt", json={"shell": shell})
    assert answer.status_code == 200, answer.text
    return answer.json()


def _running(pattern: str) -> bool:
    import subprocess
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0


@pytest.mark.parametrize("stateless", [False, True])
def test_interrupt_stops_the_command_and_keeps_the_shell(shared_executor, session, stateless):
    _exec(shared_executor, session, "export VAR=kept; cd calc")
    marker = f"sleep 1000{int(stateless)}1"
    thread, answers = _exec_in_background(
        shared_executor, session, {"command": marker, "stateless": stateless})
    assert _interrupt_when_running(shared_executor, session, marker) == {"interrupted": True}
    thread.join(30)
    assert answers[0]["status"] == 200
    assert answers[0]["interrupted"] is True and answers[0]["exit_code"] == 130
    assert answers[0]["error"] is None  # the shell itself never died
    after = _exec(shared_executor, session, 'echo "$VAR ${PWD##*/}"')
    assert after["output"] == "kept calc\n" and after["interrupted"] is False
    assert not _running(marker)


@pytest.fixture
def started_ignoring_sigint():
    """This process ignores SIGINT and SIGQUIT, as one started ``&`` by a script does."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal dispositions are set from the main thread only")
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGQUIT)}
    for sig in before:
        signal.signal(sig, signal.SIG_IGN)
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def test_an_executor_started_ignoring_sigint_still_interrupts(
        started_ignoring_sigint, executor_factory, demo_task):
    """Ignored signals pass to every command (bwrap, sh and bash keep an ignore they started
    with): the interrupt's SIGINT did nothing and the command was SIGKILLed (137)."""
    executor = executor_factory()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    sid = _start(executor, demo_task)
    ignored = int(_exec(executor, sid, "sed -n 's/^SigIgn:\\s*//p' /proc/self/status")["output"],
                  16)
    assert ignored & (1 << (signal.SIGINT - 1) | 1 << (signal.SIGQUIT - 1)) == 0
    marker = "sleep 1000333"
    thread, answers = _exec_in_background(executor, sid, {"command": marker})
    assert _interrupt_when_running(executor, sid, marker) == {"interrupted": True}
    thread.join(30)
    assert answers[0]["interrupted"] is True and answers[0]["exit_code"] == 130


def test_a_command_ignoring_sigint_is_killed_after_the_grace(shared_executor, session):
    _exec(shared_executor, session, "export VAR=kept")
    marker = "sleep 1000222"
    thread, answers = _exec_in_background(shared_executor, session, {
        "command": f"bash -c 'trap \"\" INT; {marker}; echo survived'"})
    assert _interrupt_when_running(shared_executor, session, marker)["interrupted"] is True
    thread.join(30)
    assert answers[0]["interrupted"] is True
    assert "survived" not in answers[0]["output"].splitlines()
    assert answers[0]["exit_code"] not in (0, None)
    assert not _running(marker)
    assert _exec(shared_executor, session, "echo $VAR")["output"] == "kept\n"


def test_a_loop_in_the_shell_itself_is_stopped_and_state_restored(shared_executor, session):
    _exec(shared_executor, session, "export VAR=kept; cd tests")
    thread, answers = _exec_in_background(
        shared_executor, session, {"command": "while :; do :; done"})
    time.sleep(0.3)  # no process to wait for: the loop runs in the shell itself
    assert shared_executor.post(f"/session/{session}/interrupt", json={}).json() == {
        "interrupted": True}
    thread.join(30)
    assert answers[0]["interrupted"] is True
    assert _exec(shared_executor, session, 'echo "$VAR ${PWD##*/}"')["output"] == "kept tests\n"


def test_interrupt_with_nothing_running_and_unknown_targets(shared_executor, session):
    answer = shared_executor.post(f"/session/{session}/interrupt", json={"shell": "default"})
    assert answer.json() == {"interrupted": False}
    unknown_shell = shared_executor.post(f"/session/{session}/interrupt", json={"shell": "nope"})
    assert unknown_shell.status_code == 404
    assert unknown_shell.json()["error"]["code"] == "shell_not_found"
    unknown = shared_executor.post("/session/0123/interrupt", json={})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "session_not_found"


def test_named_shells_keep_their_own_state(shared_executor, session):
    _exec(shared_executor, session, "cd calc; X=default")
    started = _exec(shared_executor, session, 'echo "${PWD##*/} ${X-unset}"; cd tests; X=two',
                    shell="two")
    assert started["output"] == "repo unset\n" or started["output"].endswith(" unset\n")
    assert _exec(shared_executor, session, 'echo "${PWD##*/} $X"')["output"] == "calc default\n"
    assert _exec(shared_executor, session, 'echo "${PWD##*/} $X"',
                 shell="two")["output"] == "tests two\n"
    state = shared_executor.get(f"/session/{session}").json()
    assert state["shells"] == ["default", "two"]
    closed = shared_executor.delete(f"/session/{session}/shell/two")
    assert closed.status_code == 200 and closed.json()["closed"] is True
    assert shared_executor.get(f"/session/{session}").json()["shells"] == ["default"]
    fresh = _exec(shared_executor, session, 'echo "${X-unset}"', shell="two")
    assert fresh["output"] == "unset\n"


def test_shell_limits_and_refusals(shared_executor, session):
    for n in range(1, MAX_SHELLS):
        _exec(shared_executor, session, "true", shell=f"s{n}")
    over = shared_executor.post(f"/session/{session}/exec",
                                json={"command": "true", "shell": "one-too-many"})
    assert over.status_code == 409 and over.json()["error"]["code"] == "too_many_shells"
    default = shared_executor.delete(f"/session/{session}/shell/default")
    assert default.status_code == 409
    assert default.json()["error"]["code"] == "cannot_close_default_shell"
    missing = shared_executor.delete(f"/session/{session}/shell/missing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "shell_not_found"
    assert shared_executor.delete(f"/session/{session}/shell/s1").status_code == 200
    assert _exec(shared_executor, session, "echo ok", shell="one-too-many")["output"] == "ok\n"


def test_closing_the_session_ends_every_shell(shared_executor, session):
    marker = "sleep 1000333"
    _exec(shared_executor, session, f"{marker} &", shell="bg")
    wait_until(lambda: _running(marker), timeout=30)
    assert shared_executor.delete(f"/session/{session}").status_code == 200
    wait_until(lambda: not _running(marker), timeout=30)


def test_interrupt_names_its_shell(shared_executor, session):
    _exec(shared_executor, session, "export IN_DEFAULT=1")
    marker = "sleep 1000555"
    thread, answers = _exec_in_background(
        shared_executor, session, {"command": marker, "shell": "worker"})
    assert _interrupt_when_running(shared_executor, session, marker, shell="worker") == {
        "interrupted": True}
    thread.join(30)
    assert answers[0]["interrupted"] is True and answers[0]["exit_code"] == 130
    assert _exec(shared_executor, session, "echo $IN_DEFAULT")["output"] == "1\n"
