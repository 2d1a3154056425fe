"""``dockyard preflight``: refuse vacuous and flaky instances before they reach training.

Each instance's reference patch (field ``patch``) and an empty patch are graded ``repeat`` times.
An instance is

* ``vacuous`` when the reference never resolves it or the empty patch always does (a reward on it
  says nothing about the agent's patch), or when the task is broken (its tests give no verdict
  without any patch: ``task_broken`` with the executor's code, e.g. ``test_ids_not_found``);
* ``flaky`` when repeats of the same patch disagree (or single tests change state between them);
* ``error`` when some grading gave no verdict even after retries (an infrastructure fault: not
  evidence against the instance, so it is reported apart and left out of the allowlist);
* ``ok`` otherwise: these ids form the allowlist.

Every repeat is a call of its own (its own task_id, for the logs, and its own Idempotency-Key),
so the executor grades each afresh: a stored verdict would hide exactly the flakiness this looks
for. Only a repeat's own retries after a lost reply are answered from the executor's store.

It fails fast as ``dockyard grade`` does (``fleetcheck``): the reference patch of the first
instance of each repository is graded first, and when none of those got a verdict for a reason
every other grading would share (an unknown repository, a refused token, no executor), the run
stops there with that reason instead of grading every instance into ``error``.

Each check records the run conditions its gradings reported (CPUs, memory, uid, egress, time zone,
interpreter, ...), every distinct set once, so an allowlist says what it was checked under.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..client import SandboxClient
from ..protocol import TaskResult, task_is_broken
from .fleetcheck import judge_scouts
from .grade import run_parallel, run_with_retries
from .progress import Progress
from .report import category_of
from .swebench import InputError, RepoMapper, task_spec

VERDICTS = ("ok", "vacuous", "flaky", "error")
KINDS = ("reference", "empty")


@dataclass
class InstanceCheck:
    """What preflight found about one instance."""

    instance_id: str
    verdict: str = "ok"
    flags: list[str] = field(default_factory=list)
    reference: list[str] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)
    flaky_tests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    conditions: list[dict[str, Any]] = field(default_factory=list)
    """The distinct run conditions the gradings of this instance reported."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def judge(instance_id: str, runs: Mapping[str, list[TaskResult]]) -> InstanceCheck:
    """Classify one instance from its reference and empty runs."""
    check = InstanceCheck(instance_id)
    check.reference = [r.status for r in runs.get("reference", [])]
    check.empty = [r.status for r in runs.get("empty", [])]
    flaky_tests: set[str] = set()
    for kind in KINDS:
        results = runs.get(kind, [])
        check.errors += [f"{kind}: {r.error}" for r in results if r.status == "execution_error"]
        verdicts = [r.resolved for r in results if r.status != "execution_error"]
        if len(set(verdicts)) > 1:
            check.flags.append(f"flaky_{kind}")
        elif verdicts and kind == "reference" and not verdicts[0]:
            check.flags.append("reference_fails")
        elif verdicts and kind == "empty" and verdicts[0]:
            check.flags.append("empty_passes")
        graded = [r.tests for r in results if r.status != "execution_error"]
        for test in set().union(*graded) if graded else ():
            if len({tests.get(test, "MISSING") for tests in graded}) > 1:
                flaky_tests.add(test)
    check.flaky_tests = sorted(flaky_tests)
    broken = sorted({r.error_code for results in runs.values() for r in results
                     if r.status == "execution_error" and task_is_broken(r.error_code)})
    check.flags += [f"task_broken ({code})" for code in broken]
    for results in runs.values():
        for result in results:
            seen = result.conditions.model_dump(mode="json") if result.conditions else None
            if seen is not None and seen not in check.conditions:
                check.conditions.append(seen)
    if {"reference_fails", "empty_passes"} & set(check.flags) or broken:
        check.verdict = "vacuous"
    elif check.flags or check.flaky_tests:
        check.verdict = "flaky"
    elif check.errors:
        check.verdict = "error"
    return check


def run_preflight(
    client: SandboxClient,
    instances: Mapping[str, Mapping[str, Any]],
    *,
    repos: RepoMapper,
    repeat: int,
    workers: int,
    max_error_retries: int = 2,
    timeout: float | None = None,
    progress: Progress | None = None,
    rules: str = "strict",
    before_sending: Callable[[], None] | None = None,
) -> list[InstanceCheck]:
    """Grade reference and empty patches ``repeat`` times per instance; judge each instance.

    ``before_sending`` runs before the first grading (the CLI's fleet check); ``FleetUnusable``
    from it, or from the first grading of each repository, ends the run before the rest."""
    no_reference = [iid for iid, inst in instances.items() if not (inst.get("patch") or "")]
    if no_reference:
        shown = ", ".join(no_reference[:10])
        raise InputError(f"{len(no_reference)} instances have no reference patch: {shown}")
    jobs = []
    for iid, instance in instances.items():
        for kind in KINDS:
            patch = instance["patch"] if kind == "reference" else ""
            for round_ in range(repeat):
                task_id = f"{iid}@preflight-{kind}-{round_}"
                spec = task_spec(instance, patch, repos, task_id=task_id, timeout=timeout,
                                 rules=rules)
                jobs.append((iid, kind, spec))
    # Made up front: filling a defaultdict from several threads could lose a run.
    runs = {iid: {kind: list[TaskResult]() for kind in KINDS} for iid in instances}
    categories = ("resolved", "unresolved", "error")
    progress = progress or Progress(len(jobs), categories, label="preflight")

    # The scouts: each repository's first instance's first reference grading.
    first_of_repo: dict[str, tuple[str, str, Any]] = {}
    for job in jobs:
        first_of_repo.setdefault(str(instances[job[0]].get("repo")), job)
    scouts = list(first_of_repo.values())
    scout_ids = {spec.task_id for _, _, spec in scouts}
    scouted: list[dict[str, Any]] = []

    def grade_one(job: tuple[str, str, Any]) -> None:
        iid, kind, spec = job
        result, _ = run_with_retries(client, spec, max_error_retries)
        runs[iid][kind].append(result)
        progress.advance(category_of(result))
        if spec.task_id in scout_ids:
            scouted.append({"category": category_of(result), "error_code": result.error_code,
                            "error": result.error})

    if before_sending is not None:
        before_sending()
    try:
        run_parallel(grade_one, scouts, workers)
        judge_scouts(scouted)
        run_parallel(grade_one, [job for job in jobs if job[2].task_id not in scout_ids], workers)
    finally:
        progress.finish()
    return [judge(iid, runs[iid]) for iid in instances]
