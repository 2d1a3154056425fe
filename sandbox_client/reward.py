"""Rewards from verdicts, and a ``run_task`` that never raises.

A grading that produced no verdict must not become a reward of 0: that would teach the policy
that a correct patch is wrong whenever an executor hiccups. ``run_task_safe`` turns every failure
into a ``TaskResult`` with status ``execution_error``, and ``reward_from_result`` maps that to
None, meaning "no label: drop or resample this rollout".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .api import run_task
from .client import SandboxClient
from .errors import TaskExecutorError
from .protocol import TaskResult, TaskSpec

log = logging.getLogger(__name__)

REWARDS: dict[str, float | None] = {
    "resolved": 1.0,
    "unresolved": 0.0,
    "timeout": 0.0,
    "patch_apply_failed": 0.0,
    "execution_error": None,
}
"""Reward per TaskResult status; None means there is no verdict to learn from."""


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
    logged as warnings, anything else (a bad spec, a bug) with its traceback.
    """
    task_id = _task_id(spec)
    try:
        return run_task(spec, client=client)
    except TaskExecutorError as exc:
        log.warning("task %s: execution_error: %s", task_id, exc)
        return error_result(task_id, exc)
    except Exception as exc:  # the contract is "never raises"
        log.exception("task %s: execution_error (client side)", task_id)
        return execution_error(task_id, f"{type(exc).__name__}: {exc}")


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
