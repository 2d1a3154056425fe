"""The ``dockyard grade`` report: SWE-bench's field names, written atomically after every instance.

Layout (one JSON object)::

    {
      "schema_version": 2,
      "total_instances": ..., "submitted_instances": ..., "completed_instances": ...,
      "resolved_instances": ..., "unresolved_instances": ..., "empty_patch_instances": ...,
      "error_instances": ...,
      "completed_ids": [...], "incomplete_ids": [...], "submitted_ids": [...],
      "resolved_ids": [...], "unresolved_ids": [...], "empty_patch_ids": [...], "error_ids": [...],
      "ungraded_ids": [...], "error_reasons": {"<error_code>": n, ...},
      "run": {"executors": [...], "run_id": ..., "log_dir": ..., "updated_at": ...},
      "instances": {"<instance_id>": {patch_exists, patch_successfully_applied, resolved,
                                      tests_status: {FAIL_TO_PASS: {success, failure},
                                                     PASS_TO_PASS: {success, failure}},
                                      status, error, attempts, duration_s, ...}}
    }

As in SWE-bench's run report: ``incomplete_ids`` are the instances without a prediction,
"completed" means a verdict (resolved or unresolved; ``timeout`` and ``patch_apply_failed`` are
unresolved; under ``--rules swebench``: errors, where the harness puts them), and ``error`` means a
prediction with no verdict: graded without one after every retry, or not graded (yet:
``ungraded_ids``, Dockyard's, lists those). A rerun with the same report file skips instances that
have a verdict for the same patch under the same rules, so a killed run loses at most the
instances that were in flight.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..protocol import TaskResult
from .swebench import InputError, Prediction

SCHEMA_VERSION = 2
CATEGORIES = ("resolved", "unresolved", "empty_patch", "error")


def patch_digest(patch: str | None) -> str:
    return hashlib.sha256((patch or "").encode()).hexdigest()


def category_of(result: TaskResult) -> str:
    """``error`` when grading gave no verdict (or, by SWE-bench's rules, the patch did not apply
    or the tests timed out), else ``resolved`` or ``unresolved``."""
    if result.status == "execution_error":
        return "error"
    if result.rules == "swebench" and result.status in ("patch_apply_failed", "timeout"):
        return "error"
    return "resolved" if result.resolved else "unresolved"


def instance_entry(
    prediction: Prediction, result: TaskResult | None, attempts: int, rules: str = "strict"
) -> dict:
    """One instance's report; ``result`` is None for an empty patch (not graded)."""
    entry: dict[str, Any] = {
        "rules": result.rules if result is not None else rules,
        "model_name_or_path": prediction.model_name_or_path,
        "patch_is_None": prediction.model_patch is None,
        "patch_exists": not prediction.is_empty,
        "patch_sha256": patch_digest(prediction.model_patch),
    }
    if result is None:
        return {
            **entry,
            "category": "empty_patch",
            "status": "empty_patch",
            "patch_successfully_applied": False,
            "resolved": False,
            "tests_status": _tests_status([], [], [], []),
            "attempts": 0,
        }
    category = category_of(result)
    return {
        **entry,
        "category": category,
        "status": result.status,
        "patch_successfully_applied": result.patch_applied,
        "resolved": result.resolved is True,
        "tests_status": _tests_status(
            result.fail_to_pass.passed,
            result.fail_to_pass.failed,
            result.pass_to_pass.passed,
            result.pass_to_pass.failed,
        ),
        "excluded_files": result.excluded_files,
        "error": result.error,
        "error_code": result.error_code,
        "attempts": attempts,
        "duration_s": round(result.duration_s, 3),
        "log_tail": result.log[-2000:] if category != "resolved" else "",
    }


def _tests_status(f2p_ok: list, f2p_bad: list, p2p_ok: list, p2p_bad: list) -> dict:
    return {
        "FAIL_TO_PASS": {"success": list(f2p_ok), "failure": list(f2p_bad)},
        "PASS_TO_PASS": {"success": list(p2p_ok), "failure": list(p2p_bad)},
    }


