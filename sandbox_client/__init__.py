"""sandbox_client: the trainer's side of Dockyard.

``run_task(spec) -> TaskResult`` for reward functions, ``start_session(spec) -> RemoteSession``
for agent environments, ``SandboxClient`` for callers that manage their own pool, and the
``TaskExecutorError`` tree that every failure belongs to. ``run_task_safe`` and
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
    ProtocolError,
    ReplyLost,
    TaskExecutorError,
)
from .reward import reward_from_result, run_task_safe
from .routing import ExecutorStatus
from .session import RemoteSession

__all__ = [
    "ClientConfig",
    "ConnectionLost",
    "ExecutorBusy",
    "ExecutorRejected",
    "ExecutorStatus",
    "ExecutorTimeout",
    "ExecutorUnreachable",
    "ProtocolError",
    "RemoteSession",
    "ReplyLost",
    "SandboxClient",
    "TaskExecutorError",
    "configure",
    "default_client",
    "reward_from_result",
    "run_task",
    "run_task_safe",
    "start_session",
]
