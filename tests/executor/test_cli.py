"""The entry points: ``python -m task_executor serve`` as a real process, its log and its flags."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import requests
from openapi_spec_validator import validate

from task_executor import __version__
from task_executor.cli import main
from task_executor.service.openapi import openapi_document


def test_serve_grades_and_logs_one_line_per_task(tmp_path, demo_task):
    base = tmp_path / "base"
    env = {**os.environ, "API_TOKEN": "from-env", "DOCKYARD_TASK_EXECUTOR_THREADS": "4"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port", "0",
         "--base-dir", str(base), "--token", "from-flag"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line
        url = line.strip().rsplit(" ", 1)[1]
        body = {**demo_task.request("logged-task", demo_task.gold_patch),
                "env": {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}}
        env_token = requests.post(url + "/task/submit", json=body, timeout=60,
                                  headers={"Authorization": "Bearer from-env"})
        assert env_token.status_code == 401  # the flag beats the environment
        answer = requests.post(url + "/task/submit", json=body, timeout=60,
                               headers={"Authorization": "Bearer from-flag"})
        assert answer.json()["status"] == "resolved"
        health = requests.get(url + "/health", timeout=5).json()
        # Four threads: one grading, one long session call, two kept for /health and the rest.
        assert (health["load"]["task_capacity"], health["load"]["exec_capacity"]) == (1, 1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        proc.stdout.close()
    log_file = base / "task_executor.log"
    assert log_file.stat().st_mode & 0o777 == 0o600  # it names every task and session
    log = log_file.read_text()
    task_lines = [line for line in log.splitlines() if "task logged-task" in line]
    assert len(task_lines) == 1
    assert "status=resolved" in task_lines[0] and "duration=" in task_lines[0]


def test_invalid_configuration_is_refused_with_a_message(capsys, monkeypatch):
    monkeypatch.setenv("DOCKYARD_TASK_EXECUTOR_THREADS", "many")
    assert main(["serve"]) == 2
    assert "DOCKYARD_TASK_EXECUTOR_THREADS='many'" in capsys.readouterr().err


def test_openapi_document_is_valid_openapi_31():
    document = openapi_document()
    validate(document)
    assert {"/task/submit", "/session/start", "/session/{session_id}/exec",
            "/session/{session_id}/file", "/session/{session_id}/finish"} <= set(document["paths"])


def test_version_names_the_program_as_dockyard_version_does():
    done = subprocess.run([sys.executable, "-m", "task_executor", "--version"],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, f"task-executor {__version__}\n")
