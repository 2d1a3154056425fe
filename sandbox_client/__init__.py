"""sandbox_client: the trainer's side of Dockyard.

``run_task(TaskSpec) -> TaskResult`` for reward functions, ``start_session(SessionStartSpec) ->
RemoteSession`` for agent environments (``exec -> ExecResult``, ``finish -> FinishResult``,
``snapshot``, ``fork``), ``SandboxClient`` for callers that manage their own pool, and the
``TaskExecutorError`` tree that every failure belongs to (a spec that does not validate is
``InvalidSpec``). Specs may be the protocol models or plain dicts. ``run_task_safe`` and
``reward_from_result`` turn verdicts into rewards without ever scoring a failure as 0.
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
from .reward import reward_from_result, run_task_safe
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
    "TaskExecutorError",
    "TaskResult",
    "TaskSpec",
    "configure",
    "default_client",
    "reward_from_result",
    "run_task",
    "run_task_safe",
    "start_session",
]
