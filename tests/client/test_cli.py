"""``dockyard grade`` and ``dockyard preflight`` on files in tmp_path against live executors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sandbox_client.cli import main
from task_executor.demo import BASE_FILES, TEST_FILES, DemoTask, diff_of
from tests.executor.test_metrics import scrape

from .conftest import RawServer, demo_instance, ranked

FLAKY_TEST = (
    "import os\nimport socket\n\n\n"
    "def test_flaky():\n"
    "    # fails every other run: a counter on the host answers how many runs came before\n"
    "    port = int(os.environ['FLAKY_PORT'])\n"
    "    runs = int(socket.create_connection(('127.0.0.1', port)).recv(16))\n"
    "    assert runs % 2 == 0\n"
)


def write_lines(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def wrong_patch(demo: DemoTask) -> str:
    """Applies cleanly, fixes nothing."""
    source = BASE_FILES["calc/__init__.py"].replace("return a - b", "return a * b")
    return diff_of(Path(demo.repo), {"calc/__init__.py": source})


@pytest.fixture
def grade_files(tmp_path: Path, demo_task: DemoTask) -> tuple[Path, Path]:
    ids = ["gold", "empty", "wrong", "broken", "no-prediction"]
    instances = tmp_path / "instances.json"
    instances.write_text(json.dumps([demo_instance(demo_task, i) for i in ids]))
    broken = "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n"
    predictions = write_lines(
        tmp_path / "predictions.jsonl",
        [
            {"instance_id": "gold", "model_patch": demo_task.gold_patch, "model_name_or_path": "m"},
            {"instance_id": "empty", "model_patch": "", "model_name_or_path": "m"},
            {
                "instance_id": "wrong",
                "model_patch": wrong_patch(demo_task),
                "model_name_or_path": "m",
            },
            {"instance_id": "broken", "model_patch": broken, "model_name_or_path": "m"},
        ],
    )
    return instances, predictions


def grade_argv(files: tuple[Path, Path], report: Path, urls: str, *extra: str) -> list[str]:
    instances, predictions = files
    return [
        "grade",
        "--instances",
        str(instances),
        "--predictions",
        str(predictions),
        "--urls",
        urls,
        "--output",
        str(report),
        *extra,
    ]


def grade(files: tuple[Path, Path], report: Path, urls: str, *extra: str) -> int:
    return main(grade_argv(files, report, urls, *extra))


def test_grade_writes_a_swebench_report(
    grade_files: tuple[Path, Path],
    executor: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    report_path = tmp_path / "report.json"
    assert grade(grade_files, report_path, executor.url) == 0
    report = json.loads(report_path.read_text())
    assert (report["total_instances"], report["submitted_instances"]) == (5, 4)
    assert report["resolved_ids"] == ["gold"]
    assert report["unresolved_ids"] == ["broken", "wrong"]
    assert report["empty_patch_ids"] == ["empty"] and report["error_ids"] == []
    assert (report["completed_instances"], report["error_instances"]) == (3, 0)
    gold, wrong, broken = (report["instances"][i] for i in ("gold", "wrong", "broken"))
    assert gold["resolved"] and gold["patch_exists"] and gold["patch_successfully_applied"]
    assert set(gold["tests_status"]) == {"FAIL_TO_PASS", "PASS_TO_PASS"}
    assert wrong["tests_status"]["FAIL_TO_PASS"]["failure"]
    assert not broken["patch_successfully_applied"] and broken["status"] == "patch_apply_failed"
    out, err = capsys.readouterr()
    assert "resolved 1/4 (25.0%)" in out
    assert "grading 4/4 | resolved 1 unresolved 2 empty patch 1 error 0" in err


def test_grade_resumes_from_its_report(
    grade_files: tuple[Path, Path], executor: Any, tmp_path: Path, closed_port_url: str
) -> None:
    report_path = tmp_path / "report.json"
    assert grade(grade_files, report_path, executor.url) == 0
    first = json.loads(report_path.read_text())
    # Nothing left to do: a rerun against no executor at all still succeeds, unchanged.
    assert grade(grade_files, report_path, closed_port_url) == 0
    assert json.loads(report_path.read_text())["instances"] == first["instances"]
    # As if killed before "wrong" was saved: it is the only one to send, and with no executor
    # reachable the run stops before sending it (exit 2), the report keeping what it had...
    del first["instances"]["wrong"]
    report_path.write_text(json.dumps(first))
    assert grade(grade_files, report_path, closed_port_url, "--max-error-retries", "0") == 2
    assert json.loads(report_path.read_text()) == first
    # ...and only that one is sent again by the next run.
    assert grade(grade_files, report_path, executor.url) == 0
    assert json.loads(report_path.read_text())["unresolved_ids"] == ["broken", "wrong"]


def test_grade_gets_every_verdict_past_an_executor_that_dies_on_every_request(
    grade_files: tuple[Path, Path], executor: Any, hangup_server: RawServer, tmp_path: Path
) -> None:
    """The executor the instances' template ranks first takes the first request and dies on it
    (and on the /health asked next): it is ejected, and every instance is graded on the
    survivor at the first attempt."""
    report_path = tmp_path / "report.json"
    urls = f"{hangup_server.url},{executor.url}"
    instances = json.loads(grade_files[0].read_text())  # one template: same repo, commit, env
    env = ranked([hangup_server.url, executor.url], instances[0])["env"]
    grade_files[0].write_text(json.dumps([{**record, "env": env} for record in instances]))
    assert grade(grade_files, report_path, urls, "--workers", "1") == 0
    report = json.loads(report_path.read_text())
    assert report["error_ids"] == [] and report["resolved_ids"] == ["gold"]
    attempts = [e["attempts"] for e in report["instances"].values() if e["patch_exists"]]
    assert attempts == [1, 1, 1] and hangup_server.connections > 0


LENIENT_TESTS = (
    "import pytest\n\n\n"
    "def test_xfailed():\n"
    "    pytest.xfail('called by the code under test, not declared')\n\n\n"
    "def test_skipped():\n"
    "    pytest.skip('skipped at run time')\n"
)


def test_grade_rules_swebench_is_the_harness_and_strict_stays_the_default(
    demo_task: DemoTask, executor: Any, tmp_path: Path
) -> None:
    """The same gold patch: unresolved by Dockyard's rule (an xfail the test calls and a skip
    are no passes), resolved by SWE-bench's; an apply failure is SWE-bench's error."""
    lenient_file = {"tests/test_lenient.py": LENIENT_TESTS}
    test_patch = diff_of(Path(demo_task.repo), {**TEST_FILES, **lenient_file})
    lenient = demo_instance(
        demo_task, "lenient", test_patch=test_patch,
        FAIL_TO_PASS=json.dumps([*demo_task.fail_to_pass, "tests/test_lenient.py::test_xfailed"]),
        PASS_TO_PASS=json.dumps([*demo_task.pass_to_pass, "tests/test_lenient.py::test_skipped"]),
    )
    broken = "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n"
    instances = write_lines(tmp_path / "i.jsonl", [lenient, demo_instance(demo_task, "broken")])
    predictions = write_lines(tmp_path / "p.jsonl", [
        {"instance_id": "lenient", "model_patch": demo_task.gold_patch},
        {"instance_id": "broken", "model_patch": broken},
    ])
    report_path = tmp_path / "report.json"
    assert grade((instances, predictions), report_path, executor.url) == 0
    strict = json.loads(report_path.read_text())
    assert strict["unresolved_ids"] == ["broken", "lenient"] and strict["error_ids"] == []
    failed = strict["instances"]["lenient"]["tests_status"]
    assert failed["FAIL_TO_PASS"]["failure"] == ["tests/test_lenient.py::test_xfailed"]
    assert failed["PASS_TO_PASS"]["failure"] == ["tests/test_lenient.py::test_skipped"]

    # The same report file: entries made by other rules are graded again, not reused.
    files = (instances, predictions)
    assert grade(files, report_path, executor.url, "--rules", "swebench") == 1  # an error
    harness = json.loads(report_path.read_text())
    assert harness["resolved_ids"] == ["lenient"] and harness["error_ids"] == ["broken"]
    entry = harness["instances"]["lenient"]
    assert entry["rules"] == "swebench" and entry["status"] == "resolved"
    assert "tests/test_lenient.py::test_xfailed" in entry["tests_status"]["FAIL_TO_PASS"]["success"]
    assert "tests/test_lenient.py::test_skipped" in entry["tests_status"]["PASS_TO_PASS"]["success"]
    assert harness["instances"]["broken"]["status"] == "patch_apply_failed"


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing-instances", "no such file"),
        ("bad-json", "not valid JSON"),
        ("orphan-prediction", "predictions have no instance: ghost"),
        ("owner-name-repo", "--repo-root"),
    ],
)
def test_grade_input_errors_exit_2(
    case: str,
    message: str,
    grade_files: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    instances, predictions = grade_files
    if case == "missing-instances":
        instances = tmp_path / "absent.json"
    elif case == "bad-json":
        instances.write_text("[{")
    elif case == "orphan-prediction":
        write_lines(predictions, [{"instance_id": "ghost", "model_patch": "x"}])
    else:
        records = json.loads(instances.read_text())
        instances.write_text(json.dumps([{**r, "repo": "owner/name"} for r in records]))
    assert grade((instances, predictions), tmp_path / "r.json", "http://127.0.0.1:9") == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_preflight_flags_vacuous_flaky_and_errors(
    demo_task: DemoTask,
    executor_factory: Any,
    tmp_path: Path,
    connection_counter: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    executor = executor_factory(deny_network=False)  # the flaky test reaches a host counter
    counter = connection_counter
    repo = Path(demo_task.repo)
    flaky_patch = diff_of(repo, {**TEST_FILES, "tests/test_flaky.py": FLAKY_TEST})
    instances = [
        demo_instance(demo_task, "good"),
        # The reference fix does not fix anything.
        demo_instance(demo_task, "ref-fails", patch=wrong_patch(demo_task)),
        # FAIL_TO_PASS passes before any fix: every patch "resolves" it.
        demo_instance(demo_task, "empty-passes", FAIL_TO_PASS=json.dumps(demo_task.pass_to_pass)),
        # A test that fails every other run, whatever the patch.
        demo_instance(
            demo_task,
            "flaky",
            test_patch=flaky_patch,
            PASS_TO_PASS=json.dumps([*demo_task.pass_to_pass, "tests/test_flaky.py::test_flaky"]),
            env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "FLAKY_PORT": str(counter.port)},
        ),
        # Refused by the executor: no verdict, which is not evidence against the instance.
        demo_instance(demo_task, "no-repo", repo=str(tmp_path / "missing-repo")),
        # A required test the runner never reports: the task is broken, whatever the patch.
        demo_instance(demo_task, "broken", FAIL_TO_PASS=json.dumps(
            [*demo_task.fail_to_pass, "tests/test_calc.py::test_subtract"])),
    ]
    path = write_lines(tmp_path / "instances.jsonl", instances)
    allowlist, findings = tmp_path / "allow.txt", tmp_path / "preflight.json"
    code = main(
        [
            "preflight",
            "--instances",
            str(path),
            "--urls",
            executor.url,
            "--repeat",
            "2",
            "--workers",
            "1",
            "--allowlist",
            str(allowlist),
            "--output",
            str(findings),
        ]
    )
    assert code == 1
    assert allowlist.read_text() == "good\n"
    checks = {c["instance_id"]: c for c in json.loads(findings.read_text())["instances"]}
    verdicts = {iid: c["verdict"] for iid, c in checks.items()}
    assert verdicts == {
        "good": "ok",
        "ref-fails": "vacuous",
        "empty-passes": "vacuous",
        "flaky": "flaky",
        "no-repo": "error",
        "broken": "vacuous",
    }
    assert checks["ref-fails"]["flags"] == ["reference_fails"]
    assert checks["empty-passes"]["flags"] == ["empty_passes"]
    assert "flaky_reference" in checks["flaky"]["flags"]
    assert checks["flaky"]["flaky_tests"] == ["tests/test_flaky.py::test_flaky"]
    assert "unknown_repo" in checks["no-repo"]["errors"][0]
    assert checks["broken"]["flags"] == ["task_broken (test_ids_not_found)"]
    # What the instance was checked under (egress allowed on this executor), recorded once.
    [conditions] = checks["good"]["conditions"]
    assert conditions["egress"] is True and conditions["python"] and conditions["workspace_mode"]
    out = capsys.readouterr().out
    assert "1 ok, 3 vacuous, 1 flaky, 1 error" in out


def test_preflight_twice_grades_every_repeat_both_times(
    demo_task: DemoTask, process_executors: Any, tmp_path: Path
) -> None:
    """A byte-identical grading is not a retry: a second preflight must run the tests again,
    or it could never find a flaky test (nor could a regrade after a deleted report)."""
    (worker,) = process_executors(1)
    path = write_lines(tmp_path / "i.jsonl", [demo_instance(demo_task, "twice")])
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "sandbox_client", "preflight", "--instances", str(path),
               "--urls", worker.url, "--repeat", "1", "--allowlist", str(tmp_path / "allow.txt")]
    for _ in range(2):
        run = subprocess.run(command, cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
    log = (tmp_path / "fleet" / f"worker-{worker.index}" / "task_executor.log").read_text()
    graded = Counter(re.findall(r"task (twice@\S+) status=", log))
    assert graded == {"twice@preflight-reference-0": 2, "twice@preflight-empty-0": 2}


def test_preflight_stops_after_one_grading_per_repository_when_every_repository_is_unknown(
    executor: Any, demo_task: DemoTask, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong --repo-root fails fast, as in ``dockyard grade``: the reference of each of the two
    repositories' first instance is graded, the other 2 x 2 x 3 - 2 gradings are never sent."""
    instances = [demo_instance(demo_task, f"{repo}-{n}", repo=f"owner/{repo}")
                 for repo in ("one", "two") for n in range(3)]
    path = write_lines(tmp_path / "i.jsonl", instances)
    before = submits(executor)
    status = main(["preflight", "--instances", str(path), "--urls", executor.url,
                   "--repeat", "2", "--repo-root", str(tmp_path / "no-such-root"),
                   "--allowlist", str(tmp_path / "allow.txt")])
    err = capsys.readouterr().err
    assert status == 2
    assert "every instance's repository is unknown to the executors" in err
    assert "--repo-root" in err
    assert submits(executor) - before == 2
    assert not (tmp_path / "allow.txt").exists()


