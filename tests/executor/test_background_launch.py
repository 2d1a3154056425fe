"""Shells launched after the start answered (``session_launch`` background, issue 24): through a
real executor with real bubblewrap sandboxes and bash; the runner on its own for the fds and the
failures; the warm-up queue with a clock of its own."""

from __future__ import annotations

import os
import threading

import pytest

from task_executor.demo import FIXED_FILES
from task_executor.sandbox.namespaces import Launcher
from task_executor.sessions import manager as manager_module
from task_executor.sessions.runner import ShellSession, ShellStartError
from task_executor.sessions.warmup import Warmup
from tests.executor.test_idle import _fds, _launch_namespaces_held, _state, _stopped
from tests.executor.test_lifecycle import owned_processes
from tests.executor.test_sessions_api import _exec, _finish, _start
from tests.processes import wait_until


@pytest.fixture
def no_warmup(monkeypatch):
    """Keep the warm-up thread from launching anything: what the start alone did is seen, and
    every shell is started by its session's first call."""
    monkeypatch.setattr(manager_module.Warmup, "submit", lambda self, shell: None)


def test_the_start_answers_without_a_shell_and_the_first_call_starts_it(
        executor_factory, demo_task, no_warmup):
    executor = executor_factory(session_launch="background")
    base = executor.settings.base_dir
    namespaces = _launch_namespaces_held()
    sid = _start(executor, demo_task)
    # Nothing runs for it yet, and it holds no fd: no shell, no launch namespace.
    assert owned_processes(base) == []
    assert _launch_namespaces_held() == namespaces
    state = _state(executor, sid)
    assert state["stopped"] is True and state["alive"] is True and state["commands_run"] == 0
    result = _exec(executor, sid, 'echo "$PWD" && cat calc/__init__.py')
    assert result["exit_code"] == 0, result
    assert result["output"].startswith(executor.settings.fixed_path + "\n")
    assert "def add" in result["output"]
    assert owned_processes(base) != []
    assert _stopped(executor, sid) is False
    # From then on it is an ordinary shell: its state carries over between calls.
    _exec(executor, sid, "cd calc && KEPT=yes")
    assert _exec(executor, sid, 'echo "${PWD##*/} $KEPT"')["output"] == "calc yes\n"


def test_the_warmup_starts_the_shell_with_no_call(executor_factory, demo_task):
    executor = executor_factory(session_launch="background")
    base = executor.settings.base_dir
    sid = _start(executor, demo_task)
    wait_until(lambda: not _stopped(executor, sid))
    assert owned_processes(base) != []
    assert _state(executor, sid)["commands_run"] == 0
    assert _exec(executor, sid, "echo ready")["output"] == "ready\n"


def test_a_shell_started_late_by_the_warmup_is_still_stopped_when_idle(
        executor_factory, demo_task, monkeypatch):
    """Idle sweeps skip settled sessions (all stopped); one whose shell has yet to start is
    not settled, or a warm-up launch after those sweeps would leave its shell running for
    good. The launch here comes a second after the start: several sweeps later."""
    def late(self, shell):
        threading.Timer(1.0, shell.launch_parked).start()

    monkeypatch.setattr(manager_module.Warmup, "submit", late)
    executor = executor_factory(session_launch="background", session_idle_stop=0.3)
    base = executor.settings.base_dir
    sid = _start(executor, demo_task)
    wait_until(lambda: owned_processes(base) != [])  # launched, with no call
    wait_until(lambda: owned_processes(base) == [])  # and stopped, idle
    assert _stopped(executor, sid) is True
    assert _exec(executor, sid, "echo back")["output"] == "back\n"


def test_a_session_whose_shell_never_started_forks_finishes_and_leaves_nothing(
        executor_factory, demo_task, no_warmup):
    executor = executor_factory(session_launch="background")
    base = executor.settings.base_dir
    sid = _start(executor, demo_task)
    for path, content in FIXED_FILES.items():  # the gold fix, through the file API alone
        written = executor.put(f"/session/{sid}/file", params={"path": path}, data=content)
        assert written.status_code == 200, written.text
    forked = executor.post(f"/session/{sid}/fork", json={})
    assert forked.status_code == 200, forked.text
    child = forked.json()["session_id"]
    assert _stopped(executor, child) is True
    assert "return a + b" in _exec(executor, child, "cat calc/__init__.py")["output"]
    # The source never ran a shell: it is graded all the same, on what its tree holds (and
    # finishing ends it).
    assert _finish(executor, sid, demo_task)["result"]["status"] == "resolved"
    assert executor.get(f"/session/{sid}").status_code == 404
    assert executor.delete(f"/session/{child}").status_code == 200
    assert owned_processes(base) == []
    assert executor.work_dirs() == []


