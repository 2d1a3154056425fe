"""sandbox_client: the trainer's side of Dockyard.

``run_task(TaskSpec) -> TaskResult`` for reward functions, ``start_session(SessionStartSpec) ->
RemoteSession`` for agent environments (``exec -> ExecResult``, ``finish -> FinishResult``,
``snapshot``, ``fork``), ``SandboxClient`` for callers that manage their own pool, and the
``TaskExecutorError`` tree that every executor failure belongs to (a spec that does not validate
is ``SpecError``, a ``ValueError`` outside that tree: the caller's bug, raised before sending).
Specs may be the protocol models or plain dicts. ``run_task_safe`` (``run_tasks_safe`` for a
batch) and ``reward_from_result`` turn verdicts into rewards without ever scoring a failure as 0;
``no_verdict_cause`` says whose fault a missing verdict is.
``SandboxClient.fleet_status()`` reports each executor as ``ExecutorStatus`` (see ``routing``).
"""

from .api import configure, default_client, run_task, start_session
from .client import SandboxClient
from .config import ClientConfig
from .errors import (
    ConnectionLost,
    ExecutorBusy,
    ExecutorRejected,
    ExecutorTimeout,
    ExecutorUnreachable,
    InvalidConfig,
    InvalidSpec,
    ProtocolError,
    ReplyLost,
    SpecError,
    TaskExecutorError,
)
from .protocol import (
    ExecResult,
    FinishResult,
    FinishSpec,
    HealthResponse,
    SessionStartSpec,
    SessionState,
    SnapshotInfo,
    TaskResult,
    TaskSpec,
)
from .reward import no_verdict_cause, reward_from_result, run_task_safe, run_tasks_safe
from .routing import ExecutorStatus
from .session import RemoteSession

__all__ = [
    "ClientConfig",
    "ConnectionLost",
    "ExecResult",
    "ExecutorBusy",
    "ExecutorRejected",
    "ExecutorStatus",
    "ExecutorTimeout",
    "ExecutorUnreachable",
    "FinishResult",
    "FinishSpec",
    "HealthResponse",
    "InvalidConfig",
    "InvalidSpec",
    "ProtocolError",
    "RemoteSession",
    "ReplyLost",
    "SandboxClient",
    "SessionStartSpec",
    "SessionState",
    "SnapshotInfo",
    "SpecError",
    "TaskExecutorError",
    "TaskResult",
    "TaskSpec",
    "configure",
    "default_client",
    "no_verdict_cause",
    "reward_from_result",
    "run_task",
    "run_task_safe",
    "run_tasks_safe",
    "start_session",
]
