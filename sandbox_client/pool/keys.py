"""The pool's settings, and the key a spec's work is placed by.

A pod is handed out only for the key it was made for: the image plus whatever makes it a
different environment (CPU, memory, workspace mode, egress). Two specs of one image that differ
in any of these never share a pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..protocol import SessionStartSpec, TaskSpec
from .provider import PoolKey


@dataclass(frozen=True)
class PoolSettings:
    """How one job's pool sizes, waits and reclaims. Plain data: picklable, so a pool can be
    rebuilt from it inside a Ray actor (no Ray dependency here)."""

    job: str = "dockyard"
    """Names every pod (``<job>-<n>``); the Kubernetes provider labels pods with it too."""
    max_pods: int = 64
    """One cap over every pod of every key, from its create until its delete is confirmed."""
    idle_timeout_s: float = 300.0
    """A pod with nothing in flight this long is deleted (nothing refills on release)."""
    ready_timeout_s: float = 900.0
    """From create to ready, per pod: generous, for cold image pulls (a pod still pulling is
    never replaced before it)."""
    acquire_timeout_s: float = 900.0
    """How long an acquire waits for a pod (its create, or room under the cap) before it gives
    up with ``PoolFull`` or ``PodNotReady``."""
    poll_interval_s: float = 0.25
    """How often pending pods are looked at, and idle ones reclaimed."""
    check_interval_s: float = 2.0
    """How often a ready pod's provider is asked whether it still runs (a dead one is
    deleted; a call that finds it dead first reports it at once through ``release``)."""
    expected_capacity: int = 16
    """Work one pending pod is expected to take, until its ``/health`` says (joins beyond it
    start another create)."""
    token: str | None = None
    """The executors' bearer token (``/health`` needs none)."""

    def __post_init__(self) -> None:
        if self.max_pods < 1:
            raise ValueError("max_pods must be at least 1")
        if self.idle_timeout_s < 0 or self.ready_timeout_s <= 0 or self.acquire_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        if self.expected_capacity < 1:
            raise ValueError("expected_capacity must be at least 1")


def pool_key(image: str, spec: TaskSpec | SessionStartSpec | Any = None) -> PoolKey:
    """The key ``spec``'s work on ``image`` needs (no spec: the image with defaults)."""
    if not image or not isinstance(image, str):
        raise ValueError("an image reference is required")
    conditions = getattr(spec, "conditions", None)
    cpus = getattr(conditions, "cpus", None)
    memory = getattr(conditions, "memory_limit_bytes", None)
    workspace = getattr(conditions, "workspace_mode", None)
    egress = getattr(conditions, "egress", None)
    if egress is None:
        deny = getattr(spec, "deny_network", None)
        egress = deny is False
    return PoolKey(image=image, cpu=None if cpus is None else str(cpus),
                   memory=None if memory is None else str(memory), workspace=workspace,
                   egress=bool(egress))
