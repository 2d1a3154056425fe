"""Drain at exit in a real process: after SIGTERM and SIGINT, mid-create, and from ``atexit``.

Each test runs a child Python process that provisions against the stand-in served by the test,
signals it (or lets it end), and then checks on the stand-in that none of its pods is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path
from typing import IO

import pytest

pytest.importorskip("kubernetes")

from sandbox_client.provisioner.testing import Fault

from .conftest import NAMESPACE, Harness

ROOT = Path(__file__).resolve().parents[2]


def _env(harness: Harness, job: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        "DOCKYARD_JOB_ID": job,
        "DOCKYARD_K8S_NAMESPACE": NAMESPACE,
        "DOCKYARD_K8S_HOST": harness.server.url,
        "DOCKYARD_K8S_POLL_INTERVAL": "0.01",
        "POD_NAME": "trainer-0",
        "POD_UID": "trainer-uid-0",
    })
    return env


_STDERR: dict[int, IO[str]] = {}


def _spawn(harness: Harness, job: str, *args: str) -> subprocess.Popen[str]:
    # stderr goes to a file, not a pipe: the child logs every poll (every 10 ms here), and a
    # pipe nobody reads until the end fills up and blocks it mid-drain.
    log_file = tempfile.TemporaryFile(mode="w+")
    child = subprocess.Popen([sys.executable, *args], env=_env(harness, job), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=log_file, text=True)
    _STDERR[child.pid] = log_file
    return child


def _stderr(child: subprocess.Popen[str]) -> str:
    log_file = _STDERR.pop(child.pid)
    log_file.seek(0)
    text = log_file.read()
    log_file.close()
    return text


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_cli_drains_on_signal(harness: Harness, signum: int) -> None:
    job = f"cli-{signum}"
    child = _spawn(harness, job, "-m", "sandbox_client.provisioner.cli", "provision",
                   "--job", job, "--count", "3", "--rate", "100", "--json")
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert line.startswith("["), "no URLs printed"
        assert len(harness.job_pods(job)) == 3
        child.send_signal(signum)
        code = child.wait(30)
    finally:
        child.kill()
        child.communicate()
        err = _stderr(child)
    assert "signal" in err, err[-2000:]  # the unwind was logged (to a file: it cannot block)
    # SIGTERM exits 143 (SystemExit); an uncaught KeyboardInterrupt re-raises SIGINT at exit.
    assert code == (128 + signum if signum == signal.SIGTERM else -signal.SIGINT)
    assert harness.job_pods(job) == []


def test_sigterm_during_admission_settles_then_drains(harness: Harness) -> None:
    """SIGTERM arrives while the API holds a create: the drain waits for it, then deletes it."""
    job = "sigterm-admission"
    hold = threading.Event()
    harness.standin.inject(Fault("create", hold=hold))
    creates = harness.standin.count("create")
    script = textwrap.dedent("""
        from sandbox_client.provisioner import Provisioner, ProvisionerSettings
        with Provisioner(ProvisionerSettings.from_env()) as fleet:
            fleet.provision(1)
    """)
    child = _spawn(harness, job, "-c", script)
    try:
        assert harness.standin.wait_for("create", creates + 1, timeout=30)
        child.send_signal(signal.SIGTERM)
        threading.Timer(0.2, hold.set).start()  # admission ends after the signal
        code = child.wait(30)
    finally:
        child.kill()
        child.communicate()
        err = _stderr(child)
    assert code == 128 + signal.SIGTERM, err
    assert harness.job_pods(job) == []
    assert harness.standin.count("delete") >= 1


def test_atexit_drains_a_provisioner_left_open(harness: Harness) -> None:
    job = "atexit"
    script = textwrap.dedent("""
        from sandbox_client.provisioner import Provisioner, ProvisionerSettings
        fleet = Provisioner(ProvisionerSettings.from_env())
        print(len(fleet.provision(2)), flush=True)
    """)
    child = _spawn(harness, job, "-c", script)
    out, _ = child.communicate(timeout=30)
    err = _stderr(child)
    assert child.returncode == 0, err
    assert out.strip() == "2"
    assert harness.job_pods(job) == []
    assert harness.standin.high_water_by_job[job] == 2
