"""SWE-bench records that carry Dockyard's ``task_id`` beside SWE-bench's ``instance_id``
(issue #25): equal is one id; different, ``task_id`` is what Dockyard grades under and
``instance_id`` stays the key of predictions and the report. Never an error that stops a run."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from sandbox_client.cli import main
from sandbox_client.cli.swebench import RepoMapper, load_instances, task_spec
from task_executor.demo import DemoTask

from .conftest import demo_instance

# The shape of a SWE-bench (Lite / Verified) test-split record, as the datasets ship it.
SWEBENCH_FIELDS: dict[str, Any] = {
    "problem_statement": "add() subtracts\n\nadd(2, 3) returns -1.",
    "hints_text": "",
    "created_at": "2019-02-26T01:47:14Z",
    "version": "3.0",
    "environment_setup_commit": "419a78300f7cd27611196e1e464d50fd0385ff27",
}


def record(demo: DemoTask, instance_id: str, **ids: str) -> dict[str, Any]:
    return {**demo_instance(demo, instance_id), **SWEBENCH_FIELDS, **ids}


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_record_with_both_ids_loads_and_grades_under_its_task_id(
    tmp_path: Path, demo_task: DemoTask
) -> None:
    records = [
        record(demo_task, "demo__calc-1", task_id="run7/demo__calc-1/sample-3"),
        record(demo_task, "demo__calc-2", task_id="demo__calc-2"),
        record(demo_task, "demo__calc-3"),
    ]
    instances = load_instances(write_jsonl(tmp_path / "instances.jsonl", records))
    assert list(instances) == ["demo__calc-1", "demo__calc-2", "demo__calc-3"]
    specs = [task_spec(inst, "", RepoMapper()) for inst in instances.values()]
    assert [s.task_id for s in specs] == ["run7/demo__calc-1/sample-3", "demo__calc-2",
                                          "demo__calc-3"]
    # An explicit id (preflight's per-repeat ids) still wins over the record's.
    assert task_spec(instances["demo__calc-1"], "", RepoMapper(), task_id="x").task_id == "x"


def test_grade_keys_the_report_by_instance_id_and_sends_the_task_id(
    tmp_path: Path, demo_task: DemoTask, executor: Any, caplog: pytest.LogCaptureFixture
) -> None:
    instances = tmp_path / "instances.json"
    instances.write_text(json.dumps([
        record(demo_task, "demo__calc-1", task_id="rollout-17"),
        record(demo_task, "demo__calc-2", task_id="demo__calc-2"),
    ]))
    predictions = write_jsonl(tmp_path / "predictions.jsonl", [
        {"instance_id": "demo__calc-1", "model_patch": demo_task.gold_patch,
         "model_name_or_path": "m"},
        {"instance_id": "demo__calc-2", "model_patch": demo_task.gold_patch,
         "model_name_or_path": "m"},
    ])
    report_path = tmp_path / "report.json"
    caplog.set_level(logging.INFO, logger="sandbox_client.client")
    assert main(["grade", "--instances", str(instances), "--predictions", str(predictions),
                 "--urls", executor.url, "--output", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert report["resolved_ids"] == ["demo__calc-1", "demo__calc-2"]
    assert report["error_ids"] == []
    graded = sorted(rec.args[0] for rec in caplog.records
                    if rec.msg.startswith("task %s: %s in"))
    assert graded == ["demo__calc-2", "rollout-17"]
