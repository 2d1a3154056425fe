"""Start and end of an executor process: cleanup after a killed run, graceful shutdown.

The scenarios run real ``python -m task_executor serve`` processes and real clients: a SIGKILL in
the middle of 20 gradings and 10 sessions, then a restart on the same base directory; SIGTERM
while a grading runs (it finishes, new work is refused, the process exits 0 with nothing left);
SIGTERM past the grace period (the work is killed, still exit 0, nothing left).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from sandbox_client import SandboxClient
from sandbox_client.errors import TaskExecutorError
from sandbox_client.protocol import TaskResult
from task_executor.demo import DemoTask
from task_executor.grading.grader import OWNER_VARIABLE, owner_token
from task_executor.sandbox import reaper
from task_executor.service.lifecycle import clean_base_dir, mounts_under, owner_entries
from tests.conftest import FAST_PYTEST_ENV
from tests.processes import mounts_anywhere

SLOW_TESTS = "python -m pytest -p no:cacheprovider tests/test_calc.py"


def slow_task(demo: DemoTask, task_id: str, patch: str, sleep_s: float) -> dict:
    """A demo grading whose test command first sleeps, so it is surely running when we act."""
    return {
        **demo.request(task_id, patch),
        "test_command": f"sleep {sleep_s}; {SLOW_TESTS}",
        "env": FAST_PYTEST_ENV,
    }


@dataclass
class Serve:
    """A ``python -m task_executor serve`` subprocess on a loopback port."""

    proc: subprocess.Popen[str]
    url: str
    base: Path

    def metric(self, name: str) -> float:
        text = requests.get(self.url + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)


def start_serve(base: Path, **env: str) -> Serve:
    full_env = {**os.environ, "DOCKYARD_TASK_EXECUTOR_THREADS": "8", **env}
    full_env.pop("API_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port", "0",
         "--base-dir", str(base)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=full_env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on http://127.0.0.1:" in line, f"no listening line: {line!r}"
    return Serve(proc=proc, url=line.strip().rsplit(" ", 1)[1], base=base)


@contextmanager
def serving(base: Path, **env: str) -> Iterator[Serve]:
    server = start_serve(base, **env)
    try:
        yield server
    except BaseException:
        # A failed test must not leave its sleepers behind (a passing one proves none are left).
        server.proc.kill()
        reaper.kill(reaper.Target(environment=owner_entries(base)), grace=0)
        raise
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        server.proc.wait(timeout=30)
        assert server.proc.stdout is not None
        server.proc.stdout.close()


def owned_processes(base: Path) -> list[reaper.ProcInfo]:
    return reaper.find(reaper.Target(environment=owner_entries(base)))


def assert_nothing_left(base: Path, pid: int | None = None) -> None:
    """Nothing of a dead executor's work. With ``pid``, the live process whose mount table is
    read (an executor serving as its own process keeps its mounts in a namespace of its own):
    its own read-only runtime binds, host view and launcher option files' tmpfs (made at its
    start) are all that may be mounted there. Without, no executor is left on ``base``: no
    mount namespace anywhere may show anything of it."""
    assert owned_processes(base) == []
    if pid is None:
        assert mounts_anywhere(base) == []
    else:
        assert [m for m in mounts_under(base, pid)
                if not m.startswith((f"{base}/runtime/", f"{base}/view"))
                and m != f"{base}/launch-args"] == []
    assert sorted((base / "work").iterdir()) == []


def wait_for(condition: Callable[[], bool], timeout: float, what: str | Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            said = what if isinstance(what, str) else what()
            raise AssertionError(f"timed out waiting for {said}")
        time.sleep(0.05)


def describe(processes: list[reaper.ProcInfo]) -> str:
    """pid, parent, state and command line of each (what a failure needs to say)."""
    lines = []
    for proc in processes:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue  # gone meanwhile
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        command = cmdline.decode(errors="replace")[:120]
        lines.append(f"{proc.pid} ppid={fields.get('PPid', '?').strip()} "
                     f"state={fields.get('State', '?').strip()} {command}")
    return "; ".join(lines)


def in_background(function: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``function`` in a thread; its result (or exception) lands in the returned list."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(function())
        except Exception as exc:  # the test inspects it
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def sleeping(base: Path, seconds: str) -> int:
    """How many processes of the executor on ``base`` are ``sleep <seconds>``."""
    count = 0
    for proc in owned_processes(base):
        try:
            argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        count += argv[:2] == [b"sleep", seconds.encode()]
    return count


# -- cleanup at start ---------------------------------------------------------------------------


@pytest.fixture
def mount_or_skip() -> Iterator[Callable[..., None]]:
    """``mount(*args, target)`` that is undone after the test whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    targets: list[Path] = []

    def mount(*args: str, target: Path) -> None:
        target.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"mount refused here: {done.stderr.strip()}")
        targets.append(target)

    yield mount
    for target in reversed(targets):
        while str(target.resolve()) in mounts_under(target.parent):
            subprocess.run(["umount", "-l", str(target)], capture_output=True)


