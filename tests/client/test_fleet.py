"""``dockyard fleet up`` as a real subprocess: executors start, answer, grade, and all stop on a
signal with no process left behind; ``fleet reap`` reports a missing [k8s] extra clearly."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox_client import SandboxClient, run_task_safe
from sandbox_client.cli import main
from sandbox_client.protocol import TaskResult
from task_executor.demo import DemoTask
from tests.processes import alive

from .conftest import FAST_ENV

ROOT = Path(__file__).resolve().parents[2]
MARKER = "37.125"  # a sleep no other process on the machine runs (+ the signal: one per case)


def processes_running(fragment: str) -> list[int]:
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if fragment in cmdline and str(os.getpid()) != entry.name:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_fleet_up_serves_and_stops_cleanly(
    stop_signal: signal.Signals, demo_task: DemoTask, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    stderr = (tmp_path / "fleet.err").open("w")
    fleet = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandbox_client",
            "fleet",
            "up",
            "--workers",
            "2",
            "--base-port",
            "0",
            "--base-dir",
            str(tmp_path / "fleet"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    try:
        lines = lines_until_urls(fleet)
        urls = lines[-1].strip().split("=", 1)[1].split(",")
        pids = [int(p) for p in re.findall(r"pid (\d+)", "".join(lines))]
        assert len(urls) == 2 and len(pids) == 2

        results: list[TaskResult] = []
        with SandboxClient(urls) as client:
            sandboxes = [client.health(url).capabilities.sandbox for url in urls]
            uids = {sandbox.sandbox_uid for sandbox in sandboxes if sandbox is not None}
            assert None in uids or len(uids) == 2  # co-hosted sandboxes never share a uid
            for i in range(2):
                task = {**demo_task.request(f"f{i}", demo_task.gold_patch), "env": FAST_ENV}
                assert client.run_task(task).status == "resolved"
            # A grading still running when the fleet stops must not outlive it.
            # One per case: a case's leftovers never count in the other.
            marker = f"sleep {MARKER}{int(stop_signal)}"
            slow = {**demo_task.request("slow", ""), "test_command": marker}
            runner = threading.Thread(target=lambda: results.append(run_task_safe(slow, client)))
            runner.start()
            # A guard, not a budget: on a loaded machine the grading may take long to get there.
            deadline = time.monotonic() + 600
            while not processes_running(marker) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert processes_running(marker)

            fleet.send_signal(stop_signal)
            assert fleet.wait(timeout=30) == 0
            runner.join(timeout=30)
        assert results and results[0].status == "execution_error"
        assert not any(alive(pid) for pid in pids)
        assert processes_running(marker) == []
        assert "stopping" in (tmp_path / "fleet.err").read_text()
    finally:
        if fleet.poll() is None:
            fleet.kill()
        fleet.wait()
        fleet.stdout.close()  # type: ignore[union-attr]
        stderr.close()


def lines_until_urls(fleet: subprocess.Popen[str]) -> list[str]:
    """What ``fleet up`` printed, up to its ``DOCKYARD_SANDBOX_URLS=`` line."""
    assert fleet.stdout is not None
    lines = []
    for line in fleet.stdout:
        lines.append(line)
        if line.startswith("DOCKYARD_SANDBOX_URLS="):
            break
    return lines


def test_a_fleet_killed_outright_takes_its_executors_along(tmp_path: Path) -> None:
    # SIGKILL gives `fleet up` no chance to stop its workers: the kernel must (parent death).
    fleet = subprocess.Popen(
        [sys.executable, "-m", "sandbox_client", "fleet", "up", "--workers", "1",
         "--base-port", "0", "--base-dir", str(tmp_path / "fleet")],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )
    lines = lines_until_urls(fleet)
    (worker,) = [int(p) for p in re.findall(r"pid (\d+)", "".join(lines))]
    try:
        fleet.kill()
        fleet.wait()
        deadline = time.monotonic() + 120  # a guard: it drains and exits on its SIGTERM
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(worker)
    finally:
        if alive(worker):
            os.kill(worker, signal.SIGKILL)
        fleet.stdout.close()


def run_fleet(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandbox_client", "fleet", "up", "--workers", "2", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_fleet_up_reports_an_executor_that_exits(tmp_path: Path) -> None:
    result = run_fleet("--base-port", "0", "--base-dir", str(tmp_path), "--threads", "-1")
    assert result.returncode == 1
    assert re.search(r"executor \d exited with status 2", result.stderr)
    assert "threads must be at least 4" in result.stderr  # the executor's own words
    assert "DOCKYARD_SANDBOX_URLS" not in result.stdout


def test_fleet_up_reports_an_unusable_base_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run_fleet("--base-port", "0", "--base-dir", str(blocker / "x"))
    assert result.returncode == 1
    assert "cannot start executor 0" in result.stderr


def test_fleet_reap_without_kubernetes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # as if the [k8s] extra were absent
    assert main(["fleet", "reap", "--job", "run-1"]) == 2
    assert "pip install 'dockyard[k8s]'" in capsys.readouterr().err


def test_fleet_reap_calls_the_provisioner(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sandbox_client.provisioner as provisioner

    calls: list[tuple[str, dict[str, Any]]] = []

    def fake_reap(job: str, **kwargs: Any) -> Any:
        calls.append((job, kwargs))
        return provisioner.ReapReport(deleted=3, left=0)

    monkeypatch.setattr(provisioner, "reap", fake_reap)
    assert main(["fleet", "reap", "--job", "run-1", "--namespace", "ml"]) == 0
    assert calls == [("run-1", {"namespace": "ml"})]
    assert "3 pods deleted, 0 left" in capsys.readouterr().out


def _two_adjacent_listeners() -> tuple[socket.socket, socket.socket]:
    """Listening sockets on ports P and P + 1, both ours: a port merely believed free can be
    taken by another test's executor meanwhile (CI saw "ports P-1, P" for "port P")."""
    for _ in range(100):
        first = socket.create_server(("127.0.0.1", 0))
        try:
            second = socket.create_server(("127.0.0.1", first.getsockname()[1] + 1))
        except OSError:
            first.close()
            continue
        return first, second
    raise AssertionError("no two adjacent free ports on 127.0.0.1")


