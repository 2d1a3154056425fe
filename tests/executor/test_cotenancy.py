"""Executors sharing a host share nothing of their work (what ``dockyard fleet up`` runs).

Each ``python -m task_executor serve`` keeps its mounts in a private mount namespace: a second
executor's host view (recursive binds of the host's top-level directories) copied the first
one's live workspaces while both lived in the host's table, so code in its sandboxes read
another agent's tree, and the owner's removal of that workspace then failed (EBUSY), bricking
its base dir. The scenarios run real executor processes and real routes: two executors with base
dirs side by side under /var/tmp (no /tmp: sandboxes have a private one, and the view's binds of
/var are where the copies came from), one executor SIGKILLed, and the refusals reported.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from task_executor.sandbox.mounts import mounts_under, unmount_under
from tests.conftest import FAST_PYTEST_ENV
from tests.executor.test_lifecycle import Serve, describe, owned_processes, serving, wait_for
from tests.processes import mounts_anywhere, wait_until

SECRET = "agent-A-private-work-5f3c"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def side_by_side() -> Iterator[Path]:
    """A directory under /var/tmp for executors' base dirs, passable (o+x) by sandbox uids."""
    path = Path(tempfile.mkdtemp(prefix="dockyard-cotenants-", dir="/var/tmp"))
    path.chmod(0o711)
    yield path
    unmount_under(path)  # a failed fix would leave mounts here: never delete through them
    shutil.rmtree(path, ignore_errors=True)


def _require_private_sandbox(server: Serve) -> None:
    sandbox = requests.get(server.url + "/health", timeout=60).json()["capabilities"]["sandbox"]
    if os.geteuid() != 0 or sandbox["tool"] != "bwrap":
        pytest.skip(f"no bubblewrap sandbox with a root executor here: {sandbox['missing']}")
    if "private_mount_namespace" in sandbox["missing"]:
        pytest.skip(f"the kernel refused: {sandbox['missing']['private_mount_namespace']}")
    assert sandbox["executor_mount_namespace"] == "private"


def _start(server: Serve, demo_task) -> str:
    answer = requests.post(server.url + "/session/start", timeout=120, json={
        "repo": demo_task.repo, "base_commit": demo_task.base_commit, "env": FAST_PYTEST_ENV})
    assert answer.status_code == 200, answer.text
    return answer.json()["session_id"]


def _exec(server: Serve, session_id: str, command: str) -> str:
    answer = requests.post(f"{server.url}/session/{session_id}/exec", timeout=180,
                           json={"command": command, "timeout": 120})
    assert answer.status_code == 200, answer.text
    return answer.json()["output"]


@pytest.mark.parametrize("fleet_hiding", [False, True], ids=["namespace-alone", "as-fleet-up"])
def test_a_cotenant_neither_sees_nor_reaches_another_executors_live_tree(side_by_side,
                                                                         demo_task,
                                                                         fleet_hiding):
    """Alone, the private namespaces keep A's mounts out of B's (B's host view still shows A's
    base dir as the host has it, a directory bound read-only); as ``fleet up`` runs them, B
    also hides the directory of both base dirs, and its table names nothing of A at all."""
    a_base, b_base = side_by_side / "a", side_by_side / "b"
    b_env = {"DOCKYARD_HIDE_PATHS": str(side_by_side)} if fleet_hiding else {}
    named = f"{a_base}" if fleet_hiding else f"{a_base}/"
    with serving(a_base) as a:
        _require_private_sandbox(a)
        a_session = _start(a, demo_task)
        _exec(a, a_session, f"echo {SECRET} > /testbed/secret.txt")
        # Where the red team found A's tree: in A's own table, and only there.
        trees = [m for m in mounts_under(a_base / "work", a.proc.pid) if m.endswith("/merged")]
        assert trees, mounts_under(a_base, a.proc.pid)
        assert mounts_under(a_base) == []
        with serving(b_base, **b_env) as b:  # started while A's workspace is live, as in the repro
            _require_private_sandbox(b)
            assert mounts_under(a_base, b.proc.pid) == []
            b_session = _start(b, demo_task)
            probe = "".join(f"cat {tree}/secret.txt; ls -A {tree}; touch {tree}/from-b && "
                            "echo WROTE; " for tree in trees)
            output = _exec(b, b_session, f"grep -c '{named}' /proc/self/mountinfo; {probe}"
                           f"cat {a_base}/work/*/merged/secret.txt; echo PROBE-DONE")
            assert "PROBE-DONE" in output, output
            assert output.splitlines()[0] == "0", output  # its mountinfo names nothing of A's
            assert SECRET not in output and "WROTE" not in output, output
            assert "from-b" not in _exec(a, a_session, "ls -A /testbed")

            # Nothing of B is mounted on A's holder: A's removal goes through, and A's base
            # dir stays usable (the brick: BASE/work chmodded 0700, every sandbox refused).
            assert requests.delete(f"{a.url}/session/{a_session}", timeout=120).status_code == 200
            work = a_base / "work"
            assert work.stat().st_mode & 0o7777 == 0o711
            wait_until(lambda: list(work.iterdir()) == [])  # removed after the answer
            graded = requests.post(a.url + "/task/submit", timeout=300, json={
                **demo_task.request("after-the-cotenant", demo_task.gold_patch),
                "env": FAST_PYTEST_ENV})
            assert graded.json()["status"] == "resolved", graded.text
            assert requests.delete(f"{b.url}/session/{b_session}", timeout=120).status_code == 200