def test_cleanup_removes_leftover_processes_mounts_and_trees(tmp_path, mount_or_skip):
    base = tmp_path / "base"
    tree = base / "work" / "ws-left"
    (tree / "repo").mkdir(parents=True)
    (tree / "repo" / "file.py").write_text("x = 1\n")
    (base / "work" / "stray-file").write_text("")
    (base / "mirrors" / "m.git").mkdir(parents=True)
    (base / "templates" / "t").mkdir(parents=True)
    # A bind mount of a directory outside the base: removing the tree must not reach through it.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    mount_or_skip("-t", "tmpfs", "none", target=tree / "merged")
    mount_or_skip("--bind", str(outside), target=tree / "merged" / "bound")
    mount_or_skip("-t", "tmpfs", "none", target=base / "templates" / "t")
    leftover = subprocess.Popen(
        ["sleep", "600"], env={**os.environ, OWNER_VARIABLE: owner_token(base)},
        start_new_session=True,
    )
    stranger = subprocess.Popen(
        ["sleep", "600"], env={**os.environ, OWNER_VARIABLE: owner_token(tmp_path / "other-base")},
        start_new_session=True,
    )
    try:
        cleanup = clean_base_dir(base)
        assert leftover.wait(timeout=10) != 0
        assert stranger.poll() is None  # another executor's process is none of our business
    finally:
        stranger.kill()
        stranger.wait()
    assert cleanup.processes == 1
    assert cleanup.unmounted == 3
    assert cleanup.removed == 2 and cleanup.kept == ()
    # The test mounted those itself, in its own table (a copy of the host's in another
    # namespace, made meanwhile by another executor on the machine, is not ours to check).
    assert_nothing_left(base, os.getpid())
    assert (outside / "precious").read_text() == "keep me"
    assert (base / "mirrors" / "m.git").is_dir() and (base / "templates" / "t").is_dir()


def test_a_second_executor_on_the_same_base_dir_is_refused(tmp_path):
    base = tmp_path / "base"
    with serving(base) as first:
        second = subprocess.run(
            [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port",
             "0", "--base-dir", str(base)],
            capture_output=True, text=True, timeout=60,
        )
        assert second.returncode == 2
        assert "another executor is running on" in second.stderr
        assert requests.get(first.url + "/health", timeout=10).status_code == 200


