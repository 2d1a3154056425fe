"""Rewards from verdicts, and a ``run_task`` that never raises.

A grading that produced no verdict must not become a reward of 0: that would teach the policy
that a correct patch is wrong whenever an executor hiccups. ``run_task_safe`` turns every failure
into a ``TaskResult`` with status ``execution_error``, and ``reward_from_result`` maps that to
None, meaning "no label: drop or resample this rollout". ``run_tasks_safe`` does the same for a
batch, one result per spec.

"No verdict" has three causes, and ``no_verdict_cause`` tells them apart, so a trainer alarms on
the right one: ``caller_bug`` (the client refused the spec, error code ``invalid_spec``: nothing
was sent, and resending it fails the same way), ``task_broken`` (the task itself cannot be
graded), ``infrastructure`` (executors failed: resample). A batch of bad specs must never look
like a dead fleet (issue #25).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from .api import default_client, run_task
from .client import SandboxClient
from .errors import SpecError, TaskExecutorError
from .protocol import TaskResult, TaskSpec, task_is_broken

log = logging.getLogger(__name__)

REWARDS: dict[str, float | None] = {
    "resolved": 1.0,
    "unresolved": 0.0,
    "timeout": 0.0,
    "patch_apply_failed": 0.0,
    "execution_error": None,
}
"""Reward per TaskResult status; None means there is no verdict to learn from."""


CALLER_BUG_CODES = frozenset({SpecError.code})
"""Error codes of results without a verdict because the caller's spec was refused."""

NoVerdictCause = Literal["caller_bug", "task_broken", "infrastructure"]
"""Why a result has no verdict (see the module docstring)."""

#: Threads ``run_tasks_safe`` uses at most by default (the client keeps what it sends to each
#: executor within its capacity; the rest wait in the client).
BATCH_WORKERS = 128


def no_verdict_cause(result: TaskResult) -> NoVerdictCause | None:
    """None when ``result`` is a verdict; else whose fault it is that there is none: the
    caller's (``invalid_spec``), the task's, or the infrastructure's."""
    if result.status != "execution_error":
        return None
    if result.error_code in CALLER_BUG_CODES:
        return "caller_bug"
    if task_is_broken(result.error_code):
        return "task_broken"
    return "infrastructure"


def reward_from_result(result: TaskResult) -> float | None:
    """1.0 for resolved, 0.0 for a wrong patch (unresolved, timeout, not applying), None for
    ``execution_error`` (no label: resample)."""
    return REWARDS[result.status]


def execution_error(task_id: str, message: str, code: str = "client_error") -> TaskResult:
    """A no-verdict result made on the client side."""
    return TaskResult(
        task_id=task_id, status="execution_error", resolved=None, error=message, error_code=code
    )


def error_result(task_id: str, exc: TaskExecutorError) -> TaskResult:
    """The ``execution_error`` result that stands for a failed call."""
    return execution_error(task_id, str(exc), code=_code(exc))


def run_task_safe(
    spec: TaskSpec | Mapping[str, Any], client: SandboxClient | None = None
) -> TaskResult:
    """Like ``run_task``, but every failure comes back as an ``execution_error`` result.

    Never raises (a reward function must not crash the training loop): executor failures are
    logged as warnings; a spec the client refuses (``SpecError``: nothing sent) as an error and
    comes back with error code ``invalid_spec`` (``no_verdict_cause``: ``caller_bug``); anything
    else (a bug) with its traceback.
    """
    task_id = _task_id(spec)
    try:
        return run_task(spec, client=client)
    except SpecError as exc:
        log.error("task %s: not sent, the spec is the caller's bug: %s", task_id, exc)
        return execution_error(task_id, str(exc), code=exc.code)
    except TaskExecutorError as exc:
        log.warning("task %s: execution_error: %s", task_id, exc)
        return error_result(task_id, exc)
    except Exception as exc:  # the contract is "never raises"
        log.exception("task %s: execution_error (client side)", task_id)
        return execution_error(task_id, f"{type(exc).__name__}: {exc}")


def run_tasks_safe(
    specs: Sequence[TaskSpec | Mapping[str, Any]],
    client: SandboxClient | None = None,
    *,
    workers: int | None = None,
) -> list[TaskResult]:
    """``run_task_safe`` over a batch, at once (``workers`` threads, default one per spec up to
    ``BATCH_WORKERS``): one result per spec, in order; never raises. A spec the client refuses
    is not sent and is flagged ``invalid_spec`` while the rest are graded."""
    if not specs:
        return []
    client = client or default_client()
    count = workers or min(len(specs), BATCH_WORKERS)
    with ThreadPoolExecutor(max(1, count), thread_name_prefix="dockyard-batch") as pool:
        return list(pool.map(lambda spec: run_task_safe(spec, client), specs))


def _task_id(spec: TaskSpec | Mapping[str, Any]) -> str:
    if isinstance(spec, TaskSpec):
        return spec.task_id
    value = spec.get("task_id", spec.get("instance_id")) if isinstance(spec, Mapping) else None
    return str(value) if value else "?"


def _code(exc: TaskExecutorError) -> str:
    """``executor_unreachable`` for ExecutorUnreachable, the rejection code for a rejection."""
    code = getattr(exc, "code", None)
    if isinstance(code, str):
        return code
    name = type(exc).__name__
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
