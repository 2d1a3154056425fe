"""SWE-bench files in, TaskSpecs out: instance and prediction loading for the ``dockyard`` CLI.

Instances carry ``instance_id, repo, base_commit, test_patch, FAIL_TO_PASS, PASS_TO_PASS`` (test
lists as lists or as the JSON-encoded strings SWE-bench stores), optionally ``patch`` (the
reference fix), ``test_command``, ``log_parser``, ``setup``, ``env``, ``timeout`` and
``task_id``; SWE-bench's other fields (``problem_statement``, ``version``, ...) are ignored.
Predictions carry ``instance_id, model_patch, model_name_or_path``. Both may be a JSON list, a
JSON object keyed by instance id, or JSON Lines.

Two ids: ``instance_id`` is the SWE-bench id (predictions, the report and the log directories are
keyed by it); ``task_id``, when a record carries one, is Dockyard's id for the grading (sent as
the TaskSpec's ``task_id``, echoed in its result and in the executors' logs). A record with both
is accepted whether they are equal or not; without ``task_id`` the instance id serves as both.

In real SWE-bench ``repo`` is ``owner/name``, which an executor cannot clone. ``RepoMapper`` turns
it into something it can: ``--repo-url-template`` (``{repo}``, ``{owner}``, ``{name}``
placeholders, e.g. ``https://github.com/{repo}.git`` or ``/mirrors/{owner}__{name}``), or
``--repo-root DIR`` (``DIR/owner/name``). URLs and absolute paths are used as they are.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SpecError, parse_spec
from ..protocol import TaskSpec

_URL = re.compile(r"^([a-z][a-z0-9+.-]*://|git@|file:)", re.IGNORECASE)


class InputError(Exception):
    """Bad input files or options: reported to the user as one line, exit status 2."""


@dataclass(frozen=True)
class Prediction:
    """One model's patch for one instance."""

    instance_id: str
    model_patch: str | None
    model_name_or_path: str = ""

    @property
    def is_empty(self) -> bool:
        return not (self.model_patch or "").strip()


def load_records(path: Path) -> list[dict[str, Any]]:
    """Records from a JSON list, a JSON object keyed by instance id, or JSON Lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise InputError(f"{path}: no such file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({exc})") from exc
    stripped = text.strip()
    if not stripped:
        return []
    if stripped[0] in "[{":
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError:
            if stripped[0] == "[":
                raise InputError(f"{path}: not valid JSON") from None
            data = None  # a first line that is an object: JSON Lines
        if isinstance(data, list):
            return [_record(item, path, f"item {i}") for i, item in enumerate(data)]
        if isinstance(data, dict):
            if (
                data
                and all(isinstance(v, dict) for v in data.values())
                and ("instance_id" not in data)
            ):
                return [{"instance_id": key, **value} for key, value in data.items()]
            return [_record(data, path, "the object")]
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(_record(json.loads(line), path, f"line {number}"))
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: line {number} is not valid JSON ({exc.msg})") from None
    return records


def _record(item: Any, path: Path, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise InputError(f"{path}: {where} is not a JSON object")
    if not isinstance(item.get("instance_id"), str) or not item["instance_id"]:
        raise InputError(f"{path}: {where} has no instance_id")
    return item


def load_instances(path: Path) -> dict[str, dict[str, Any]]:
    """Instances by id; duplicates and missing required fields are input errors."""
    instances: dict[str, dict[str, Any]] = {}
    for record in load_records(path):
        iid = record["instance_id"]
        if iid in instances:
            raise InputError(f"{path}: instance {iid} appears twice")
        missing = [f for f in ("repo", "base_commit") if not record.get(f)]
        if missing:
            raise InputError(f"{path}: instance {iid} lacks {', '.join(missing)}")
        instances[iid] = record
    if not instances:
        raise InputError(f"{path}: no instances")
    return instances


def load_predictions(path: Path, instances: Mapping[str, Any]) -> dict[str, Prediction]:
    """Predictions by id; every one must name a known instance, at most once."""
    predictions: dict[str, Prediction] = {}
    for record in load_records(path):
        iid = record["instance_id"]
        if iid in predictions:
            raise InputError(f"{path}: two predictions for {iid}")
        patch = record.get("model_patch", record.get("patch"))
        if patch is not None and not isinstance(patch, str):
            raise InputError(f"{path}: model_patch of {iid} is not a string")
        predictions[iid] = Prediction(iid, patch, str(record.get("model_name_or_path") or ""))
    unknown = sorted(set(predictions) - set(instances))
    if unknown:
        shown = ", ".join(unknown[:10]) + (" ..." if len(unknown) > 10 else "")
        raise InputError(f"{path}: {len(unknown)} predictions have no instance: {shown}")
    if not predictions:
        raise InputError(f"{path}: no predictions")
    return predictions


GOLD = "gold"
"""``--predictions gold``: each instance's own reference ``patch``, as the harness's gold run."""


def gold_predictions(instances: Mapping[str, Mapping[str, Any]]) -> dict[str, Prediction]:
    """A prediction per instance from its ``patch`` field, model ``gold``."""
    missing = sorted(iid for iid, inst in instances.items() if not inst.get("patch"))
    if missing:
        shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise InputError(f"--predictions gold: {len(missing)} instances have no patch: {shown}")
    return {iid: Prediction(iid, str(inst["patch"]), GOLD) for iid, inst in instances.items()}


def select_instances(
    instances: dict[str, dict[str, Any]], ids: list[str] | None
) -> dict[str, dict[str, Any]]:
    """Only the instances named by ``--instance-ids`` (all without it); an unknown id is an
    input error."""
    if not ids:
        return instances
    unknown = sorted(set(ids) - set(instances))
    if unknown:
        raise InputError(f"--instance-ids: no such instance: {', '.join(unknown[:10])}")
    return {iid: instances[iid] for iid in dict.fromkeys(ids)}


@dataclass(frozen=True)
class RepoMapper:
    """Maps an instance's ``repo`` to something an executor can clone."""

    root: Path | None = None
    template: str | None = None

    def __call__(self, repo: str, instance_id: str = "?") -> str:
        if _URL.match(repo) or os.path.isabs(repo):
            return repo
        owner, _, name = repo.rpartition("/")
        if self.template:
            return self.template.format(repo=repo, owner=owner, name=name)
        if self.root is not None:
            return str((self.root / repo).resolve())
        if os.path.exists(repo):
            # Relative to where the CLI runs; the executor needs it absolute.
            return str(Path(repo).resolve())
        raise InputError(
            f"instance {instance_id}: repo {repo!r} is neither a URL nor a local path; "
            "pass --repo-root DIR or --repo-url-template TEMPLATE"
        )