def test_restart_after_sigkill_cleans_up_and_clients_never_see_a_wrong_verdict(
    tmp_path, demo_task
):
    base = tmp_path / "base"
    verdicts: list[tuple[str, object]] = []  # (expected status, what the client got)
    with serving(base, DOCKYARD_TASK_EXECUTOR_THREADS="40", DOCKYARD_MAX_TASKS="20") as server:
        health = requests.get(server.url + "/health", timeout=30).json()
        sandboxed = health["capabilities"]["sandbox"]["pid_namespace"]
        client = SandboxClient(urls=[server.url])
        threads = []
        for i in range(20):
            gold = i % 2 == 0
            patch = demo_task.gold_patch if gold else ""
            body = slow_task(demo_task, f"killed-{i}", patch, 60 if i < 18 else 0)
            thread, outcome = in_background(lambda body=body: client.run_task(body))
            threads.append(thread)
            verdicts.append(("resolved" if gold else "unresolved", outcome))
        session_outcomes = []
        for i in range(10):
            session = client.start_session(
                {"repo": demo_task.repo, "base_commit": demo_task.base_commit,
                 "task_id": f"session-{i}"}
            )
            # A daemon that leaves the shell's process group and session, and a command in flight.
            session.exec("setsid sleep 601 >/dev/null 2>&1 < /dev/null &")
            thread, outcome = in_background(lambda s=session: s.exec("sleep 602", timeout=120))
            threads.append(thread)
            session_outcomes.append(outcome)
        # The daemons too: `setsid` forks before it execs `sleep`, after the exec that started it
        # has answered (9 of 10 were still `setsid` once, under load).
        wait_for(lambda: (sleeping(base, "60"), sleeping(base, "602"), sleeping(base, "601"))
                 == (18, 10, 10), 120, "every grading, session command and daemon to be running")
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(timeout=10)
        for thread in threads:
            thread.join(timeout=60)
        client.close()
        if sandboxed:
            # bubblewrap dies with its parent and takes its PID namespace along: not one
            # process of code under test outlives a SIGKILLed executor, setsid daemons included.
            # That death is a cascade of signals (the executor's end, each bwrap's parent-death
            # signal, each namespace's init), awaited: a loaded machine takes its time (52 were
            # still dying when this was asserted at once). A leaked daemon lives 601 s.
            wait_for(lambda: owned_processes(base) == [], 300,
                     lambda: "every sandboxed process to die with the executor; left: "
                     + describe(owned_processes(base)))
        else:
            assert owned_processes(base), "the killed run should have left processes behind"
        assert list((base / "work").iterdir()), "the killed run should have left trees behind"

    for expected, outcome in verdicts:
        (got,) = outcome  # type: ignore[misc]
        if isinstance(got, TaskResult):
            assert got.status in (expected, "execution_error"), got
        else:
            assert isinstance(got, TaskExecutorError), got
    assert sum(isinstance(o[0], TaskExecutorError) for _, o in verdicts) >= 18  # type: ignore[index]
    for outcome in session_outcomes:
        assert isinstance(outcome[0], TaskExecutorError)

    with serving(base) as restarted:
        assert_nothing_left(base, restarted.proc.pid)
        answer = requests.post(
            restarted.url + "/task/submit", timeout=120,
            json={**demo_task.request("after-restart", demo_task.gold_patch),
                  "env": FAST_PYTEST_ENV},
        )
        assert answer.json()["status"] == "resolved"
        restarted.proc.send_signal(signal.SIGTERM)
        assert restarted.proc.wait(timeout=30) == 0


# -- graceful shutdown --------------------------------------------------------------------------