class GradeReport:
    """Per-instance entries plus run totals; thread-safe; saved on every ``record``. ``run``
    (run_id, log_dir ...) is kept under the report's ``run``."""

    def __init__(
        self,
        path: Path | None,
        instance_ids: Iterable[str],
        submitted_ids: Iterable[str],
        executors: Iterable[str] = (),
        run: dict[str, Any] | None = None,
    ) -> None:
        self.path = path
        self.instance_ids = sorted(instance_ids)
        self.total_instances = len(self.instance_ids)
        self.submitted_ids = sorted(submitted_ids)
        self.executors = list(executors)
        self.run = dict(run or {})
        self.instances: dict[str, dict] = {}
        self._lock = threading.Lock()
        if path is not None and path.exists():
            # Entries of instances no longer predicted are dropped: the report describes this run.
            wanted = set(self.submitted_ids)
            self.instances = {
                iid: entry for iid, entry in _read_entries(path).items() if iid in wanted
            }

    def is_done(self, prediction: Prediction, rules: str = "strict") -> bool:
        """A verdict (or an empty patch) is already recorded for this very patch and rules."""
        entry = self.instances.get(prediction.instance_id)
        return (
            entry is not None
            and entry.get("category") != "error"
            and entry.get("patch_sha256") == patch_digest(prediction.model_patch)
            and entry.get("rules", "strict") == rules
        )

    def record(self, instance_id: str, entry: dict) -> None:
        with self._lock:
            self.instances[instance_id] = entry
            self._save()

    def save(self) -> None:
        with self._lock:
            self._save()

    def ids(self, category: str) -> list[str]:
        return sorted(i for i, e in self.instances.items() if e.get("category") == category)

    def summary(self) -> dict[str, Any]:
        """Run totals and id lists, as SWE-bench's run report names them."""
        by = {category: self.ids(category) for category in CATEGORIES}
        completed = sorted(by["resolved"] + by["unresolved"])
        submitted = set(self.submitted_ids)
        ungraded = [i for i in self.submitted_ids if i not in self.instances]
        errors = sorted(by["error"] + ungraded)
        return {
            "schema_version": SCHEMA_VERSION,
            "total_instances": self.total_instances,
            "submitted_instances": len(self.submitted_ids),
            "completed_instances": len(completed),
            "resolved_instances": len(by["resolved"]),
            "unresolved_instances": len(by["unresolved"]),
            "empty_patch_instances": len(by["empty_patch"]),
            "error_instances": len(errors),
            "completed_ids": completed,
            "incomplete_ids": [i for i in self.instance_ids if i not in submitted],
            "submitted_ids": self.submitted_ids,
            "resolved_ids": by["resolved"],
            "unresolved_ids": by["unresolved"],
            "empty_patch_ids": by["empty_patch"],
            "error_ids": errors,
            "ungraded_ids": ungraded,
            "error_reasons": dict(sorted(self.error_reasons().items())),
        }

    def error_reasons(self) -> Counter[str]:
        """How many instances ended without a verdict, by error code (``not_graded`` for those
        the run never reached)."""
        reasons = Counter(
            str(e.get("error_code") or "unknown")
            for e in self.instances.values()
            if e.get("category") == "error"
        )
        reasons["not_graded"] += sum(i not in self.instances for i in self.submitted_ids)
        return +reasons

    def example_error(self, code: str) -> tuple[str, str]:
        """(instance id, error) of the first instance that ended with ``code``."""
        for iid, entry in sorted(self.instances.items()):
            if entry.get("category") == "error" and str(entry.get("error_code")) == code:
                return iid, str(entry.get("error") or "")
        return "", ""

    def to_json(self) -> dict[str, Any]:
        run = {
            "executors": self.executors,
            **self.run,
            "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        return {**self.summary(), "run": run, "instances": dict(sorted(self.instances.items()))}

    def _save(self) -> None:
        if self.path is not None:
            write_json_atomic(self.path, self.to_json())


def _read_entries(path: Path) -> dict[str, dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(
            f"{path}: existing report is unreadable ({exc}); remove it or pick another --output"
        ) from None
    entries = data.get("instances") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise InputError(f"{path}: not a dockyard grade report; remove it or pick another --output")
    return {iid: e for iid, e in entries.items() if isinstance(e, dict)}


def write_json_atomic(path: Path, data: Any) -> None:
    """Write to a temporary file beside ``path``, fsync, rename: a reader (or a kill) never sees
    half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
