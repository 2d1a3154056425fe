"""``dockyard grade``: SWE-bench predictions graded over a fleet, resumable, into one report.

Empty patches are not sent (SWE-bench counts them as ``empty_patch``). An ``execution_error`` is
no verdict, so the task is sent again (placed as before: the executor its template ranks first,
or the next when that one is ejected or full) up to
``max_error_retries`` times; what still has no verdict is reported under ``error_ids`` and graded
again by the next run with the same report file. The first instance of each repository goes
first (``fleetcheck``): when none of those gets a verdict for a fleet-wide reason, the run stops.
Each graded instance gets its log directory (``logdir``) when ``logs`` is given.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, TypeVar

from ..client import SandboxClient
from ..errors import ExecutorBusy, ExecutorRejected, TaskExecutorError
from ..protocol import TaskResult, TaskSpec, task_is_broken
from ..reward import error_result
from .fleetcheck import judge_scouts, scouts
from .logdir import InstanceLogs
from .progress import Progress
from .report import CATEGORIES, GradeReport, instance_entry
from .swebench import Prediction, RepoMapper, task_spec

log = logging.getLogger(__name__)

T = TypeVar("T")


def run_with_retries(
    client: SandboxClient, spec: TaskSpec, max_error_retries: int
) -> tuple[TaskResult, int]:
    """Grade until there is a verdict or the retries are spent; returns (result, attempts).

    A 4xx rejection other than 429 (bad request, unknown repo, wrong token) is final: sending it
    again, anywhere, would be refused again; so is a task the executor found broken.
    """
    attempts = 0
    while True:
        attempts += 1
        try:
            result = client.run_task(spec)
        except TaskExecutorError as exc:
            result = error_result(spec.task_id, exc)
            final = isinstance(exc, ExecutorRejected) and not isinstance(exc, ExecutorBusy)
            if final and exc.status < 500:
                return result, attempts
        if result.status != "execution_error" or attempts > max_error_retries:
            return result, attempts
        if task_is_broken(result.error_code):
            return result, attempts
        log.warning(
            "task %s: execution_error (%s); retry %d of %d",
            spec.task_id,
            result.error,
            attempts,
            max_error_retries,
        )


def run_parallel(work: Callable[[T], None], items: Iterable[T], workers: int) -> None:
    """Run ``work`` over ``items`` on ``workers`` threads; on Ctrl-C stop queueing and re-raise
    (tasks in flight still finish and record their results)."""
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="dockyard")
    try:
        futures = [pool.submit(work, item) for item in items]
        for future in as_completed(futures):
            future.result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def grade_predictions(
    client: SandboxClient,
    instances: Mapping[str, Mapping[str, Any]],
    predictions: Mapping[str, Prediction],
    report: GradeReport,
    *,
    repos: RepoMapper,
    workers: int,
    max_error_retries: int = 2,
    timeout: float | None = None,
    progress: Progress | None = None,
    logs: InstanceLogs | None = None,
    log_bytes: int | None = None,
    before_sending: Callable[[], None] | None = None,
    rules: str = "strict",
) -> GradeReport:
    """Grade every prediction the report does not already hold a verdict for (by ``rules``);
    raises ``fleetcheck.FleetUnusable`` when the first grading of every repository says the run
    cannot work. ``before_sending`` runs once the input is known good and something is to be
    sent (the fleet check)."""
    todo = [p for p in predictions.values() if not report.is_done(p, rules)]
    skipped = len(predictions) - len(todo)
    if skipped:
        print(f"resuming: {skipped} of {len(predictions)} instances already graded",
              file=sys.stderr, flush=True)
    # Build every spec before sending anything: bad input fails the run now, not at item 900.
    specs = {
        p.instance_id: task_spec(
            instances[p.instance_id], p.model_patch, repos, timeout=timeout, rules=rules,
            log_bytes=log_bytes,
        )
        for p in todo
        if not p.is_empty
    }
    if specs and before_sending is not None:
        before_sending()
    progress = progress or Progress(len(todo), CATEGORIES)
    entries: dict[str, dict[str, Any]] = {}

    def grade_one(prediction: Prediction) -> None:
        if prediction.is_empty:
            entry = instance_entry(prediction, None, 0, rules)
        else:
            result, attempts = run_with_retries(
                client, specs[prediction.instance_id], max_error_retries
            )
            entry = instance_entry(prediction, result, attempts)
            if logs is not None:
                logs.write(prediction, entry, result)
        report.record(prediction.instance_id, entry)
        entries[prediction.instance_id] = entry
        progress.advance(entry["category"])

    report.save()
    first = scouts([p for p in todo if not p.is_empty], instances)
    rest = [p for p in todo if p not in first]
    try:
        run_parallel(grade_one, first, workers)
        judge_scouts([entries[p.instance_id] for p in first])
        run_parallel(grade_one, rest, workers)
    finally:
        progress.finish()
    return report
