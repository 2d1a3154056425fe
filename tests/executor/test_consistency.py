"""The runner's summary line as the executor reads it, and the problems a run can have."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from task_executor.grading.consistency import RunEvidence, attribute, problems
from task_executor.grading.results import parse_report
from task_executor.grading.summary import pytest_summary, unittest_summary

REPORTER = Path(__file__).resolve().parents[2] / "task_executor" / "grading" / "reporter"


@pytest.mark.parametrize(("line", "failures"), [
    ("=================== 3 failed, 2 passed, 1 xfailed in 0.12s ===================", 3),
    ("2 failed, 1 error, 4 passed, 2 warnings in 1.50s", 3),
    ("=== 1 passed, 2 errors in 75.00s (0:01:15) ===", 2),
    ("==== 5 passed, 1 xpassed in 0.3 seconds ====", 0),
    ("\x1b[31m=== \x1b[31m\x1b[1m1 failed\x1b[0m in 0.01s\x1b[0m\x1b[31m ===\x1b[0m", 1),
    ("============================ no tests ran in 0.01s =============================", 0),
    ("== 1 failed, 2 subtests failed, 3 subtests passed in 0.1s ==", 3),
])
def test_pytest_summary_counts_failed_and_errored(line, failures):
    summary = pytest_summary(f"collected 5 items\n\nsome output\n{line}\n")
    assert summary is not None and summary.failures == failures


def test_the_last_pytest_summary_line_counts():
    output = "=== 9 failed in 1s ===\nprinted by a test\n==== 2 passed in 0.02s ====\n"
    assert pytest_summary(output).failures == 0
    assert pytest_summary("Ran 3 tests in 0.1s\n\nOK\n") is None


@pytest.mark.parametrize(("tail", "failures"), [
    ("OK", 0), ("OK (skipped=2)", 0), ("FAILED (failures=2, errors=1)", 3),
    ("FAILED (unexpected successes=1)", 1)])
def test_unittest_summary(tail, failures):
    summary = unittest_summary(f"..F\n{'-' * 70}\nRan 3 tests in 0.004s\n\n{tail}\n")
    assert summary is not None and summary.failures == failures


def test_a_real_pytest_run_is_consistent_and_its_forged_report_is_not(tmp_path):
    """The reporter and pytest's own summary, from a real run with the real plugin."""
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\ndef test_ok():\n    print('=== 7 failed in 0.1s ===')\n\n"
        "def test_bad():\n    assert 0\n\n@pytest.fixture\ndef broken():\n    raise OSError\n\n"
        "def test_setup_error(broken):\n    pass\n\n@pytest.mark.xfail\ndef test_xf():\n"
        "    assert 0\n")
    report = tmp_path / "report.jsonl"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPORTER), "PYTEST_PLUGINS":
           "dockyard_report", "DOCKYARD_REPORT_FILE": str(report),
           "DOCKYARD_REPORT_MODE": "pytest", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s",
                           "test_x.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    run = RunEvidence.of(parse_report(report.read_bytes()), proc.returncode, False, "pytest",
                         proc.stdout + proc.stderr)
    required = ["test_x.py::test_ok", "test_x.py::test_xf"]
    assert problems(run, required) == [], proc.stdout
    assert (run.summary.failures, run.report.failures_in_session) == (2, 2)
    forged = b"".join(
        json.dumps({**record, "outcome": "passed"}).encode() + b"\n"
        if record.get("kind") == "test" else json.dumps(record).encode() + b"\n"
        for record in map(json.loads, report.read_bytes().splitlines()))
    lie = RunEvidence.of(parse_report(forged), 0, False, "pytest", proc.stdout)
    assert "report_mismatch" in [p.code for p in problems(lie, required)]
    verdict = attribute(problems(lie, required), run, required)
    assert verdict.status == "unresolved"
