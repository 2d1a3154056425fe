"""Subshell calls run in a spare: a subshell the session's shell forked after the previous call,
waiting for the next (framing.py, "Spares"). Real bash, real processes: the spare is found as the
shell's only child between calls, and a call that ran in it reports that child's ``$BASHPID``.

Each test checks one way the spare could make a call wrong: a stale spare after a stateful call,
a spare killed while it waits, a refusal, an ``exit``, an interrupt, a timeout, a parked shell,
stderr apart, agent options and aliases.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from task_executor.sandbox import reaper
from task_executor.sessions.modes import CallMode
from task_executor.sessions.runner import ShellSession
from tests.processes import alive

STATELESS = CallMode(subshell=True)


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[ShellSession]:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LC_ALL": "C.UTF-8"}
    session = ShellSession(str(tmp_path), env, default_timeout=30)
    yield session
    session.close()


def spare_of(shell: ShellSession) -> int:
    """The spare waiting now: the shell's child (no launcher here: the shell is bash) forked
    after a subshell call that reports its own pid (children it had before, background jobs,
    are not it). The spare that ran the call exits after answering, and the next is forked once
    it is reaped, so wait for a child that is neither."""
    assert shell.pid is not None
    before = set(reaper.children(shell.pid))
    ran = int(stateless(shell, "echo $BASHPID")[1])
    deadline = time.monotonic() + 30
    while not (new := set(reaper.children(shell.pid)) - before - {ran}):
        assert time.monotonic() < deadline, "no spare was forked"
        time.sleep(0.005)
    assert len(new) == 1, new
    return new.pop()


def stateless(shell: ShellSession, command: str, **mode: object) -> tuple[int | None, str]:
    result = shell.run(command, mode=CallMode(subshell=True, **mode))  # type: ignore[arg-type]
    assert result.error is None, result
    return result.exit_code, result.output


def test_a_subshell_call_runs_in_the_spare_forked_after_the_last_one(shell):
    waiting = spare_of(shell)
    assert stateless(shell, "echo $BASHPID") == (0, f"{waiting}\n")
    assert spare_of(shell) not in (waiting, shell.pid)  # a fresh spare for each call


def test_a_stateful_call_lets_the_spare_go_and_the_next_one_sees_its_changes(shell, tmp_path):
    (tmp_path / "sub").mkdir()
    stale = spare_of(shell)
    assert shell.run("export X=1; cd sub; f() { echo fn; }").exit_code == 0
    assert reaper.children(shell.pid) == []  # let go (and reaped) before the command ran
    assert not alive(stale)
    assert stateless(shell, 'echo "$X ${PWD##*/}"; f') == (0, "1 sub\nfn\n")


def test_a_spare_killed_while_it_waits_is_replaced_by_a_subshell_at_the_call(shell):
    shell.run("export KEPT=yes")
    killed = spare_of(shell)
    os.kill(killed, signal.SIGKILL)
    code, output = stateless(shell, "echo $KEPT $BASHPID")
    assert code == 0 and output.split()[0] == "yes" and int(output.split()[1]) != killed
    assert stateless(shell, "echo again") == (0, "again\n")


def test_refusal_exit_and_the_next_status_through_a_spare(shell):
    stateless(shell, "true")
    refused = shell.run("echo 'open", mode=STATELESS)
    assert refused.not_run == "syntax_error" and refused.exit_code == 2
    assert "unexpected EOF" in (refused.syntax_error or "")
    assert shell.run("echo $?").output == "2\n"  # the shell's `$?` is the refusal's status
    stateless(shell, "true")
    assert stateless(shell, "echo before; exit 7; echo after") == (7, "before\n")
    assert shell.run("echo $?").output == "7\n"
    stateless(shell, "true")
    assert stateless(shell, "echo fine") == (0, "fine\n")


def test_an_interrupted_call_in_a_spare_keeps_the_shell(shell, tmp_path):
    shell.run("export KEPT=yes")
    stateless(shell, "true")
    started = tmp_path / "started"
    answers = []
    worker = threading.Thread(target=lambda: answers.append(
        shell.run(f"echo $BASHPID > {started}; sleep 1000", mode=STATELESS)))
    worker.start()
    deadline = time.monotonic() + 30
    while not (started.exists() and started.read_text().strip()):
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.01)
    assert shell.interrupt() is True
    worker.join(timeout=30)
    # 130 when SIGINT ended it, 137 when the SIGKILL after the grace did (a loaded machine can
    # keep the call from running within the grace): interrupted either way, and the shell kept.
    assert answers and answers[0].interrupted and answers[0].exit_code in (130, 137), answers
    assert not alive(int(started.read_text()))
    assert stateless(shell, "echo $KEPT") == (0, "yes\n")


def test_a_call_that_times_out_in_a_spare_takes_its_children_along(shell, tmp_path):
    shell.run("export KEPT=yes")
    stateless(shell, "true")
    child = tmp_path / "child"
    result = shell.run(f"sleep 1000 & echo $! > {child}; sleep 1000", timeout=1, mode=STATELESS)
    assert result.timed_out
    assert not alive(int(child.read_text()))
    assert stateless(shell, "echo $KEPT") == (0, "yes\n")


def test_an_idle_shell_with_a_waiting_spare_is_parked(shell):
    shell.run("export KEPT=yes")
    spare = spare_of(shell)
    assert shell.park() is True
    assert not alive(spare)
    assert stateless(shell, "echo $KEPT") == (0, "yes\n")


def test_stderr_apart_in_a_spare(shell):
    stateless(shell, "true")
    result = shell.run("echo out; echo err >&2", mode=CallMode(subshell=True,
                                                                separate_stderr=True))
    assert (result.output, result.stderr) == ("out\n", "err\n")
    assert stateless(shell, "echo out; echo err >&2") == (0, "out\nerr\n")


@pytest.mark.parametrize(("options", "errexit"),
                         [("set -e", True), ("set -u", False), ("set -eu -o pipefail", True)])
def test_spares_under_the_agents_shell_options(shell, options, errexit):
    # set -e ends the call at its first failure, never the session's shell.
    shell.run(options)
    stateless(shell, "true")
    assert stateless(shell, "false; echo reached") == ((1, "") if errexit else (0, "reached\n"))
    assert stateless(shell, "echo ${UNSET_VAR-default}") == (0, "default\n")
    assert shell.run("echo still").output == "still\n"


def test_agent_aliases_do_not_reach_the_spares_own_text(shell):
    # The spare's text is parsed when it runs, after the agent's aliases: bash expands an alias
    # named after a reserved word, so the text uses none.
    shell.run("alias case='echo HIJACKED;' if='echo HIJACKED;' while='echo HIJACKED;'")
    for _ in range(3):
        assert stateless(shell, "echo fine") == (0, "fine\n")
    assert stateless(shell, "cd /", cwd="/tmp", env={"A": "1"}) == (0, "")


def test_a_timed_out_call_in_a_spare_spares_what_a_background_job_started_meanwhile(
        shell, tmp_path):
    # The spare waited since the last call; a worker a background job forked in that time is not
    # the timed-out call's, and lives on (as a terminal's Ctrl-C would leave it).
    started, worker = tmp_path / "go", tmp_path / "worker"
    shell.run(f"( until [ -e {started} ]; do sleep 0.01; done; "
              f"sleep 1000 & echo $! > {worker}; wait ) &")
    spare_of(shell)  # a spare waits from here on
    started.touch()
    deadline = time.monotonic() + 30
    while not (worker.exists() and worker.read_text().strip()):
        assert time.monotonic() < deadline, "the background job never forked its worker"
        time.sleep(0.01)
    time.sleep(0.05)  # start times are clock ticks (10 ms): the call starts ticks after it
    result = shell.run("sleep 1000", timeout=1, mode=STATELESS)
    assert result.timed_out
    assert alive(int(worker.read_text()))
    assert stateless(shell, "echo on") == (0, "on\n")


def test_a_loop_in_the_spare_itself_ends_at_its_timeout(shell):
    spare = spare_of(shell)
    time.sleep(0.05)  # the call starts clock ticks (10 ms) after the spare: older than the call
    result = shell.run("while :; do :; done", timeout=1, mode=STATELESS)
    assert result.timed_out
    deadline = time.monotonic() + 30
    while alive(spare):  # killed, not left spinning beside the fresh shell
        assert time.monotonic() < deadline, "the spare that ran the loop still runs"
        time.sleep(0.01)
    assert stateless(shell, "echo on") == (0, "on\n")


def test_a_state_poll_between_calls_keeps_a_spare_waiting(shell):
    # check_alive and saved_state ping the shell, which lets the spare go; one is forked again.
    spare_of(shell)
    assert shell.check_alive() is True
    shell.saved_state()  # empty here: only subshell calls ran, which change no state
    deadline = time.monotonic() + 30
    while not (children := reaper.children(shell.pid)):
        assert time.monotonic() < deadline, "no spare after the polls"
        time.sleep(0.005)
    assert stateless(shell, "echo $BASHPID") == (0, f"{children[0]}\n")
