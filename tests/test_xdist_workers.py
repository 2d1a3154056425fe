"""The suite's pytest-xdist workers keep their mounts to themselves (tests/xdist_workers.py): a
real two-worker run of a small suite under tests/conftest.py in which each test mounts a tmpfs
and looks for it in the controller's table, the run's temporary root removed after it, and the
fallback where unshare is refused (not root)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FAST_PYTEST_ENV
from tests.processes import mounts_anywhere

ROOT = Path(__file__).resolve().parent.parent

PROBE = '''
import json, os, subprocess
from pathlib import Path

from task_executor.sandbox import executor_namespace


def test_probe(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()  # the worker's: <controller's root>/popen-gwN
    target = base / "left-mounted"  # outside tmp_path: left for the worker's end to unmount
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "probe", str(target)], check=True)
    report = {{
        "worker": os.environ.get("PYTEST_XDIST_WORKER"),
        "namespace": executor_namespace.current().kind,
        "own": os.readlink("/proc/self/ns/mnt"),
        "controller": os.readlink(f"/proc/{{os.getppid()}}/ns/mnt"),
        "seen_here": str(target) in Path("/proc/self/mountinfo").read_text(),
        "seen_by_controller": str(target) in Path(
            f"/proc/{{os.getppid()}}/mountinfo").read_text(),
        "root": str(base.parent),
    }}
    Path(os.environ["PROBE_REPORTS"], "{name}.json").write_text(json.dumps(report))
'''

CONTROLLER_LEAVES_A_MOUNT = '''
import subprocess
from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)  # before tests/conftest.py's cleanup of the root
def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        target = Path(config.option.basetemp) / "left-by-the-controller"
        target.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "probe", str(target)], check=True)
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_each_worker_mounts_in_a_namespace_of_its_own_and_the_root_goes_at_the_end(tmp_path):
    # A small suite under the suite's own conftest (loaded as a plugin), in two workers: each
    # test mounts a tmpfs and looks for it in the controller's table, and leaves it mounted.
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")  # this directory is the run's root
    (suite / "conftest.py").write_text(CONTROLLER_LEAVES_A_MOUNT)
    for name in ("first", "second"):
        (suite / f"test_{name}.py").write_text(PROBE.format(name=name))
    reports = tmp_path / "reports"
    reports.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "xdist.plugin",
         "-p", "tests.conftest", "-n", "2", "--dist", "loadfile", str(suite)],
        cwd=suite, capture_output=True, text=True, timeout=300,
        env={**os.environ, **FAST_PYTEST_ENV, "PYTHONPATH": str(ROOT),
             "PROBE_REPORTS": str(reports)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = [json.loads(path.read_text()) for path in sorted(reports.glob("*.json"))]
    assert len(seen) == 2, seen
    for report in seen:
        assert report["worker"] in ("gw0", "gw1"), report
        assert report["namespace"] == "private", report
        assert report["own"] != report["controller"], report
        assert report["seen_here"] and not report["seen_by_controller"], report
    root = Path(seen[0]["root"])
    assert root.name.startswith("dockyard-pytest-") and root == Path(seen[1]["root"])
    assert not root.exists()  # the controller's mount too: rmtree alone cannot remove a mount
    assert mounts_anywhere(root) == []


def test_a_worker_runs_as_plain_python_where_unshare_is_refused():
    # As nobody (no CAP_SYS_ADMIN) unshare fails, and a worker under it could not start at all.
    script = "from tests.xdist_workers import worker_python; print(worker_python())"
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    as_root = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                             text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert as_root.returncode == 0, as_root.stderr
    if os.geteuid() == 0:
        assert as_root.stdout.split()[:4] == ["unshare", "--mount", "--propagation", "slave"]
        unprivileged = subprocess.run([*drop, sys.executable, "-c", script], cwd=ROOT,
                                      capture_output=True, text=True, timeout=120,
                                      env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert unprivileged.returncode == 0, unprivileged.stderr
        assert unprivileged.stdout.split() == [sys.executable]
    assert as_root.stdout.split()[-1] == sys.executable


@pytest.mark.skipif(os.geteuid() != 0, reason="unshare --mount needs root")
@pytest.mark.parametrize(("launcher", "expected"), [
    ([], ("host", "not entered: the parent process's mount namespace")),
    (["unshare", "--mount", "--propagation", "shared"], ("host", "inherited, but / propagates")),
    (["unshare", "--mount", "--propagation", "slave"], ("private", "")),
])
def test_an_inherited_namespace_is_private_only_when_made_for_it_and_sealed(launcher, expected):
    # What a worker's conftest relies on: the parent's own table, or a new one whose mounts are
    # peers of the parent's (so what is mounted in it shows there too), is not private.
    script = ("from task_executor.sandbox import executor_namespace\n"
              "found = executor_namespace.recognise_inherited()\n"
              "assert executor_namespace.current() == found\n"
              "print(found.kind, found.reason, sep='|')\n")
    done = subprocess.run([*launcher, sys.executable, "-c", script], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    kind, reason = done.stdout.strip().split("|")
    assert kind == expected[0]
    assert reason.startswith(expected[1]), reason
