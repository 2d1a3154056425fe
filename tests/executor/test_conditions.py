"""Run conditions: reported by every grading, declared by a task, refused where not met.

Real executors on loopback, real sandboxed test runs; the conditions inside the sandbox are
compared with what the host says they must be (the sandbox sees the host's interpreter and time
zone read-only, its own /dev/shm of the configured size, root inside).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from sandbox_client import SandboxClient
from sandbox_client.errors import ExecutorRejected
from tests.client.conftest import ranked
from tests.conftest import FAST_PYTEST_ENV

MiB = 1024 * 1024
HOST_PYTHON = subprocess.run(
    ["/usr/bin/python3", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
    capture_output=True, text=True, check=False).stdout.strip()


def _named(message: str) -> set[str]:
    """The fields a conditions_mismatch message names."""
    return {part.split(":")[0].strip() for part in message.split(": ", 1)[1].split("; ")}


def _sandboxed(executor) -> bool:
    return executor.get("/health").json()["capabilities"]["sandbox"]["tool"] == "bwrap"


def test_a_grading_and_a_finish_report_what_their_tests_ran_under(executor, demo_task):
    if not _sandboxed(executor):
        pytest.skip("no bubblewrap sandbox here")
    mode = executor.get("/health").json()["capabilities"]["workspace_mode"]
    result = executor.submit(demo_task.request("gold", demo_task.gold_patch)).json()
    conditions = result["conditions"]
    assert conditions["python"] == HOST_PYTHON  # the task's python, not the executor's venv
    assert (conditions["uid"], conditions["gid"]) == (0, 0)  # root inside
    assert conditions["shm_bytes"] == executor.settings.shm_bytes  # its private /dev/shm
    assert conditions["cpus"] == len(os.sched_getaffinity(0))
    assert conditions["egress"] is False  # denied by default where the guard exists
    assert conditions["workspace_mode"] == mode
    assert conditions["timezone"]
    started = executor.post("/session/start", json={
        "repo": demo_task.repo, "base_commit": demo_task.base_commit, "env": FAST_PYTEST_ENV,
        "conditions": {"python": HOST_PYTHON.rsplit(".", 1)[0]}}).json()
    finished = executor.post(f"/session/{started['session_id']}/finish", json={
        "test_patch": demo_task.test_patch, "fail_to_pass": demo_task.fail_to_pass,
        "pass_to_pass": demo_task.pass_to_pass}).json()
    assert finished["result"]["status"] == "unresolved"
    assert finished["result"]["conditions"]["python"] == HOST_PYTHON


def test_conditions_an_executor_cannot_give_are_refused_with_409_naming_each(executor,
                                                                            demo_task):
    def refusal(conditions: dict) -> str:
        body = {**demo_task.request("needs-more", demo_task.gold_patch), "env": FAST_PYTEST_ENV,
                "conditions": conditions}
        answer = executor.post("/task/submit", json=body)
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"]["code"] == "conditions_mismatch"
        assert executor.work_dirs() == []  # nothing is left of the refused grading
        return answer.json()["error"]["message"]

    # Known before any work: refused at once. The interpreter is known once the template was
    # probed (the first grading's workspace, before any patch or test), then at once too.
    assert {"cpus", "timezone"} <= _named(refusal({"cpus": 4096, "timezone": "Mars/Base"}))
    assert _named(refusal({"python": "2.7"})) == {"python"}
    assert _named(refusal({"cpus": 4096, "timezone": "Mars/Base", "python": "2.7"})) == {
        "cpus", "timezone", "python"}
    started = executor.post("/session/start", json={
        "repo": demo_task.repo, "base_commit": demo_task.base_commit,
        "conditions": {"python": "2.7"}})
    assert started.status_code == 409 and "python: required" in started.text
    contradicting = {**demo_task.request("contradicts", ""), "deny_network": True,
                     "conditions": {"egress": True}}
    answer = executor.post("/task/submit", json=contradicting)
    assert answer.status_code == 422 and "egress" in answer.text


def test_the_client_sends_a_task_where_its_conditions_are_met(executor_factory, demo_task):
    small = executor_factory(shm_bytes=16 * MiB)
    if not _sandboxed(small):
        pytest.skip("no bubblewrap sandbox: /dev/shm is the host's everywhere")
    large = executor_factory(shm_bytes=64 * MiB)
    spec = ranked([small.url, large.url], {**demo_task.request("shm", demo_task.gold_patch),
                                           "env": FAST_PYTEST_ENV})
    trainer = {"env": {"code": {"sandbox_urls": [small.url, large.url],
                                "conditions": {"shm_bytes": 64 * MiB}}}}
    with SandboxClient(config=trainer) as client:
        result = client.run_task(spec)
        assert result.status == "resolved"
        assert result.conditions is not None and result.conditions.shm_bytes == 64 * MiB
        failed_over = client.fleet_status()
    assert failed_over[small.url].healthy  # refused, not ejected
    trainer["env"]["code"]["conditions"] = {"shm_bytes": 128 * MiB}
    with SandboxClient(config=trainer) as client, pytest.raises(ExecutorRejected) as refused:
        client.run_task(spec)
    assert (refused.value.status, refused.value.code) == (409, "conditions_mismatch")
