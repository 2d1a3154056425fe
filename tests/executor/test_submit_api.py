"""``POST /task/submit`` and the service around it: processes, bad input, capacity, auth."""

from __future__ import annotations

import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from task_executor.demo import diff_of, init_repo
from tests.conftest import FAST_PYTEST_ENV
from tests.processes import PROBE_VARIABLE, ProcessWatch


def _pids(pid_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in pid_dir.glob("*.pid") if p.read_text().strip()]


def _task_with_test(tmp_path: Path, test_body: str, name: str = "t") -> dict:
    repo = tmp_path / f"repo-{name}"
    base = init_repo(repo, {"mod.py": "X = 1\n"})
    test_patch = diff_of(repo, {"test_it.py": test_body})
    return {
        "task_id": name,
        "repo": str(repo),
        "base_commit": base,
        "test_patch": test_patch,
        "fail_to_pass": ["test_it.py::test_it"],
    }


def test_hanging_test_times_out_and_leaves_no_process(executor, tmp_path):
    token = uuid.uuid4().hex
    body = _task_with_test(
        tmp_path,
        (
            "import os, signal, subprocess, time\n"
            "def test_it():\n"
            "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "    subprocess.Popen(['bash', '-c', 'trap \"\" TERM; sleep 1000'])\n"
            "    time.sleep(1000)\n"
        ),
    )
    body["env"] = {**body.get("env", {}), PROBE_VARIABLE: token}
    started = time.monotonic()
    with ProcessWatch(token) as watch:
        result = executor.submit({**body, "timeout": 4}).json()
    assert time.monotonic() - started < 30
    assert result["status"] == "timeout"
    assert result["resolved"] is False
    assert result["error_code"] == "test_timeout"
    # pytest, the bash it started and that bash's sleep were all seen, and none is left
    assert len(watch.seen) >= 3
    assert watch.alive() == []
    assert executor.work_dirs() == []


def test_background_children_are_gone_after_the_task(executor, tmp_path):
    token = uuid.uuid4().hex
    body = _task_with_test(
        tmp_path,
        (
            "import subprocess\n"
            "def test_it():\n"
            "    subprocess.Popen(['bash', '-c', 'sleep 1000'])\n"
            # setsid leaves the process group and session: only the PID namespace holds it.
            "    subprocess.Popen(['setsid', 'bash', '-c', 'sleep 1000'], "
            "start_new_session=True)\n"
            "    import time; time.sleep(0.3)\n"
        ),
    )
    body["env"] = {**body.get("env", {}), PROBE_VARIABLE: token}
    with ProcessWatch(token) as watch:
        result = executor.submit(body).json()
    assert result["status"] == "resolved", result
    assert len(watch.seen) >= 3
    assert watch.alive() == []


def test_unittest_and_django_style_results(executor, tmp_path):
    repo = tmp_path / "repo"
    base = init_repo(repo, {"calc.py": "def add(a, b):\n    return a - b\n"})
    fix = diff_of(repo, {"calc.py": "def add(a, b):\n    return a + b\n"})
    tests = diff_of(
        repo,
        {
            "tests_calc.py": (
                "import unittest\nfrom calc import add\n\n"
                "class AddTests(unittest.TestCase):\n"
                "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
                "    def test_zero(self):\n        '''Adding zero changes nothing.'''\n"
                "        print('test_add (tests_calc.AddTests) ... ok')\n"
                "        self.assertEqual(add(0, 0), 0)\n"
            )
        },
    )
    body = {
        "task_id": "ut",
        "repo": str(repo),
        "base_commit": base,
        "test_patch": tests,
        "test_command": "python -m unittest -v tests_calc",
        "log_parser": "unittest",
        "fail_to_pass": ["test_add (tests_calc.AddTests)"],
        "pass_to_pass": ["Adding zero changes nothing.", "tests_calc.AddTests.test_zero"],
    }
    empty = executor.submit({**body, "patch": ""}).json()
    assert empty["status"] == "unresolved"
    assert empty["tests"]["test_add (tests_calc.AddTests)"] == "FAILED"
    assert empty["tests"]["Adding zero changes nothing."] == "PASSED"
    fixed = executor.submit({**body, "patch": fix}).json()
    assert fixed["status"] == "resolved", fixed["log"]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b"", 400, "empty_body"),
        (b"[]", 422, "validation_error"),
        (b'{"task_id": "x"}', 422, "validation_error"),
        (
            b'{"task_id": 5, "repo": [], "base_commit": "HEAD", "fail_to_pass": ["a"]}',
            422,
            "validation_error",
        ),
        (
            b'{"task_id": "x", "repo": "/r", "base_commit": "c", "fail_to_pass": "[1,"}',
            422,
            "validation_error",
        ),
        (
            b'{"task_id": "x", "repo": "/r", "base_commit": "c", "typo_field": 1}',
            422,
            "validation_error",
        ),
    ],
)
def test_malformed_requests_get_a_clear_4xx(executor, body, status, code):
    answer = executor.post("/task/submit", data=body)
    assert answer.status_code == status
    assert answer.json()["error"]["code"] == code
    assert answer.json()["error"]["message"]
    assert executor.work_dirs() == []