def test_a_runner_started_parked_holds_no_fd_until_its_first_command(tmp_path):
    before = _fds()
    shell = ShellSession(cwd=str(tmp_path), env={"PATH": os.environ["PATH"]}, launch=False)
    try:
        assert shell.parked and shell.pid is None
        assert _fds() - before == set()
        result = shell.run('echo "$PWD" && X=1')
        assert result.exit_code == 0 and result.output == f"{tmp_path}\n"
        assert not shell.parked and shell.pid is not None
        assert shell.launch_parked() is False  # started already: nothing for the warm-up
        assert shell.run("echo $X").output == "1\n"
    finally:
        shell.close()
    assert _fds() - before == set()


def test_a_parked_fork_starts_from_the_state_and_directory_it_was_given(tmp_path):
    (tmp_path / "sub").mkdir()
    source = ShellSession(cwd=str(tmp_path), env={"PATH": os.environ["PATH"]})
    try:
        source.run("cd sub && export FROM=source && h() { echo h$1; }")
        state = source.saved_state()
    finally:
        source.close()
    shell = ShellSession(cwd=str(tmp_path), env={"PATH": os.environ["PATH"]},
                         restore=(state, str(tmp_path / "sub")), launch=False)
    try:
        assert shell.saved_state() == state and shell.parked
        assert shell.launch_parked() is True and not shell.parked
        assert shell.run('echo "$PWD $FROM" && h 2').output == f"{tmp_path}/sub source\nh2\n"
    finally:
        shell.close()


@pytest.mark.parametrize("launcher", [
    ["/nonexistent/launcher"],  # the launch itself fails (OSError)
    ["sh", "-c", "exit 3", "dockyard-test"],  # launched, but no bash ever answers
], ids=["no-launcher", "no-answer"])
def test_a_failed_launch_leaves_the_runner_parked_and_the_next_call_says_why(
        tmp_path, launcher):
    before = _fds()
    shell = ShellSession(cwd=str(tmp_path), env={"PATH": os.environ["PATH"]},
                         launcher=launcher, launch=False)
    try:
        with pytest.raises((OSError, ShellStartError)):
            shell.launch_parked()
        assert shell.parked and _fds() - before == set()
        result = shell.run("echo never")
        assert result.exit_code is None and "could not be started" in (result.error or "")
        assert shell.parked and _fds() - before == set()
    finally:
        shell.close()
    assert _fds() - before == set()


class _Recorded:
    """What the warm-up asked of one shell (``hold``: an event the launch waits for)."""

    def __init__(self, name: str, log: list[str], fails: bool = False,
                 hold: threading.Event | None = None) -> None:
        self.name, self.log, self.fails, self.hold = name, log, fails, hold

    def launch_parked(self) -> bool:
        self.log.append(self.name)
        if self.hold is not None:
            self.hold.wait()
        if self.fails:
            raise OSError("no room")
        return True


def test_the_warmup_launches_in_order_skips_the_stale_and_survives_a_failure():
    now = [100.0]
    log: list[str] = []
    closed = Warmup(max_wait=5.0, clock=lambda: now[0])
    closed.close()  # a closed warm-up takes nothing
    closed.submit(_Recorded("after-close", log))
    assert log == []

    warmup = Warmup(max_wait=5.0, clock=lambda: now[0])
    release = threading.Event()
    warmup.submit(_Recorded("first", log, hold=release))  # holds the thread ...
    wait_until(lambda: log == ["first"])
    warmup.submit(_Recorded("stale", log))  # ... while this one waits past max_wait
    now[0] += 6.0
    warmup.submit(_Recorded("failing", log, fails=True))
    warmup.submit(_Recorded("fresh", log))
    release.set()
    wait_until(lambda: warmup.launched == 2)
    assert log == ["first", "failing", "fresh"] and warmup.skipped == 1
    warmup.close()


def test_a_shell_being_started_in_the_background_is_alive_to_a_state_call(tmp_path):
    """From the runner's lock taken to the shell's process made, there is no shell: a state
    call then must not say dead (it would tell a trainer to give up on a healthy session)."""
    gate = threading.Event()

    class Gated(Launcher):
        def popen(self, command, **options):
            gate.wait()
            return super().popen(command, **options)

    shell = ShellSession(cwd=str(tmp_path), env={"PATH": os.environ["PATH"]},
                         launcher=Gated(), launch=False)
    try:
        launching = threading.Thread(target=shell.launch_parked)
        launching.start()
        wait_until(lambda: shell._lock.locked())  # the launch holds the runner, no shell yet
        assert shell.pid is None and shell.check_alive() is True
        gate.set()
        launching.join()
        assert shell.check_alive() is True and not shell.parked
        assert shell.run("echo up").output == "up\n"
    finally:
        gate.set()
        shell.close()
