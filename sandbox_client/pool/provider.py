"""What the :class:`~sandbox_client.pool.Pool` needs from whatever makes executors for an image.

A provider makes one executor ("pod") for a :class:`PoolKey`, reports how far it got, and deletes
it until the delete is confirmed. It decides nothing: sizing, the cap, idle reclaim, LRU trimming
and joining a create already in flight are the pool's. Two providers ship: ``local`` (an executor
process per image on this machine, the image an unpacked root filesystem directory) and
``kubernetes`` (carrier pods of the task image through the paced
:class:`~sandbox_client.provisioner.Provisioner`; it is the only create path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

PodPhase = Literal["creating", "pulling", "ready", "unschedulable", "failed", "gone"]
"""``creating``: asked for, not yet scheduled or started. ``pulling``: scheduled, its image still
being pulled (never replaced for being slow). ``ready``: answering ``/health`` at ``url``.
``unschedulable``: the cluster cannot place it (reported, not re-created in a loop). ``failed``:
it will never be ready (crashed, image not found, executor exited). ``gone``: deleted, or never
existed."""


@dataclass(frozen=True)
class PoolKey:
    """What makes two executors interchangeable: the image and the environment around it.

    A pod is handed out only for the key it was made for."""

    image: str
    cpu: str | None = None
    """CPU request/limit of the pod (Kubernetes quantity, e.g. ``"2"``), or None for the default."""
    memory: str | None = None
    """Memory of the pod (Kubernetes quantity, e.g. ``"8Gi"``), or None for the default."""
    workspace: str | None = None
    """Workspace mode asked for (``overlay``, ``copy``, ``git-clone``), or None for the default."""
    egress: bool = False
    """Whether code under test may reach the network beyond loopback."""


@dataclass(frozen=True)
class PodStatus:
    """Where one executor stands, as its provider last saw it."""

    name: str
    phase: PodPhase
    url: str | None = None
    """Base URL of the executor (``http://host:port``) once ``ready``."""
    reason: str = ""
    """Why it is ``unschedulable`` or ``failed`` (the scheduler's or the process's words)."""


class ProviderError(Exception):
    """A provider could not do what was asked; ``code`` is machine-readable."""

    code = "provider_error"


class ImageNotFound(ProviderError):
    """The provider has no such image (local: no root filesystem directory for the reference)."""

    code = "image_not_found"


class Provider(Protocol):
    """Makes and removes executors for keys; every method is thread-safe."""

    def create(self, key: PoolKey, name: str) -> None:
        """Start making an executor called ``name`` for ``key`` and return without waiting for
        it to be ready (the pool polls :meth:`status`). Raises :class:`ImageNotFound` when the
        image cannot exist here, :class:`ProviderError` when the create was refused."""

    def status(self, name: str) -> PodStatus:
        """Where ``name`` stands now (``gone`` for a name this provider does not know)."""

    def delete(self, name: str) -> None:
        """Remove ``name`` and return once its removal is confirmed (idempotent: deleting what
        is gone is done). Nothing of it may be left: process, pod, mount or directory."""

    def names(self) -> list[str]:
        """Every executor this provider made and has not confirmed deleted."""

    def close(self) -> None:
        """Delete everything this provider made (confirmed) and release its resources."""
