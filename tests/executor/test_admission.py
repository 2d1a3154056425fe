"""Admission of long calls, against a real executor: sessions outnumber waitress threads, so
commands that run long (an agent's ``sleep``) are admitted up to ``max_execs`` and refused beyond
it (429 ``executor_busy``, before anything runs) instead of taking the threads that /health,
DELETE and the gradings need. Waits are polls with generous guards; "at once" is checked as
"while the admitted commands are still running", never by timing."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from sandbox_client import ClientConfig, ExecutorBusy, SandboxClient, TaskExecutorError
from task_executor.cli import main
from task_executor.config import RESERVED_THREADS, Settings
from tests.conftest import FAST_PYTEST_ENV, RunningExecutor
from tests.processes import wait_until

GUARD_S = 120.0  # only turns a hang into a failure


class Held:
    """A long command sent on its own thread; ``answer`` is set when the executor answers."""

    def __init__(self, executor: RunningExecutor, session_id: str, release: Path) -> None:
        self.session_id = session_id
        self.answer: requests.Response | None = None
        # A real sleep, until the test lets it go (or the command's timeout ends it).
        command = f"until [ -e {release} ]; do sleep 0.1; done; echo released"
        body = {"command": command, "timeout": 600}
        self.thread = threading.Thread(
            target=lambda: setattr(self, "answer", executor.post(
                f"/session/{session_id}/exec", json=body)),
            daemon=True,
        )
        self.thread.start()


def _start(executor: RunningExecutor, demo_task) -> str:
    body = {"repo": demo_task.repo, "base_commit": demo_task.base_commit, "env": FAST_PYTEST_ENV}
    answer = executor.post("/session/start", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["session_id"]


def _load(executor: RunningExecutor) -> dict[str, float]:
    answer = executor.get("/health")
    assert answer.status_code == 200, answer.text
    return answer.json()["load"]


def _still_running(executor: RunningExecutor, held: list[Held]) -> bool:
    """No answer came back for any of them, and each holds its slot. (Not asked of the sessions
    themselves: a state call could take a session's lock just before its exec, refusing it.)"""
    return all(h.answer is None for h in held) and _load(executor)["execs_running"] == len(held)


def _commands_run(executor: RunningExecutor, session_id: str) -> int:
    return executor.get(f"/session/{session_id}").json()["commands_run"]


def _gauges(executor: RunningExecutor) -> dict[str, float]:
    text = executor.get("/metrics").text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _assert_busy(answer: requests.Response) -> None:
    assert answer.status_code == 429, answer.text
    assert answer.json()["error"]["code"] == "executor_busy"
    assert int(answer.headers["Retry-After"]) >= 1


def _hold_every_slot(executor: RunningExecutor, demo_task, release: Path) -> list[Held]:
    sessions = [_start(executor, demo_task) for _ in range(executor.settings.max_execs)]
    held = [Held(executor, sid, release) for sid in sessions]
    wait_until(lambda: _load(executor)["execs_running"] == len(held), timeout=GUARD_S)
    return held


def _let_go(held: list[Held], release: Path) -> None:
    release.touch()
    for one in held:
        one.thread.join(timeout=GUARD_S)
        assert one.answer is not None and one.answer.status_code == 200, one.answer
        assert one.answer.json()["output"] == "released\n"


@pytest.fixture
def small(executor_factory) -> RunningExecutor:
    """Eight threads: a few exec slots, a few gradings, the reserve."""
    executor = executor_factory(threads=8)
    settings = executor.settings
    assert settings.max_execs + settings.max_tasks + RESERVED_THREADS <= settings.threads
    return executor


def test_more_long_commands_than_threads_leave_health_gradings_and_delete_answering(
    shared_dir, small, demo_task
):
    limit = small.settings.max_execs
    release = shared_dir / "release"
    # More sessions than the executor has threads, each sending one long command at once: what
    # held every thread before (the red team's 34 sleeps on 32 threads).
    sessions = [_start(small, demo_task) for _ in range(small.settings.threads + 2)]
    held = [Held(small, sid, release) for sid in sessions]
    # The ones beyond the limit come back refused while the admitted ones still run.
    wait_until(lambda: sum(h.answer is not None for h in held) == len(held) - limit,
               timeout=GUARD_S)
    admitted = [h for h in held if h.answer is None]
    refused = [h for h in held if h.answer is not None]
    assert len(admitted) == limit
    for one in refused:
        _assert_busy(one.answer)
        assert _commands_run(small, one.session_id) == 0  # refused before anything ran

    load = _load(small)
    assert (load["execs_running"], load["exec_capacity"]) == (limit, limit)
    gauges = _gauges(small)
    assert (gauges["dockyard_execs_running"], gauges["dockyard_exec_capacity"]) == (limit, limit)
    graded = small.submit(demo_task.request("while-execs-hold", demo_task.gold_patch))
    assert graded.status_code == 200, graded.text
    assert graded.json()["status"] == "resolved"
    _assert_busy(small.post(f"/session/{refused[0].session_id}/exec", json={"command": "true"}))
    # Starting a session builds a tree (and may run setup): it shares the limit.
    _assert_busy(small.post("/session/start", json={"repo": demo_task.repo,
                                                    "base_commit": demo_task.base_commit}))
    closed = small.delete(f"/session/{refused[0].session_id}")
    assert closed.status_code == 200, closed.text
    assert _still_running(small, admitted)  # all of the above answered meanwhile

    _let_go(admitted, release)
    assert _load(small)["execs_running"] == 0
    again = small.post(f"/session/{refused[1].session_id}/exec", json={"command": "echo in"})
    assert again.status_code == 200, again.text
    assert again.json()["output"] == "in\n"


def test_the_client_waits_out_a_full_executor_and_gets_its_result(shared_dir, small, demo_task):
    release = shared_dir / "release"
    seen: list[tuple[float, bool, int]] = []  # (delay, holders running, commands the session ran)

    def sleep(seconds: float) -> None:
        running = _still_running(small, held)
        seen.append((seconds, running, _commands_run(small, session.session_id)))
        _let_go(held, release)  # the client's retry finds every slot free


    client = SandboxClient(urls=[small.url], sleep=sleep)
    session = client.start_session({"repo": demo_task.repo, "base_commit": demo_task.base_commit})
    held = _hold_every_slot(small, demo_task, release)

    result = session.exec("echo through")
    assert (result.exit_code, result.output) == (0, "through\n")
    assert len(seen) == 1
    delay, running, commands = seen[0]
    assert delay >= 1  # Retry-After is the floor of the client's backoff
    assert running  # refused while every holder still ran
    assert commands == 0  # and the refused command had not run
    client.close()


def test_the_client_raises_executor_busy_after_its_retry_budget(shared_dir, small, demo_task):
    release = shared_dir / "release"
    waits: list[float] = []
    config = ClientConfig(urls=(small.url,), busy_retries=2)
    client = SandboxClient(config=config, sleep=waits.append)
    session = client.start_session({"repo": demo_task.repo, "base_commit": demo_task.base_commit})
    held = _hold_every_slot(small, demo_task, release)
    try:
        with pytest.raises(ExecutorBusy) as caught:
            session.exec("echo never")
        assert isinstance(caught.value, TaskExecutorError)
        assert (caught.value.status, caught.value.code) == (429, "executor_busy")
        assert len(waits) == 2  # three attempts, two waits between them
        assert _still_running(small, held)  # every attempt met the holders running
        assert _commands_run(small, session.session_id) == 0
    finally:
        _let_go(held, release)
        client.close()


# -- the thread budget --------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [4, 5, 8, 32, 200])
@pytest.mark.parametrize("cpus", [1, 2, 16, 64])
def test_derived_limits_always_fit_in_the_threads(monkeypatch, threads, cpus):
    monkeypatch.setattr("os.cpu_count", lambda: cpus)
    settings = Settings(threads=threads).validated()
    assert settings.max_tasks >= 1 and settings.max_execs >= 1
    assert settings.max_tasks + settings.max_execs + RESERVED_THREADS == threads
    # Many CPUs do not leave agents' commands a single thread: they keep a quarter.
    assert settings.max_execs >= (threads - RESERVED_THREADS) // 4


def test_a_configured_exec_limit_leaves_the_gradings_the_rest(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    settings = Settings(threads=32, max_concurrent_execs=10).validated()
    assert (settings.max_execs, settings.max_tasks) == (10, 20)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"threads": 3}, "threads must be at least 4"),
    ({"threads": 8, "max_concurrent_execs": 0},
     "DOCKYARD_MAX_CONCURRENT_EXECS) must be at least 1"),
    ({"threads": 8, "max_concurrent_execs": 7},
     "at least 1 grading (DOCKYARD_MAX_TASKS) + 7 long session calls"),
    ({"threads": 8, "max_concurrent_tasks": 4, "max_concurrent_execs": 3},
     "need 9 threads, but threads (DOCKYARD_TASK_EXECUTOR_THREADS) is 8"),
])
def test_limits_that_cannot_fit_are_refused_with_what_to_change(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Settings(**overrides).validated()


def test_the_executor_refuses_to_start_when_the_limits_do_not_fit(capsys, monkeypatch):
    monkeypatch.setenv("DOCKYARD_TASK_EXECUTOR_THREADS", "16")
    monkeypatch.setenv("DOCKYARD_MAX_TASKS", "10")
    monkeypatch.setenv("DOCKYARD_MAX_CONCURRENT_EXECS", "10")
    assert main(["serve"]) == 2
    error = capsys.readouterr().err
    assert "invalid configuration" in error and "need 22 threads" in error


# -- DELETE of a busy session ---------------------------------------------------------------------


def test_delete_of_a_session_running_a_long_command_ends_it_instead_of_waiting(
    shared_dir, small, demo_task
):
    # DELETE runs on a thread kept for short calls: waiting out an agent's command there would
    # let a few DELETEs of busy sessions hold the reserve, and /health with it.
    release = shared_dir / "release"  # never created: only a kill ends the command
    session = _start(small, demo_task)
    holder = Held(small, session, release)
    wait_until(lambda: _load(small)["execs_running"] == 1, timeout=GUARD_S)
    closed = small.delete(f"/session/{session}")
    assert closed.status_code == 200, closed.text
    holder.thread.join(timeout=GUARD_S)
    assert holder.answer is not None
    if holder.answer.status_code == 200:  # the command was running: it was killed, not finished
        result = holder.answer.json()
        assert result["error"] == "session closed while the command ran", result
        assert "released" not in result["output"]
    else:  # closed before the command started
        assert holder.answer.json()["error"]["code"] == "session_not_found", holder.answer.text
    assert small.get(f"/session/{session}").status_code == 404
    assert _load(small)["execs_running"] == 0
    assert small.work_dirs() == []
