"""Idle shells saved and stopped (issue 24, part 4): through a real executor with a short
``session_idle_stop``, real bubblewrap sandboxes and real bash; and one runner on its own, for
the fds it gives back."""

from __future__ import annotations

import os
import signal

import pytest
import requests

from task_executor.sessions.runner import ShellSession
from tests.executor.test_density import Http
from tests.executor.test_lifecycle import owned_processes, serving
from tests.executor.test_sessions_api import _exec, _finish, _start
from tests.processes import wait_until

IDLE_STOP_S = 0.3


def _state(executor, sid: str) -> dict:
    answer = executor.get(f"/session/{sid}")
    assert answer.status_code == 200, answer.text
    return answer.json()


def _stopped(executor, sid: str) -> bool:
    return bool(_state(executor, sid)["stopped"])


def test_a_stopped_shell_restarts_with_its_cwd_variables_and_functions(
        executor_factory, demo_task):
    executor = executor_factory(session_idle_stop=IDLE_STOP_S)
    base = executor.settings.base_dir
    sid = _start(executor, demo_task)
    _exec(executor, sid, "cd calc && export GREETING=hi && COUNT=3 && f() { echo fn$1; }")
    assert owned_processes(base) != []
    wait_until(lambda: _stopped(executor, sid))
    state = _state(executor, sid)
    assert state["alive"] is True and state["cwd"].endswith("/calc")
    assert owned_processes(base) == []  # the shell and its sandbox are gone; the tree is not
    result = _exec(executor, sid, 'echo "$PWD $GREETING $COUNT" && f 7 && cat __init__.py')
    assert result["exit_code"] == 0, result
    assert "/calc hi 3\nfn7\n" in result["output"]
    assert "def add" in result["output"]
    state = _state(executor, sid)
    assert state["stopped"] is False and state["commands_run"] == 2
    # And again: stopped a second time, restored a second time, state carried on.
    _exec(executor, sid, "COUNT=$((COUNT + 1))")
    wait_until(lambda: _stopped(executor, sid))
    assert _exec(executor, sid, "echo $COUNT")["output"] == "4\n"


@pytest.mark.parametrize("left_running", [
    "sleep 600 >/dev/null 2>&1 &",
    # Double-forked and in a session of its own: adopted by the sandbox's init, not bash's.
    "(setsid sleep 600 >/dev/null 2>&1 &) ; true",
], ids=["background-job", "orphan"])
def test_a_session_with_a_background_process_is_never_stopped(
        executor_factory, demo_task, left_running):
    executor = executor_factory(session_idle_stop=IDLE_STOP_S)
    busy = _start(executor, demo_task)
    quiet = _start(executor, demo_task)
    _exec(executor, busy, left_running)
    _exec(executor, quiet, "true")
    # The quiet one is stopped by the same sweeps that leave the busy one alone.
    wait_until(lambda: _stopped(executor, quiet))
    for _ in range(3):
        assert executor.get("/health").status_code == 200
        assert _stopped(executor, busy) is False
    alive = _exec(executor, busy, "grep -lx sleep /proc/[0-9]*/comm >/dev/null && echo running")
    assert alive["output"] == "running\n"


def test_delete_of_a_stopped_session_leaves_nothing(executor_factory, demo_task):
    executor = executor_factory(session_idle_stop=IDLE_STOP_S)
    base = executor.settings.base_dir
    sid = _start(executor, demo_task)
    _exec(executor, sid, "echo data > new_file")
    wait_until(lambda: _stopped(executor, sid))
    assert executor.delete(f"/session/{sid}").status_code == 200
    assert executor.get(f"/session/{sid}").status_code == 404
    assert executor.work_dirs() == []
    assert owned_processes(base) == []


def _fds() -> set[str]:
    return {f"{fd} {os.readlink(f'/proc/self/fd/{fd}')}" for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}


def test_a_parked_runner_holds_no_fd_and_restores_on_its_next_command(tmp_path):
    before = _fds()
    shell = ShellSession(cwd=str(tmp_path), env={"PATH": os.environ["PATH"]})
    try:
        shell.run("mkdir sub && cd sub && X=kept && g() { echo g$1; }")
        held = _fds() - before
        assert len(held) >= 6 and any("dockyard-state" in fd for fd in held)
        assert shell.park() is True and shell.parked
        assert _fds() - before == set()
        assert shell.cwd() == str(tmp_path / "sub")
        result = shell.run('echo "$PWD $X" && g 1')
        assert result.output == f"{tmp_path}/sub kept\ng1\n" and result.exit_code == 0
        assert not shell.parked
    finally:
        shell.close()
    assert _fds() - before == set()


def test_a_runner_with_a_background_job_is_not_parked(tmp_path):
    shell = ShellSession(cwd=str(tmp_path), env={"PATH": os.environ["PATH"]})
    try:
        shell.run("sleep 600 >/dev/null 2>&1 &")
        assert shell.park() is False and not shell.parked
        assert shell.run("jobs | wc -l").output == "1\n"
        shell.run("kill %1; wait")
        assert shell.park() is True
    finally:
        shell.close()