def test_an_executors_mounts_are_in_its_own_table_only_and_go_with_it(side_by_side, demo_task):
    base = side_by_side / "solo"
    with serving(base) as server:
        _require_private_sandbox(server)
        session = _start(server, demo_task)
        _exec(server, session, "setsid sleep 604 >/dev/null 2>&1 < /dev/null &")
        own = mounts_under(base, server.proc.pid)
        assert any(m.startswith(f"{base}/work/") for m in own), own
        assert any(m.startswith(f"{base}/view") for m in own), own
        assert mounts_under(base) == []  # the test's table (the host's) shows none of them
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(timeout=60)
    # The namespace goes with the last process in it: the executor's sandboxes die with it (a
    # cascade of parent-death signals, awaited: a guard, not a budget), and nothing of it is
    # mounted anywhere on the machine then, no cleanup needed.
    wait_for(lambda: owned_processes(base) == [] and mounts_anywhere(base) == [], 300,
             lambda: f"the executor's processes and mounts to go; left: "
             f"{describe(owned_processes(base))} {mounts_anywhere(base)[:5]}")


def test_an_in_process_executor_reports_the_namespace_of_the_process_it_is_in(executor):
    # This test session entered a private one (tests/conftest.py), where it could.
    from task_executor.sandbox import executor_namespace

    sandbox = executor.get("/health").json()["capabilities"]["sandbox"]
    assert sandbox["executor_mount_namespace"] == executor_namespace.current().kind


def test_an_executor_built_inside_a_process_that_entered_none_says_so(tmp_path):
    script = (
        "import json, sys\n"
        "from task_executor.config import Settings\n"
        "from task_executor.service.app import create_app\n"
        "app = create_app(Settings().with_overrides(base_dir=sys.argv[1]))\n"
        "print(json.dumps(app.test_client().get('/health').json['capabilities']['sandbox']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "base")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    sandbox = json.loads(done.stdout.strip().splitlines()[-1])
    assert sandbox["executor_mount_namespace"] == "host"
    assert "not entered" in sandbox["missing"]["private_mount_namespace"]


@pytest.mark.parametrize("refusal", ["a-thread-runs", "unprivileged"])
def test_a_refused_private_namespace_leaves_the_process_where_it_was_and_says_why(refusal):
    # A namespace is a thread's: with another thread running, unshare would move only the
    # caller (so it is not tried); without CAP_SYS_ADMIN the kernel refuses (EPERM).
    script = (
        "import os, sys, threading, time\n"
        "from task_executor.sandbox import executor_namespace\n"
        "if sys.argv[1] == 'a-thread-runs':\n"
        "    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "before = os.readlink('/proc/self/ns/mnt')\n"
        "entered = executor_namespace.enter_private()\n"
        "assert executor_namespace.current() == entered\n"
        "print(entered.kind, os.readlink('/proc/self/ns/mnt') == before, entered.reason)\n"
    )
    drop = (["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            if refusal == "unprivileged" and os.geteuid() == 0 else [])
    done = subprocess.run([*drop, sys.executable, "-c", script, refusal], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    kind, unchanged, reason = done.stdout.strip().split(" ", 2)
    assert (kind, unchanged) == ("host", "True")
    assert reason == {
        "a-thread-runs": "not entered: 2 threads already run, and unshare would move only the "
                         "calling one",
        "unprivileged": "unshare(CLONE_NEWNS) refused: Operation not permitted",
    }[refusal]


def test_hidden_paths_are_out_of_sight_of_code_under_test(shared_dir, executor_factory, demo_task):
    """What ``dockyard fleet up`` hides: the directory of all its workers' base dirs."""
    neighbour = shared_dir / "neighbour"
    neighbour.mkdir()
    (neighbour / "notes.txt").write_text(SECRET)
    neighbour.chmod(0o755)
    probe = (f"ls -A {neighbour} 2>/dev/null | grep -c notes; "
             f"cat {neighbour}/notes.txt 2>/dev/null; echo; echo PROBE-DONE")
    seen = {}
    for hidden in ((), (str(shared_dir),)):
        executor = executor_factory(hide_paths=hidden)
        sandbox = executor.get("/health").json()["capabilities"]["sandbox"]
        if sandbox["tool"] != "bwrap":
            pytest.skip(f"no bubblewrap sandbox here: {sandbox['missing']}")
        started = executor.post("/session/start", json={
            "repo": demo_task.repo, "base_commit": demo_task.base_commit})
        assert started.status_code == 200, started.text
        session = started.json()["session_id"]
        answer = executor.post(f"/session/{session}/exec", json={"command": probe})
        seen[hidden] = answer.json()["output"]
        assert "PROBE-DONE" in seen[hidden]
    # The control first: without the setting, it is there to read.
    assert seen[()].splitlines()[:2] == ["1", SECRET], seen[()]
    assert seen[(str(shared_dir),)].splitlines()[0] == "0", seen[(str(shared_dir),)]
    assert SECRET not in seen[(str(shared_dir),)]