def test_unknown_repo_and_commit(executor, demo_task, tmp_path):
    missing = executor.submit({**demo_task.request("a", ""), "repo": str(tmp_path / "nope")})
    assert missing.status_code == 400
    assert missing.json()["error"]["code"] == "unknown_repo"
    relative = executor.submit({**demo_task.request("a", ""), "repo": "some/relative"})
    assert relative.status_code == 400
    commit = executor.submit({**demo_task.request("b", ""), "base_commit": "0" * 40})
    assert commit.status_code == 400
    assert commit.json()["error"]["code"] == "unknown_commit"
    option = executor.submit({**demo_task.request("c", ""), "base_commit": "--upload-pack=x"})
    assert option.json()["error"]["code"] == "unknown_commit"
    assert executor.work_dirs() == []


def test_no_required_tests_is_refused(executor, demo_task):
    answer = executor.submit({**demo_task.request("n", ""), "fail_to_pass": [], "pass_to_pass": []})
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "no_tests"


def test_swebench_field_names_and_json_encoded_lists(executor, demo_task):
    import json

    body = {
        "instance_id": "swe",
        "repo": demo_task.repo,
        "base_commit": demo_task.base_commit,
        "model_patch": demo_task.gold_patch,
        "test_patch": demo_task.test_patch,
        "FAIL_TO_PASS": json.dumps(demo_task.fail_to_pass),
        "PASS_TO_PASS": json.dumps(demo_task.pass_to_pass),
    }
    result = executor.submit(body).json()
    assert result["task_id"] == "swe"
    assert result["status"] == "resolved"


def test_oversized_body_is_413(executor):
    answer = executor.post("/task/submit", data=b"x" * (50 * 1024 * 1024))
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "request_entity_too_large"


def test_unknown_route_and_wrong_method_are_json(executor):
    missing = executor.get("/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    wrong = executor.get("/task/submit")
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"


def test_concurrent_tasks_on_the_same_repo(executor_factory, demo_task):
    # Eight gradings, one long session call, two threads kept for /health and short calls.
    executor = executor_factory(threads=11, max_concurrent_tasks=8)
    bodies = [demo_task.request(f"c{i}", demo_task.gold_patch if i % 2 else "") for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda b: executor.submit(b).json(), bodies))
    assert [r["status"] for r in results] == ["unresolved", "resolved"] * 4
    assert executor.work_dirs() == []


def test_token_is_required_except_for_health(executor_factory, demo_task):
    guarded = executor_factory(token="s3cret")
    assert requests.get(guarded.url + "/health", timeout=10).status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        answer = requests.post(guarded.url + "/task/submit", json={}, headers=headers, timeout=10)
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "unauthorized"
    assert requests.get(guarded.url + "/openapi.json", timeout=10).status_code == 401
    ok = guarded.submit(demo_task.request("auth", demo_task.gold_patch))
    assert ok.json()["status"] == "resolved"


def test_token_never_reaches_code_under_test(executor_factory, tmp_path):
    guarded = executor_factory(token="s3cret-token")
    os.environ["API_TOKEN"] = "s3cret-token"  # as if the executor had been configured this way
    try:
        body = _task_with_test(
            tmp_path,
            (
                "import os\n"
                "def test_it():\n"
                "    assert 's3cret-token' not in repr(dict(os.environ))\n"
            ),
        )
        assert guarded.submit(body).json()["status"] == "resolved"
    finally:
        del os.environ["API_TOKEN"]


