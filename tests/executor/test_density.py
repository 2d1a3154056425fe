"""An executor past its own density (issue 24): more than 1,024 fds open in a real
``task-executor serve`` process, then new connections, gradings and the live sessions; and a
serving loop that fails exits non-zero with its traceback instead of shutting down quietly."""

from __future__ import annotations

import http.client
import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import requests

from task_executor.grading.grader import owner_token
from task_executor.service.lifecycle import clean_base_dir
from tests.executor.test_lifecycle import (
    assert_nothing_left,
    owned_processes,
    serving,
)
from tests.executor.test_sessions_api import _exec, _finish, _start

IDLE_CONNECTIONS = 1100
"""Idle keep-alive connections held open: with the sessions' own fds they push every new fd of
the executor past 1,023, the highest that select() takes."""


class Http:
    """The few calls the session helpers make, each on a new connection (as a new client)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str) -> requests.Response:
        return requests.get(self.url + path, headers={"Connection": "close"}, timeout=60)

    def post(self, path: str, json: dict) -> requests.Response:
        return requests.post(self.url + path, json=json, headers={"Connection": "close"},
                             timeout=120)


def _raise_own_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def _health_on(conn: http.client.HTTPConnection) -> int:
    conn.request("GET", "/health")
    answer = conn.getresponse()
    answer.read()
    return answer.status


def _open_idle(url: str, count: int) -> list[http.client.HTTPConnection]:
    """``count`` keep-alive connections, each answered once (so the executor has accepted it)."""
    host, port = url.removeprefix("http://").split(":")
    held = []
    for _ in range(count):
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        held.append(conn)
        assert _health_on(conn) == 200, "an idle connection was not answered"
    return held


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.slow  # test_connections.py holds the default suite's case (real sessions, a grading)
def test_new_connections_past_fd_1024_are_answered_and_sessions_live(tmp_path, demo_task):
    _raise_own_fd_limit(IDLE_CONNECTIONS + 512)
    # The connection limit follows max_sessions: 4 * (300 + 8) is above what the test holds.
    with serving(tmp_path / "base", DOCKYARD_MAX_SESSIONS="300") as server:
        http = Http(server.url)
        sessions = [_start(http, demo_task) for _ in range(3)]
        held = _open_idle(server.url, IDLE_CONNECTIONS)
        try:
            assert _fd_count(server.proc.pid) > 1024 + 16
            for index in range(50):  # each on an fd of 1,024 or more in the executor
                assert http.get("/health").status_code == 200, f"new connection {index}"
            graded = sessions[0]
            _exec(http, graded, "sed -i 's/return a - b/return a + b/' calc/__init__.py")
            assert _finish(http, graded, demo_task)["result"]["status"] == "resolved"
            for sid in sessions[1:]:
                assert _exec(http, sid, f"echo {sid}")["output"] == f"{sid}\n"
            # The idle connections still work too.
            assert _health_on(held[0]) == 200 and _health_on(held[-1]) == 200
            assert server.proc.poll() is None
        finally:
            for conn in held:
                conn.close()


BROKEN_LOOP = textwrap.dedent(
    """
    import sys
    from task_executor import cli
    from task_executor.service import server as served

    real_make_server = served.make_server

    class Unpollable:
        # A map entry poll() cannot register (a negative fd): the loop itself raises.
        accepting = False

        def readable(self):
            return True

        def writable(self):
            return False

    def make_server(app, settings, host=None, port=None):
        server = real_make_server(app, settings, host, port)
        server._map[-1] = Unpollable()
        return server

    served.make_server = make_server
    sys.exit(cli.main(["serve", "--host", "127.0.0.1", "--port", "0", "--base-dir", sys.argv[1]]))
    """
)


def test_an_exception_in_the_serving_loop_exits_non_zero_with_its_traceback(tmp_path: Path):
    env = {**os.environ, "DOCKYARD_TASK_EXECUTOR_THREADS": "4"}
    env.pop("API_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "-c", BROKEN_LOOP, str(tmp_path / "base")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "ERROR" in done.stderr and "the serving loop failed" in done.stderr
    assert "Traceback (most recent call last)" in done.stderr
    assert "ValueError" in done.stderr
    assert "draining" not in done.stderr and "shut down:" not in done.stderr


def _serve_with_fd_limit(base: Path, limit: int) -> tuple[subprocess.Popen[str], str]:
    """A ``task-executor serve`` process whose open-files limit, hard and soft, is ``limit``."""
    env = {**os.environ, "DOCKYARD_TASK_EXECUTOR_THREADS": "8"}
    env.pop("API_TOKEN", None)
    with (base.parent / "executor.err").open("w") as log:  # what a failure needs to say
        proc = subprocess.Popen(
            [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port",
             "0", "--base-dir", str(base)],
            stdout=subprocess.PIPE, stderr=log, text=True, env=env,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)),
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on http://127.0.0.1:" in line, f"no listening line: {line!r}"
    return proc, line.strip().rsplit(" ", 1)[1]


def test_out_of_fds_is_a_retryable_503_and_live_sessions_go_on(tmp_path, demo_task):
    proc, url = _serve_with_fd_limit(tmp_path / "base", 200)
    try:
        http = Http(url)
        assert http.get("/health").json()["limits"]["open_files"] == 200
        started, refused = [], None
        body = {"repo": demo_task.repo, "base_commit": demo_task.base_commit}
        for _ in range(40):  # far more than 200 fds hold, at about ten a session
            answer = http.post("/session/start", json=body)
            if answer.status_code != 200:
                refused = answer
                break
            started.append(answer.json()["session_id"])
        assert refused is not None, "200 fds held 40 sessions: the check was never reached"
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "out_of_fds"
        assert int(refused.headers["Retry-After"]) > 0
        assert started, "not even one session fit"
        for sid in started:  # nothing else broke
            assert _exec(http, sid, f"echo {sid}")["output"] == f"{sid}\n"
        assert http.get("/health").status_code == 200
        # Room made is room given: a closed session lets the next start in.
        closed = requests.delete(f"{url}/session/{started.pop()}", timeout=60)
        assert closed.status_code == 200
        again = http.post("/session/start", json=body)
        log = (tmp_path / "executor.err").read_text(errors="replace")
        assert again.status_code == 200, (again.text, log[-3000:])
    finally:
        proc.send_signal(signal.SIGTERM)  # its own shutdown closes the sessions
        proc.wait(timeout=120)
        assert proc.stdout is not None
        proc.stdout.close()
        clean_base_dir(tmp_path / "base")  # in case it did not get that far


def _cgroup_dirs(base: Path) -> list[Path]:
    """Every cgroup directory of an executor on ``base``, in any hierarchy."""
    parents = Path("/sys/fs/cgroup").glob(f"*/dockyard-{owner_token(base)}")
    unified = Path("/sys/fs/cgroup") / f"dockyard-{owner_token(base)}"
    found = [*parents, *([unified] if unified.is_dir() else [])]
    return sorted(d for parent in found for d in [parent, *parent.iterdir()] if d.is_dir())


def _start_many(url: str, demo_task, count: int) -> list[str]:
    body = {"repo": demo_task.repo, "base_commit": demo_task.base_commit}
    with requests.Session() as pooled:
        started = []
        for _ in range(count):
            answer = pooled.post(f"{url}/session/start", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
            started.append(answer.json()["session_id"])
    return started


def test_sigterm_with_fifty_sessions_exits_zero_and_leaves_nothing(tmp_path, demo_task):
    base = tmp_path / "base"
    with serving(base, DOCKYARD_MAX_SESSIONS="60", DOCKYARD_SHUTDOWN_GRACE="30") as server:
        _start_many(server.url, demo_task, 50)
        assert len(owned_processes(base)) >= 50  # a shell or more per session
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=120) == 0
    assert_nothing_left(base)
    assert _cgroup_dirs(base) == []


def test_the_next_executor_removes_the_cgroups_a_killed_one_left(tmp_path, demo_task):
    base = tmp_path / "base"
    with serving(base) as first:
        _start_many(first.url, demo_task, 3)
        left = _cgroup_dirs(base)
        first.proc.kill()
        first.proc.wait(timeout=30)
    if not left:
        pytest.skip("no cgroup controller is writable here: no groups to leave behind")
    assert _cgroup_dirs(base) == left, "SIGKILL should leave the groups (the case tested)"
    with serving(base) as second:
        now = _cgroup_dirs(base)
        stale = [d for d in left if d in now and d.parent.name.startswith("dockyard-")]
        assert stale == [], f"the killed executor's workspace groups are still there: {stale}"
        # Answered once: its SIGTERM handler is in place (the listening line comes before it).
        assert requests.get(second.url + "/health", timeout=60).status_code == 200
        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(timeout=120) == 0
    assert _cgroup_dirs(base) == []


def test_a_start_that_runs_out_of_fds_past_the_check_is_the_same_503():
    """The check is a snapshot: when a start runs out of descriptors anyway (a connection took
    the margin meanwhile), the error deep inside it, however wrapped, is the retryable 503."""
    from task_executor.sessions import headroom

    opened: list[int] = []

    def start() -> None:  # as a workspace's git or a shell's pipes fail on the real limit
        try:
            while True:
                opened.extend(os.pipe())
        except OSError as exc:
            raise RuntimeError("the workspace's git could not start") from exc

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
    try:
        with pytest.raises(headroom.OutOfResource) as caught:
            with headroom.running_out_is_503():
                start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for fd in opened:
            os.close(fd)
    assert caught.value.http_status == 503 and caught.value.code == "out_of_fds"
    assert opened, "no descriptor was opened before the limit"
    with pytest.raises(RuntimeError):  # anything else stays what it was
        with headroom.running_out_is_503():
            raise RuntimeError("another fault")