def task_spec(
    instance: Mapping[str, Any],
    patch: str | None,
    repos: RepoMapper,
    *,
    task_id: str | None = None,
    timeout: float | None = None,
    log_bytes: int | None = None,
    rules: str | None = None,
) -> TaskSpec:
    """The TaskSpec that grades ``patch`` on ``instance``. Its ``task_id`` is the ``task_id``
    argument, else the record's own ``task_id`` (Dockyard's id), else its ``instance_id`` (the
    SWE-bench id, which stays the key of predictions and reports)."""
    iid = instance["instance_id"]
    setup = instance.get("setup") or []
    body: dict[str, Any] = {
        "task_id": task_id or dockyard_id(instance),
        "repo": repos(str(instance["repo"]), iid),
        "base_commit": instance["base_commit"],
        "patch": patch or "",
        "test_patch": instance.get("test_patch") or "",
        "fail_to_pass": _first(instance, "FAIL_TO_PASS", "fail_to_pass") or [],
        "pass_to_pass": _first(instance, "PASS_TO_PASS", "pass_to_pass") or [],
        "setup": [setup] if isinstance(setup, str) else setup,
    }
    for optional in ("test_command", "log_parser", "env"):
        if instance.get(optional):
            body[optional] = instance[optional]
    if rules and rules != "strict":  # strict is the default: older executors need not know
        body["rules"] = rules
    wall_clock = instance.get("timeout") or timeout
    if wall_clock:
        body["timeout"] = wall_clock
    if log_bytes:
        body["log_bytes"] = log_bytes
    try:
        return parse_spec(TaskSpec, body)
    except SpecError as exc:
        raise InputError(f"instance {iid}: {exc.field}: {exc.problem}") from None


def dockyard_id(record: Mapping[str, Any]) -> str:
    """The id Dockyard grades ``record`` under: its ``task_id`` when it has one, else its
    ``instance_id`` (SWE-bench's)."""
    own = record.get("task_id")
    return str(own) if own not in (None, "") else str(record["instance_id"])


def _first(record: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if record.get(key) is not None:
            return record[key]
    return None