def test_a_stopped_session_finishes_and_forks_from_its_saved_state(executor_factory, demo_task):
    executor = executor_factory(session_idle_stop=IDLE_STOP_S)
    sid = _start(executor, demo_task)
    _exec(executor, sid, "sed -i 's/return a - b/return a + b/' calc/__init__.py && cd calc "
                         "&& MARK=forked")
    wait_until(lambda: _stopped(executor, sid))
    forked = executor.post(f"/session/{sid}/fork", json={})
    assert forked.status_code == 200, forked.text
    child = forked.json()["session_id"]
    assert _exec(executor, child, 'echo "$MARK ${PWD##*/}"')["output"] == "forked calc\n"
    assert _stopped(executor, sid) is True  # a fork reads the saved state; the source stays
    assert _finish(executor, sid, demo_task)["result"]["status"] == "resolved"


@pytest.mark.slow  # a thousand sandboxed sessions: minutes on a 2-CPU machine
def test_a_thousand_idle_sessions_hold_no_process_and_restore_on_demand(tmp_path, demo_task):
    sessions = 1000
    with serving(tmp_path / "base", DOCKYARD_MAX_SESSIONS=str(sessions + 10),
                 DOCKYARD_SESSION_IDLE_STOP="2") as server:
        http = Http(server.url)
        ids = [_start(http, demo_task) for _ in range(sessions)]
        for sid in ids[::100]:
            _exec(http, sid, f"cd calc && SID={sid}")
        wait_until(lambda: not owned_processes(tmp_path / "base"), timeout=600)
        assert len(os.listdir(f"/proc/{server.proc.pid}/fd")) < sessions * 2
        for sid in ids[::100]:
            assert _exec(http, sid, 'echo "${PWD##*/} $SID"')["output"] == f"calc {sid}\n"
        for sid in ids:
            assert requests.delete(f"{server.url}/session/{sid}", timeout=60).status_code == 200
        assert owned_processes(tmp_path / "base") == []
        wait_until(lambda: sorted((tmp_path / "base" / "work").iterdir()) == [])  # removed after
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=120) == 0


def test_named_shells_are_stopped_and_restored_each_with_its_own_state(
        executor_factory, demo_task):
    executor = executor_factory(session_idle_stop=IDLE_STOP_S)
    base = executor.settings.base_dir
    sid = _start(executor, demo_task)
    _exec(executor, sid, "cd calc && WHO=default")
    named = executor.post(f"/session/{sid}/exec",
                          json={"command": "cd tests && WHO=build", "shell": "build"})
    assert named.status_code == 200 and named.json()["exit_code"] == 0, named.text
    wait_until(lambda: _stopped(executor, sid))  # every shell, the named one too
    assert _state(executor, sid)["shells"] == ["default", "build"]
    assert owned_processes(base) == []
    again = executor.post(f"/session/{sid}/exec",
                          json={"command": 'echo "${PWD##*/} $WHO"', "shell": "build"})
    assert again.json()["output"] == "tests build\n", again.text
    assert _exec(executor, sid, 'echo "${PWD##*/} $WHO"')["output"] == "calc default\n"


def _launch_namespaces_held() -> int:
    """Mount namespace fds this process (the in-process executor's) holds."""
    held = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            held += os.readlink(f"/proc/self/fd/{name}").startswith("mnt:")
        except OSError:
            continue
    return held


def test_a_stopped_session_holds_no_launch_namespace_and_makes_it_again(
        executor_factory, demo_task):
    """No fd per idle session (issue 24): with every shell parked, the session's launch
    namespace goes; the next launch makes it again from the holder with everything mounted
    below it (tree, /usr/local), and later mounts there (a reset's) still reach it."""
    executor = executor_factory(session_idle_stop=IDLE_STOP_S)
    sandbox = executor.get("/health").json()["capabilities"]["sandbox"]
    if not sandbox["user_namespace"] or "launch_namespace" in sandbox["missing"]:
        pytest.skip("no launch namespaces here")
    # (the first launch ever opens the spawner's way home, for good)
    assert executor.delete(f"/session/{_start(executor, demo_task)}").status_code == 200
    assert executor.work_dirs() == []  # its namespace goes with its removal, after the DELETE
    before = _launch_namespaces_held()
    sid = _start(executor, demo_task)
    assert _launch_namespaces_held() == before + 1
    _exec(executor, sid, "echo kept > /usr/local/kept && echo mine > mine.txt && cd calc")
    wait_until(lambda: _stopped(executor, sid) and _launch_namespaces_held() == before)
    seen = _exec(executor, sid, "pwd; cat /usr/local/kept ../mine.txt; grep -c 'a - b' "
                                "__init__.py")
    assert seen["output"] == "/testbed/calc\nkept\nmine\n1\n", seen
    assert _launch_namespaces_held() == before + 1
    assert executor.post(f"/session/{sid}/reset").status_code == 200
    seen = _exec(executor, sid, "ls /testbed/mine.txt /usr/local/kept 2>&1 | grep -c 'No such'")
    assert seen["output"] == "2\n", seen
    assert executor.delete(f"/session/{sid}").status_code == 200
    assert executor.work_dirs() == []
    assert _launch_namespaces_held() == before