def submits(executor: Any) -> float:
    """``POST /task/submit`` calls the executor answered, whatever the status."""
    return sum(count for (name, labels), count in scrape(executor).items()
               if name == "dockyard_http_requests_total"
               and ("route", "/task/submit") in labels)


def test_preflight_with_a_refused_token_sends_no_task(
    executor_factory: Any, demo_task: DemoTask, tmp_path: Path,
    capsys: pytest.CaptureFixture[str]
) -> None:
    guarded = executor_factory(token="right")
    path = write_lines(tmp_path / "i.jsonl", [demo_instance(demo_task, "a")])
    status = main(["preflight", "--instances", str(path), "--urls", guarded.url,
                   "--token", "wrong", "--allowlist", str(tmp_path / "allow.txt")])
    err = capsys.readouterr().err
    assert status == 2
    assert "executors refused the token (401 unauthorized)" in err


def test_preflight_needs_reference_patches(
    demo_task: DemoTask, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_lines(tmp_path / "i.jsonl", [demo_instance(demo_task, "a", patch="")])
    assert main(["preflight", "--instances", str(path), "--urls", "http://127.0.0.1:9"]) == 2
    assert "no reference patch: a" in capsys.readouterr().err


def test_grade_killed_mid_run_loses_nothing(
    demo_task: DemoTask, executor: Any, tmp_path: Path
) -> None:
    slow = "sleep 0.5; python -m pytest -p no:cacheprovider tests/test_calc.py"
    ids = [f"slow-{i}" for i in range(4)]
    instances = write_lines(
        tmp_path / "i.jsonl", [demo_instance(demo_task, i, test_command=slow) for i in ids]
    )
    predictions = write_lines(
        tmp_path / "p.jsonl", [{"instance_id": i, "model_patch": demo_task.gold_patch} for i in ids]
    )
    report = tmp_path / "report.json"
    files = (instances, predictions)
    argv = grade_argv(files, report, executor.url, "--workers", "1")
    command = [sys.executable, "-m", "sandbox_client", *argv]
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    with subprocess.Popen(command, cwd=root, env=env, stderr=subprocess.DEVNULL) as run:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if report.exists() and json.loads(report.read_text())["instances"]:
                break
            time.sleep(0.05)
        run.send_signal(signal.SIGKILL)
    saved = json.loads(report.read_text())["instances"]  # whole, valid JSON after the kill
    assert 1 <= len(saved) < 4
    assert grade(files, report, executor.url) == 0
    final = json.loads(report.read_text())
    assert final["resolved_ids"] == ids
    assert all(final["instances"][i] == entry for i, entry in saved.items())  # not re-graded
