"""The grade report: SWE-bench field names, totals, resume rules, atomic writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sandbox_client.cli.report import GradeReport, instance_entry, write_json_atomic
from sandbox_client.cli.swebench import InputError, Prediction
from sandbox_client.protocol import TaskResult

RUN_FIELDS = {
    "total_instances",
    "submitted_instances",
    "completed_instances",
    "resolved_instances",
    "unresolved_instances",
    "empty_patch_instances",
    "error_instances",
    "completed_ids",
    "incomplete_ids",
    "submitted_ids",
    "resolved_ids",
    "unresolved_ids",
    "empty_patch_ids",
    "error_ids",
    "schema_version",
}


def result(task_id: str, status: str) -> TaskResult:
    return TaskResult.model_validate(
        {
            "task_id": task_id,
            "status": status,
            "resolved": {"resolved": True, "execution_error": None}.get(status, False),
            "patch_applied": status != "patch_apply_failed",
            "fail_to_pass": {"passed": ["t1"], "failed": ["t2"]},
            "pass_to_pass": {"passed": ["t3"], "failed": []},
        }
    )


def test_entry_fields() -> None:
    entry = instance_entry(Prediction("a", "diff", "m"), result("a", "unresolved"), 1)
    assert entry["patch_exists"] and entry["patch_successfully_applied"]
    assert entry["resolved"] is False and entry["category"] == "unresolved"
    assert entry["tests_status"] == {
        "FAIL_TO_PASS": {"success": ["t1"], "failure": ["t2"]},
        "PASS_TO_PASS": {"success": ["t3"], "failure": []},
    }
    empty = instance_entry(Prediction("b", None), None, 0)
    assert (empty["patch_is_None"], empty["patch_exists"], empty["category"]) == (
        True,
        False,
        "empty_patch",
    )


def test_totals_and_resume(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    preds = {i: Prediction(i, f"diff {i}") for i in "abcdef"}
    report = GradeReport(path, "abcdefghij", preds)
    statuses = {
        "a": "resolved",
        "b": "unresolved",
        "c": "timeout",
        "d": "patch_apply_failed",
        "e": "execution_error",
    }
    for iid, status in statuses.items():
        report.record(iid, instance_entry(preds[iid], result(iid, status), 1))
    data = json.loads(path.read_text())
    assert RUN_FIELDS <= set(data)
    assert (data["total_instances"], data["submitted_instances"]) == (10, 6)
    assert data["resolved_ids"] == ["a"] and data["unresolved_ids"] == ["b", "c", "d"]
    # As in SWE-bench: incomplete = no prediction; a prediction not graded (yet) is an error.
    assert data["incomplete_ids"] == ["g", "h", "i", "j"]
    assert data["error_ids"] == ["e", "f"] and data["ungraded_ids"] == ["f"]
    assert data["error_reasons"] == {"not_graded": 1, "unknown": 1}  # the result has no code
    assert data["completed_instances"] == 4

    again = GradeReport(path, "abcdefghij", preds)
    assert [again.is_done(p) for p in preds.values()] == [True] * 4 + [False, False]
    changed = Prediction("a", "a different patch")
    assert not again.is_done(changed)  # a new patch for the same instance is graded again


def test_unreadable_report_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("{half")
    with pytest.raises(InputError, match="unreadable"):
        GradeReport(path, ["a"], [])
    path.write_text("[]")
    with pytest.raises(InputError, match="not a dockyard grade report"):
        GradeReport(path, ["a"], [])


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "out" / "r.json"
    write_json_atomic(path, {"x": 1})
    write_json_atomic(path, {"x": 2})
    assert json.loads(path.read_text()) == {"x": 2}
    assert os.listdir(path.parent) == ["r.json"]

    class Boom:
        pass

    with pytest.raises(TypeError):
        write_json_atomic(path, {"x": Boom()})
    assert json.loads(path.read_text()) == {"x": 2}  # the old report survives a failed write
    assert os.listdir(path.parent) == ["r.json"]
