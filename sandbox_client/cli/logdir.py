"""Per-instance log directories, laid out as SWE-bench's harness lays out ``logs/run_evaluation``::

    <log_dir>/<run_id>/<model>/<instance_id>/
        report.json        {instance_id: {patch_is_None, patch_exists, patch_successfully_applied,
                           resolved, tests_status}}: only for an instance with a verdict, as in
                           the harness (its presence means "completed")
        test_output.txt    the whole test log as the executor returned it (asked for with
                           ``log_bytes``: a run longer than that keeps its head and tail); the
                           error, when there is no verdict
        patch.diff         the patch that was graded

``<model>`` is the prediction's ``model_name_or_path`` with ``/`` as ``__`` (``none`` if empty).
A re-graded instance's directory is replaced whole.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..protocol import TaskResult
from .swebench import Prediction

REPORT_FIELDS = (
    "patch_is_None", "patch_exists", "patch_successfully_applied", "resolved", "tests_status",
)


def model_dir_name(model_name_or_path: str) -> str:
    return (model_name_or_path or "none").replace("/", "__")


@dataclass(frozen=True)
class InstanceLogs:
    """Writes one directory per graded instance under ``root / run_id``."""

    root: Path
    run_id: str

    def directory(self, prediction: Prediction) -> Path:
        return (
            self.root / self.run_id / model_dir_name(prediction.model_name_or_path)
            / prediction.instance_id
        )

    def write(self, prediction: Prediction, entry: dict[str, Any], result: TaskResult) -> Path:
        where = self.directory(prediction)
        if where.exists():
            shutil.rmtree(where)
        where.mkdir(parents=True)
        (where / "patch.diff").write_text(prediction.model_patch or "", encoding="utf-8")
        output = result.log
        if result.status == "execution_error":
            output = f"[no verdict: {result.error_code}] {result.error}\n{output}"
        (where / "test_output.txt").write_text(output, encoding="utf-8")
        if entry["category"] in ("resolved", "unresolved"):
            report = {prediction.instance_id: {k: entry[k] for k in REPORT_FIELDS}}
            (where / "report.json").write_text(json.dumps(report, indent=2) + "\n", "utf-8")
        return where
