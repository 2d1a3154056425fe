"""``GET /metrics`` and request ids, against a real executor.

Metrics are read the way Prometheus reads them (the text format, parsed by prometheus-client's
own parser) and checked to move by exactly what the calls did.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from task_executor.service.metrics import ExecutorMetrics
from task_executor.service.requestlog import HEADER, RequestIdFilter, sanitize
from tests.conftest import FAST_PYTEST_ENV, RunningExecutor
from tests.executor.test_lifecycle import serving

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(executor: RunningExecutor) -> Samples:
    answer = executor.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["Content-Type"].startswith("text/plain")
    return parse(answer.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_need_the_token(executor_factory):
    executor = executor_factory(token="secret")
    assert requests.get(executor.url + "/metrics", timeout=30).status_code == 401
    assert executor.get("/metrics").status_code == 200


def test_metrics_move_with_gradings_sessions_and_commands(executor, demo_task):
    before = scrape(executor)
    gold = demo_task.request("metrics-gold", demo_task.gold_patch)
    gold = {**gold, "env": FAST_PYTEST_ENV}
    keyed = {"Idempotency-Key": "metrics-gold-1"}
    assert executor.post("/task/submit", json=gold, headers=keyed).json()["status"] == "resolved"
    retried = executor.post("/task/submit", json=gold, headers=keyed)  # replayed: not graded
    assert retried.json()["status"] == "resolved"
    assert executor.submit(demo_task.request("metrics-empty", "")).json()["status"] == "unresolved"

    session = executor.post(
        "/session/start",
        json={"repo": demo_task.repo, "base_commit": demo_task.base_commit,
              "env": FAST_PYTEST_ENV},
    ).json()["session_id"]
    during = scrape(executor)
    for command, timeout in [
        ("echo hello", None),
        ("sleep 30 & sleep 30", 0.5),  # times out; its process group is killed
        ("head -c 1000000 /dev/zero | tr '\\0' x", None),  # cut to head and tail
    ]:
        body = {"command": command, **({"timeout": timeout} if timeout else {})}
        assert executor.post(f"/session/{session}/exec", json=body).status_code == 200
    finished = executor.post(
        f"/session/{session}/finish",
        json={"test_patch": demo_task.test_patch, "fail_to_pass": demo_task.fail_to_pass,
              "pass_to_pass": demo_task.pass_to_pass},
    )
    assert finished.json()["result"]["status"] == "unresolved"
    after = scrape(executor)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("dockyard_tasks_total", status="resolved", source="submit") == 1
    assert moved("dockyard_tasks_total", status="unresolved", source="submit") == 1
    assert moved("dockyard_tasks_total", status="unresolved", source="finish") == 1
    assert moved("dockyard_grading_duration_seconds_count", source="submit") == 2
    assert moved("dockyard_grading_phase_duration_seconds_count", phase="tests") == 3
    assert moved("dockyard_session_commands_total") == 3
    assert moved("dockyard_session_command_timeouts_total") == 1
    assert moved("dockyard_session_truncated_outputs_total") == 1
    # The session's processes, swept at its finish (under bubblewrap a timed-out command's
    # processes die with its shell's PID namespace before the reaper looks).
    assert moved("dockyard_killed_process_groups_total") >= 1
    assert moved("dockyard_killed_processes_total") >= 1

    submit = {"method": "POST", "route": "/task/submit", "status": "200"}
    assert moved("dockyard_http_requests_total", **submit) == 3
    exec_route = {"method": "POST", "route": "/session/<session_id>/exec", "status": "200"}
    assert moved("dockyard_http_requests_total", **exec_route) == 3
    # Labels carry URL rules, never ids: one session must not add a label value of its own.
    assert not any(session in str(labels) for _, labels in after)

    assert value(during, "dockyard_sessions_live") == 1
    assert value(after, "dockyard_sessions_live") == 0
    assert value(after, "dockyard_session_capacity") == executor.settings.max_sessions
    assert value(after, "dockyard_task_capacity") == executor.settings.max_tasks
    assert value(after, "dockyard_tasks_running") == 0
    assert value(after, "dockyard_draining") == 0


def test_gradings_say_whether_their_template_was_built_or_reused(executor, demo_task):
    before = scrape(executor)
    results = [
        executor.submit(demo_task.request(task_id, demo_task.gold_patch)).json()
        for task_id in ("template-first", "template-second")
    ]
    after = scrape(executor)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert [r["template_hit"] for r in results] == [False, True]
    assert moved("dockyard_grading_templates_total", template="built", source="submit") == 1
    assert moved("dockyard_grading_templates_total", template="reused", source="submit") == 1
    assert moved("dockyard_template_builds_total") == 1


def test_unmatched_paths_share_one_label(executor):
    before = scrape(executor)
    for path in ("/nope/1", "/nope/2", "/session/x/y/z"):
        assert executor.get(path).status_code == 404
    after = scrape(executor)
    labels = {"method": "GET", "route": "unmatched", "status": "404"}
    assert value(after, "dockyard_http_requests_total", **labels) - value(
        before, "dockyard_http_requests_total", **labels
    ) == 3


class _Templates:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def stats(self) -> dict[str, int]:
        if self.fail:
            raise OSError("disk went away")
        return {"hits": 7, "misses": 2, "builds": 2, "disk_bytes": 4096, "templates": 2}


def _services(templates: object | None) -> SimpleNamespace:
    return SimpleNamespace(
        task_slots=SimpleNamespace(in_use=1, limit=4),
        exec_slots=SimpleNamespace(in_use=3, limit=5),
        sessions=SimpleNamespace(live=2, reclaiming=0),
        settings=SimpleNamespace(max_sessions=8),
        workspaces=SimpleNamespace(templates=templates),
    )


def test_template_cache_stats_are_reported_when_there_is_a_cache(caplog):
    with_cache = parse(ExecutorMetrics(_services(_Templates()), dict).exposition().decode())
    assert value(with_cache, "dockyard_template_cache_hits_total") == 7
    assert value(with_cache, "dockyard_template_cache_misses_total") == 2
    assert value(with_cache, "dockyard_template_builds_total") == 2
    assert value(with_cache, "dockyard_template_disk_bytes") == 4096
    assert value(with_cache, "dockyard_templates") == 2
    assert value(with_cache, "dockyard_tasks_running") == 1
    assert value(with_cache, "dockyard_execs_running") == 3
    assert value(with_cache, "dockyard_exec_capacity") == 5

    without = parse(ExecutorMetrics(_services(None), dict).exposition().decode())
    assert not any(name.startswith("dockyard_template") for name, _ in without)

    with caplog.at_level(logging.ERROR):
        failing = ExecutorMetrics(_services(_Templates(fail=True)), dict)
        broken = parse(failing.exposition().decode())
    assert value(broken, "dockyard_sessions_live") == 2  # the scrape survives a failing source
    assert "template cache stats failed" in caplog.text


# -- request ids --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "kept"),
    [("abc-123_X.y", True), ("a" * 128, True), ("a" * 129, False), ("", False),
     ("has space", False), ("new\nline", False), ("ünï", False), ("a/b", False)],
)
def test_request_id_sanitizing(raw, kept):
    assert (sanitize(raw) == raw) is kept


def test_request_id_round_trip_and_error_bodies(executor_factory):
    executor = executor_factory(token="secret")
    mine = executor.get("/health", headers={HEADER: "trainer-42.step-7"})
    assert mine.headers[HEADER] == "trainer-42.step-7"
    generated = executor.get("/health").headers[HEADER]
    replaced = executor.get("/health", headers={HEADER: "evil\tvalue"}).headers[HEADER]
    assert generated != replaced and len(generated) == len(replaced) == 32

    for answer in (
        requests.get(executor.url + "/metrics", headers={HEADER: "no-token"}, timeout=30),
        executor.get("/session/missing", headers={HEADER: "missing-session"}),
        executor.post("/task/submit", data=b"{", headers={HEADER: "bad-json"}),
        executor.get("/no/such/route", headers={HEADER: "no-route"}),
    ):
        assert answer.status_code >= 400
        assert answer.json()["error"]["request_id"] == answer.headers[HEADER]
        assert answer.headers[HEADER] in ("no-token", "missing-session", "bad-json", "no-route")


def test_request_id_is_in_every_log_line_of_its_request(tmp_path, demo_task):
    base = tmp_path / "base"
    with serving(base) as server:
        graded = requests.post(
            server.url + "/task/submit", timeout=120, headers={HEADER: "rid-graded"},
            json={**demo_task.request("logged-rid", demo_task.gold_patch), "env": FAST_PYTEST_ENV},
        )
        assert graded.json()["status"] == "resolved"
        missing = requests.get(
            server.url + "/session/nope", timeout=30, headers={HEADER: "rid-404"}
        )
        assert missing.json()["error"]["request_id"] == "rid-404"
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
    lines = Path(base / "task_executor.log").read_text().splitlines()
    graded_lines = [line for line in lines if "[rid-graded]" in line]
    assert any("task logged-rid status=resolved" in line for line in graded_lines)
    assert any("request POST /task/submit" in line and "status=200" in line
               for line in graded_lines)
    assert any("request GET /session/nope" in line and "status=404" in line
               for line in lines if "[rid-404]" in line)
    # Lines outside any request carry a dash, so the format is the same on every line.
    assert any("[-] serving on" in line for line in lines)


def test_exec_lines_are_logged_when_something_went_wrong(tmp_path, demo_task):
    # A successful command is counted by /metrics, not logged (agents run one every second or
    # so per session); a refused call, a timeout and a lost shell are logged.
    base = tmp_path / "base"
    with serving(base) as server:
        start = {"repo": demo_task.repo, "base_commit": demo_task.base_commit}
        sid = requests.post(server.url + "/session/start", json=start, timeout=60).json()[
            "session_id"]
        for command, timeout in [("echo fine", 30), ("sleep 30", 0.5), ("kill -9 $$", 30)]:
            answer = requests.post(f"{server.url}/session/{sid}/exec", timeout=60,
                                   json={"command": command, "timeout": timeout})
            assert answer.status_code == 200
        missing = requests.post(f"{server.url}/session/nope/exec", json={"command": "true"},
                                timeout=30)
        assert missing.status_code == 404
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
    lines = Path(base / "task_executor.log").read_text().splitlines()
    exec_requests = [line for line in lines if "request POST /session/" in line and "/exec" in line]
    assert len(exec_requests) == 1 and "/session/nope/exec" in exec_requests[0]
    assert "status=404" in exec_requests[0]
    assert any(f"session {sid}: command timed out after 0." in line for line in lines)
    assert any(f"session {sid}: shell killed by signal 9" in line for line in lines)


def test_request_id_filter_marks_lines_outside_requests():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "message", None, None)
    assert RequestIdFilter().filter(record) and record.request_id == "-"