def test_sigterm_lets_running_work_finish_and_refuses_new_work(tmp_path, demo_task):
    base = tmp_path / "base"
    with serving(base, DOCKYARD_SHUTDOWN_GRACE="60") as server:
        running, outcome = in_background(
            lambda: requests.post(
                server.url + "/task/submit", timeout=120,
                json=slow_task(demo_task, "finishes", demo_task.gold_patch, 2),
            )
        )
        session = requests.post(
            server.url + "/session/start", timeout=60,
            json={"repo": demo_task.repo, "base_commit": demo_task.base_commit},
        ).json()["session_id"]
        wait_for(lambda: sleeping(base, "2") == 1, 30, "the grading to run its tests")

        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: server.metric("dockyard_draining") == 1, 10, "draining")
        refused = requests.post(
            server.url + "/task/submit", timeout=30,
            json={**demo_task.request("too-late", demo_task.gold_patch), "env": FAST_PYTEST_ENV},
        )
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        assert int(refused.headers["Retry-After"]) > 0
        assert requests.get(server.url + "/health", timeout=10).status_code == 503
        exec_refused = requests.post(
            f"{server.url}/session/{session}/exec", json={"command": "true"}, timeout=30
        )
        assert exec_refused.status_code == 503
        state = requests.get(f"{server.url}/session/{session}", timeout=30)
        assert state.status_code == 200  # calls that only look are still answered

        running.join(timeout=60)
        (answer,) = outcome
        assert isinstance(answer, requests.Response), answer
        graded = answer.json()
        assert graded["status"] == "resolved", {k: graded.get(k) for k in (
            "status", "error_code", "error", "tests", "control_run", "test_exit_code")} | {
            "log": (graded.get("log") or "")[-3000:]}
        assert server.proc.wait(timeout=30) == 0
    assert_nothing_left(base)
    log = (base / "task_executor.log").read_text()
    assert "SIGTERM: draining" in log and "shut down:" in log


def test_sigterm_past_the_grace_period_kills_the_work_and_exits_zero(tmp_path, demo_task):
    base = tmp_path / "base"
    with serving(base, DOCKYARD_SHUTDOWN_GRACE="1") as server:
        client = SandboxClient(urls=[server.url])
        running, outcome = in_background(
            lambda: client.run_task(slow_task(demo_task, "cut-off", demo_task.gold_patch, 600))
        )
        session = client.start_session(
            {"repo": demo_task.repo, "base_commit": demo_task.base_commit}
        )
        session.exec("setsid sleep 603 >/dev/null 2>&1 < /dev/null &")
        wait_for(lambda: sleeping(base, "600") == 1, 30, "the grading to run its tests")

        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
        assert time.monotonic() - started < 15
        running.join(timeout=60)
        client.close()
    (got,) = outcome
    # No verdict, and above all not "unresolved" from a test run killed under it.
    assert isinstance(got, TaskExecutorError), got
    assert_nothing_left(base)


def _cgroups_of(base: Path) -> list[Path]:
    token = owner_token(base)
    return [g for g in (*Path("/sys/fs/cgroup").glob(f"*/dockyard-{token}"),
                        Path("/sys/fs/cgroup") / f"dockyard-{token}") if g.is_dir()]


def test_sigterm_with_30_sessions_closes_them_all_at_once_and_leaves_nothing(
        tmp_path, demo_task):
    """The shutdown path of issue 24 (all sessions at once, through their cgroups): live shells
    with background work, parked shells and idle ones all go, with no process, mount or cgroup
    left behind."""
    base = tmp_path / "base"
    with serving(base, DOCKYARD_SESSION_IDLE_STOP="1", DOCKYARD_MAX_SESSIONS="40") as server:
        client = SandboxClient(urls=[server.url])
        spec = {"repo": demo_task.repo, "base_commit": demo_task.base_commit}
        sessions = [client.start_session(spec) for _ in range(30)]
        for session in sessions[:10]:  # never parked: something runs in them
            session.exec("setsid sleep 604 >/dev/null 2>&1 < /dev/null &")
        wait_for(lambda: sleeping(base, "604") == 10, 30, "the background sleeps")
        parked = sessions[20]  # let the idle ones be saved and stopped
        wait_for(lambda: requests.get(f"{server.url}/session/{parked.session_id}",
                                      timeout=10).json().get("stopped") is True,
                 30, "an idle shell to be stopped")
        for session in sessions[10:15]:  # live again: restored from their saved state
            session.exec("cd /tmp")
        assert _cgroups_of(base) != []  # what must go is there to begin with

        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0
        client.close()
    assert_nothing_left(base)
    assert _cgroups_of(base) == []
    log = (base / "task_executor.log").read_text()
    assert "30 sessions closed" in log
