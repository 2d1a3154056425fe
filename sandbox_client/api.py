"""Thin module functions over a default ``SandboxClient`` (the shape of requests' ``api.py``).

The default client is built on first use from the environment (``DOCKYARD_SANDBOX_URLS``,
``DOCKYARD_API_TOKEN``, ``DOCKYARD_ROUTING``) and shared by every thread, so its connection pool
and its view of the fleet (template-affinity ranking, ejected executors, capacity) are too.
``configure(...)`` replaces it, e.g. with a trainer config; callers that want their own lifecycle
keep a ``SandboxClient`` instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from .client import SandboxClient
from .config import Timeout
from .protocol import SessionStartSpec, TaskResult, TaskSpec
from .session import RemoteSession

_default: SandboxClient | None = None
_default_lock = threading.Lock()


def configure(
    urls: str | Iterable[str] | None = None,
    token: str | None = None,
    timeout: Timeout | None = None,
    config: Any = None,
    *,
    task_timeout: float | None = None,
) -> SandboxClient:
    """Replace the default client (arguments as for ``SandboxClient``) and return it."""
    global _default
    client = SandboxClient(urls, token, timeout, config, task_timeout=task_timeout)
    with _default_lock:
        previous, _default = _default, client
    if previous is not None:
        previous.close()
    return client


def default_client() -> SandboxClient:
    """The shared client, built from the environment on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = SandboxClient()
        return _default


def run_task(
    spec: TaskSpec | Mapping[str, Any], *, client: SandboxClient | None = None
) -> TaskResult:
    """Grade one patch; raises ``TaskExecutorError`` (see ``reward.run_task_safe`` for rewards)."""
    return (client or default_client()).run_task(spec)


def start_session(
    spec: SessionStartSpec | Mapping[str, Any], *, client: SandboxClient | None = None
) -> RemoteSession:
    """Open a multi-turn shell session on the next executor."""
    return (client or default_client()).start_session(spec)