def test_over_capacity_is_429_and_health_stays_fast(executor_factory, tmp_path):
    busy = executor_factory(threads=4)  # one grading, one session call, two threads kept spare
    body = _task_with_test(tmp_path, "import time\ndef test_it():\n    time.sleep(3)\n")
    first = threading.Thread(target=busy.submit, args=(body,))
    first.start()
    deadline = time.monotonic() + 10
    while busy.get("/health").json()["load"]["tasks_running"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    refused = busy.submit({**body, "task_id": "second"})
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "over_capacity"
    assert int(refused.headers["Retry-After"]) >= 1
    started = time.monotonic()
    assert busy.get("/health").status_code == 200
    assert time.monotonic() - started < 2
    first.join()


def test_only_a_retry_with_the_same_key_replays(
    executor_factory, demo_task, connection_counter, shared_dir
):
    """One Idempotency-Key is one call: its retry joins the grading (409 while it runs) and then
    gets the stored verdict; a different body under it is refused; no key grades afresh."""
    executor = executor_factory(deny_network=False)  # the test command checks in on the host
    counter, gate = connection_counter, shared_dir / "go"
    command = (f'python -c "{counter.snippet()}"; while [ ! -e {gate} ]; do sleep 0.05; done; '
               "python -m pytest -p no:cacheprovider tests/test_calc.py")
    body = {**demo_task.request("keyed", demo_task.gold_patch), "test_command": command,
            "env": dict(FAST_PYTEST_ENV)}
    key = {"Idempotency-Key": "call-1"}
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(executor.post, "/task/submit", json=body, headers=key)
        deadline = time.monotonic() + 60
        while counter.count < 1:  # the first grading is running its tests
            assert time.monotonic() < deadline and not first.done()
            time.sleep(0.05)
        joined = executor.post("/task/submit", json=body, headers=key)
        assert joined.status_code == 409 and joined.json()["error"]["code"] == "task_in_progress"
        assert int(joined.headers["Retry-After"]) >= 1
        reused = executor.post("/task/submit", json={**body, "patch": ""}, headers=key)
        assert reused.status_code == 422
        assert reused.json()["error"]["code"] == "idempotency_key_reused"
        gate.touch()
        graded = first.result()
    assert graded.json()["status"] == "resolved" and "Idempotent-Replayed" not in graded.headers
    replayed = executor.post("/task/submit", json=body, headers=key)
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert replayed.json() == graded.json()
    assert counter.count == 1  # neither the joined call nor the retry ran the tests
    fresh = executor.post("/task/submit", json=body)  # the same body, a new call: graded again
    assert fresh.json()["status"] == "resolved" and "Idempotent-Replayed" not in fresh.headers
    assert counter.count == 2
    bad = executor.post("/task/submit", json=body, headers={"Idempotency-Key": "a b"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_idempotency_key"


def test_openapi_document_describes_the_protocol(executor):
    document = executor.get("/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    schemas = document["components"]["schemas"]
    assert {"TaskSpec", "TaskResult", "ErrorResponse"} <= set(schemas)
    assert "/task/submit" in document["paths"]
    statuses = schemas["TaskResult"]["properties"]["status"]
    assert set(statuses["enum"]) == {
        "resolved",
        "unresolved",
        "patch_apply_failed",
        "timeout",
        "execution_error",
    }


def test_health_reports_mode_and_version(executor):
    health = executor.get("/health").json()
    assert health["status"] == "ok"
    from task_executor.sandbox.capabilities import detect

    caps = detect(executor.settings.base_dir, executor.settings.sandbox_uid)
    expected = ("overlay" if caps.overlay else "copy") if caps.mount_namespace else "git-clone"
    assert health["capabilities"]["workspace_mode"] == expected
    assert health["capabilities"]["egress_guard"] == caps.network_namespace
    assert health["version"]


def test_mirror_fetches_a_commit_made_after_it_was_cloned(executor, demo_task):
    from task_executor.demo import FIXED_FILES, commit_all, write_files

    first = executor.submit(demo_task.request("before", "")).json()
    assert first["status"] == "unresolved"
    repo = Path(demo_task.repo)
    write_files(repo, FIXED_FILES)
    fixed_commit = commit_all(repo, "fix upstream")
    later = executor.submit({**demo_task.request("after", ""), "base_commit": fixed_commit})
    assert later.json()["status"] == "resolved"
    mirrors = list((executor.settings.base_dir / "mirrors").glob("*.git"))
    assert len(mirrors) == 1  # cloned once, fetched on demand


def test_repo_as_a_git_url(executor, demo_task):
    body = {**demo_task.request("url", demo_task.gold_patch), "repo": f"file://{demo_task.repo}"}
    assert executor.submit(body).json()["status"] == "resolved"


def test_log_bytes_asks_for_the_whole_test_output_up_to_the_executors_cap(
    executor_factory, tmp_path
):
    """Without log_bytes the log is the 64 KiB tail (head and tail of the test run, the middle
    marked omitted); with it, all of a 200 KiB run; past DOCKYARD_MAX_LOG_BYTES, that cap."""
    executor = executor_factory(max_log_bytes=300 * 1024)
    test = (
        "def test_it():\n"
        "    for i in range(2000):\n"
        "        print(f'line {i:05d} ' + 'x' * 90)\n"
    )
    body = {**_task_with_test(tmp_path, test), "test_command": "python -m pytest -s test_it.py"}
    default = executor.submit({**body, "task_id": "default"}).json()
    full = executor.submit({**body, "task_id": "full", "log_bytes": 1024 * 1024}).json()
    capped = executor.submit({**body, "task_id": "capped", "log_bytes": 4096}).json()
    assert [r["status"] for r in (default, full, capped)] == ["resolved"] * 3
    assert "bytes omitted" in default["log"] and "line 00000 " in default["log"]
    assert "line 01000 " not in default["log"] and "line 01999 " in default["log"]
    assert "bytes omitted" not in full["log"]
    assert all(f"line {i:05d} " in full["log"] for i in range(2000))
    assert "bytes omitted" in capped["log"] and len(capped["log"]) < 4096 + 64 * 1024
    huge = executor.submit({**body, "task_id": "huge", "log_bytes": 10**9}).json()
    assert "bytes omitted" not in huge["log"]  # clamped to 300 KiB: still all of 200 KiB
    refused = executor.submit({**body, "task_id": "tiny", "log_bytes": 10})
    assert refused.status_code == 422 and "log_bytes" in refused.json()["error"]["message"]
