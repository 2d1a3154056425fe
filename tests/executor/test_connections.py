"""The serving loop takes any number of connections, and a loop that fails never ends quietly.

waitress's default loop uses ``select()``, which cannot take an fd of 1024 or more. Each live
session holds about ten fds in the executor, so past ~100 sessions the next new connection made
the loop raise and the executor shut itself down, closing every session. This test holds more
than 1024 fds in a real executor process with real sessions (test_density.py holds them with idle
connections, and makes the loop itself fail), then opens new connections and grades: the
grading's output drain used select() too, and past ~100 sessions every grading lost its output.
"""

from __future__ import annotations

import os
import signal

import requests

from tests.conftest import FAST_PYTEST_ENV
from tests.executor.test_lifecycle import assert_nothing_left, serving

SELECT_LIMIT = 1024
"""FD_SETSIZE: select() refuses any fd at or above it."""


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_new_connections_past_fd_1024_are_answered_and_sessions_live_on(tmp_path, demo_task):
    base = tmp_path / "base"
    with serving(base, DOCKYARD_MAX_SESSIONS="400", DOCKYARD_SHUTDOWN_GRACE="60") as server:
        start = {"repo": demo_task.repo, "base_commit": demo_task.base_commit}
        sessions: list[str] = []
        with requests.Session() as keep_alive:  # one connection, as a driving trainer holds
            while open_fds(server.proc.pid) < SELECT_LIMIT + 64:
                assert len(sessions) < 400, f"{open_fds(server.proc.pid)} fds at 400 sessions"
                answer = keep_alive.post(server.url + "/session/start", json=start, timeout=120)
                assert answer.status_code == 200, answer.text
                sessions.append(answer.json()["session_id"])

            # New connections now get fds past select()'s limit: each is answered.
            for _ in range(40):
                with requests.Session() as fresh:
                    assert fresh.get(server.url + "/health", timeout=60).status_code == 200
            graded = requests.post(
                server.url + "/task/submit", timeout=300,
                json={**demo_task.request("past-1024", demo_task.gold_patch),
                      "env": FAST_PYTEST_ENV},
            ).json()
            assert graded["status"] == "resolved", {
                k: graded.get(k) for k in ("status", "error_code", "error", "log")}
            assert open_fds(server.proc.pid) >= SELECT_LIMIT

            # Every session is still there and works: nothing shut the executor down.
            assert server.proc.poll() is None
            for session in (sessions[0], sessions[len(sessions) // 2], sessions[-1]):
                ran = keep_alive.post(f"{server.url}/session/{session}/exec",
                                      json={"command": "echo alive"}, timeout=60).json()
                assert ran["output"].strip() == "alive", ran
            for session in sessions:
                state = keep_alive.get(f"{server.url}/session/{session}", timeout=60)
                assert state.status_code == 200 and state.json()["alive"], state.text

        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=600) == 0
    assert_nothing_left(base)
    assert "the serving loop failed" not in (base / "task_executor.log").read_text()