def test_fleet_up_on_a_busy_port_is_one_line_and_exit_2(tmp_path: Path) -> None:
    first, second = _two_adjacent_listeners()
    with first, second:
        port = first.getsockname()[1]
        result = run_fleet("--base-port", str(port), "--base-dir", str(tmp_path / "fleet"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"dockyard fleet: ports {port}, {port + 1} on 127.0.0.1 already in use (another fleet "
        "or executor?); stop it, or pick --base-port (0: any free ports)"
    ]
    assert not (tmp_path / "fleet").exists()  # refused before anything started


def test_fleet_up_keeps_its_base_dir_in_the_cache_and_nothing_in_tmp(
    demo_task: DemoTask, tmp_path: Path
) -> None:
    """Default base dir: $XDG_CACHE_HOME/dockyard/fleet, the same on every run (a mirror made by
    the first run is there for the second); TMPDIR gets nothing."""
    cache, scratch = tmp_path / "cache", tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(cache),
           "TMPDIR": str(scratch)}
    base = cache / "dockyard" / "fleet"
    for run in range(2):
        fleet = subprocess.Popen(
            [sys.executable, "-m", "sandbox_client", "fleet", "up", "--workers", "1",
             "--base-port", "0"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        try:
            lines = lines_until_urls(fleet)
            assert f"log {base}/worker-0.log" in lines[0]
            url = lines[-1].strip().split("=", 1)[1]
            with SandboxClient(url) as client:
                task = {**demo_task.request(f"run-{run}", demo_task.gold_patch), "env": FAST_ENV}
                assert client.run_task(task).status == "resolved"
            mirrors = sorted(p.name for p in (base / "worker-0" / "mirrors").iterdir())
            if run == 0:
                first_mirrors = mirrors
            else:
                assert mirrors == first_mirrors  # the same mirror, kept between runs
            fleet.send_signal(signal.SIGTERM)
            assert fleet.wait(timeout=60) == 0
        finally:
            if fleet.poll() is None:
                fleet.kill()
            fleet.wait()
            fleet.stdout.close()  # type: ignore[union-attr]
    assert list(scratch.iterdir()) == []


def test_default_base_dir_for_root_avoids_a_home_the_sandbox_cannot_pass(tmp_path: Path) -> None:
    from sandbox_client.cli.fleet import ROOT_CACHE, default_base_dir

    closed, opened = tmp_path / "closed-home", tmp_path / "open-home"
    closed.mkdir(mode=0o700)
    opened.mkdir(mode=0o711)
    assert default_base_dir({"XDG_CACHE_HOME": "/x/cache"}, euid=1000) == Path(
        "/x/cache/dockyard/fleet")
    assert default_base_dir({"HOME": str(opened)}, euid=0) == opened / ".cache/dockyard/fleet"
    assert default_base_dir({"HOME": str(closed)}, euid=0) == ROOT_CACHE
    assert default_base_dir({"HOME": str(closed)}, euid=1000) == closed / ".cache/dockyard/fleet"


def test_each_worker_gets_a_sandbox_uid_of_its_own_and_the_fleet_dir_hidden(
    tmp_path: Path,
) -> None:
    from sandbox_client.cli.fleet import worker_environment

    fleet = tmp_path / "fleet"
    first, third = worker_environment(0, fleet, {}), worker_environment(2, fleet, {})
    assert (first["DOCKYARD_SANDBOX_UID"], third["DOCKYARD_SANDBOX_UID"]) == ("64000", "64002")
    assert first["DOCKYARD_HIDE_PATHS"] == str(fleet)
    given = worker_environment(1, fleet, {"DOCKYARD_SANDBOX_UID": "50000",
                                          "DOCKYARD_HIDE_PATHS": "/srv/data"})
    assert given["DOCKYARD_SANDBOX_UID"] == "50001"
    assert given["DOCKYARD_HIDE_PATHS"] == f"/srv/data:{fleet}"  # the operator's kept


def test_a_fleet_splits_the_host_share_its_workspaces_may_use(tmp_path: Path) -> None:
    """N executors on one host, each promising its workspaces 80% of the host together, would
    promise N x 80%: each gets 0.8 / N, and an operator's own share is kept."""
    from sandbox_client.cli.fleet import worker_environment

    fleet = tmp_path / "fleet"
    assert worker_environment(0, fleet, {}, workers=4)["DOCKYARD_HOST_SHARE"] == "0.2000"
    assert worker_environment(0, fleet, {})["DOCKYARD_HOST_SHARE"] == "0.8000"
    assert worker_environment(3, fleet, {"DOCKYARD_HOST_SHARE": "0.5"}, workers=4)[
        "DOCKYARD_HOST_SHARE"] == "0.5"
    from task_executor.config import settings_from_env
    from task_executor.sandbox import host_budget

    settings = settings_from_env({"DOCKYARD_HOST_SHARE": "0.2", "TASK_BASE_DIR": str(tmp_path)})
    whole, part = host_budget.default_memory_bytes(), host_budget.default_memory_bytes(0.2)
    assert settings.host_share == 0.2 and whole is not None and part is not None
    assert abs(part - whole / 4) <= 1  # 0.2 of the host against 0.8 of it


def test_fleet_up_with_a_sandbox_uid_that_is_no_number_is_one_line_and_exit_2(
    tmp_path: Path,
) -> None:
    result = run_fleet("--base-port", "0", "--base-dir", str(tmp_path / "fleet"),
                       DOCKYARD_SANDBOX_UID="many")
    assert result.returncode == 2, result.stderr
    assert "DOCKYARD_SANDBOX_UID" in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "fleet").exists()  # refused before anything was made
