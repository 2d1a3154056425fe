"""The Kubernetes provider of the image pool: carrier pods of the task image, made by the paced
:class:`~sandbox_client.provisioner.Provisioner` (its token bucket, live-pod cap, owner reference,
job labels, settled creates and confirmed deletes; there is no other create path).

One pod per :meth:`KubernetesProvider.create`: the executor container runs the unmodified task
image (``key.image``), the carrier init container copies the executor in, and the key's CPU,
memory and egress shape the pod. Each pod carries an image label (a DNS-safe abbreviation plus
hash of the reference: label values allow 63 characters of ``[a-z0-9A-Z._-]``) and the full
reference in an annotation.

Pod states map to :data:`~sandbox_client.pool.provider.PodPhase` as :func:`phase_of` says; the
executor's URL is ``http://<podIP>:<port>``, the port being the pod settings' (9090), or the
``dockyard.io/port`` annotation where a pod has one (only the stand-in API's pods do: they share
127.0.0.1). Drain: :meth:`KubernetesProvider.close`, and the provisioner's own SIGTERM/SIGINT
handlers and ``atexit`` hook; ``dockyard fleet reap --job`` removes what is left (job label).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

from sandbox_client.provisioner import PodSettings, Provisioner, ProvisionerSettings
from sandbox_client.provisioner.api import Pod, PodAPI
from sandbox_client.provisioner.errors import ProvisionerError
from sandbox_client.provisioner.manifests import dns_label
from sandbox_client.provisioner.podrunner import PORT_ANNOTATION
from sandbox_client.provisioner.tickets import CreateTicket

from .provider import PodStatus, PoolKey, ProviderError

IMAGE_LABEL = "dockyard.io/image"
IMAGE_ANNOTATION = "dockyard.io/image"
EGRESS_LABEL = "dockyard.io/egress"
"""``"true"`` on pods whose code may reach the network: a NetworkPolicy selecting it opens
egress (the default policy denies it for every executor pod)."""
POOL_NAME_ANNOTATION = "dockyard.io/pool-name"

PULLING_REASONS = ("ContainerCreating", "PodInitializing", "PullImage", "Pulling")
PULL_FAILED_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                       "ErrImageNeverPull")
NOT_FOUND_WORDS = ("not found", "manifest unknown", "does not exist", "repository does not exist",
                   "pull access denied", "invalid reference")


def image_label(image: str) -> str:
    """A label value for ``image``: a readable abbreviation plus a hash of the full reference."""
    return dns_label(image, 63)


def pod_settings_for(base: PodSettings, key: PoolKey) -> PodSettings:
    """The pod shape of ``key``: its task image under the carrier, its CPU and memory."""
    changes: dict[str, Any] = {"image": key.image}
    if key.cpu is not None:
        changes.update(cpu_request=key.cpu, cpu_limit=key.cpu)
    if key.memory is not None:
        changes.update(memory_request=key.memory, memory_limit=key.memory)
    return replace(base, **changes)


def phase_of(pod: Pod | None, port: int) -> PodStatus:
    """Map one pod object (None: 404) to a pool status; ``name`` is the pod's."""
    if pod is None:
        return PodStatus(name="", phase="gone")
    name = pod["metadata"]["name"]
    status = pod.get("status") or {}
    phase = status.get("phase")
    if pod["metadata"].get("deletionTimestamp"):
        return PodStatus(name, "failed", reason="being deleted")
    if phase in ("Failed", "Succeeded"):
        return PodStatus(name, "failed", reason=status.get("message") or f"pod {phase}")
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    scheduled = conditions.get("PodScheduled") or {}
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return PodStatus(name, "unschedulable", reason=scheduled.get("message") or "Unschedulable")
    waiting = [s["state"]["waiting"] for s in (status.get("initContainerStatuses") or [])
               + (status.get("containerStatuses") or []) if (s.get("state") or {}).get("waiting")]
    for wait in waiting:
        reason, message = wait.get("reason") or "", wait.get("message") or ""
        if reason in PULL_FAILED_REASONS and any(w in message.lower() for w in NOT_FOUND_WORDS):
            return PodStatus(name, "failed", reason=f"{reason}: {message}")
    ready = (conditions.get("Ready") or {}).get("status") == "True"
    if phase == "Running" and ready and status.get("podIP"):
        port = int((pod["metadata"].get("annotations") or {}).get(PORT_ANNOTATION) or port)
        return PodStatus(name, "ready", url=f"http://{status['podIP']}:{port}")
    if waiting or scheduled.get("status") == "True" or phase == "Running":
        # Scheduled and not Ready: pulling or starting. A slow pull is never a reason to replace.
        return PodStatus(name, "pulling",
                         reason=", ".join(w.get("reason") or "" for w in waiting))
    return PodStatus(name, "creating")


@dataclass
class _Entry:
    key: PoolKey
    ticket: CreateTicket


class KubernetesProvider:
    """A :class:`~sandbox_client.pool.provider.Provider` over one job's paced Provisioner."""

    def __init__(self, settings: ProvisionerSettings, api: PodAPI | None = None,
                 provisioner: Provisioner | None = None) -> None:
        """``settings.pod.carrier_image`` should be set (pods of arbitrary task images need the
        carrier); ``api``/``provisioner``: injectable for tests. Signal handlers are installed
        when ``settings.handle_signals`` is set and this runs in the main thread."""
        self.settings = settings
        self.provisioner = provisioner or Provisioner(settings, api=api)
        self.provisioner.__enter__()  # installs the SIGTERM/SIGINT drain when asked to
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def __enter__(self) -> KubernetesProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self, key: PoolKey, name: str) -> None:
        if not key.image:
            raise ProviderError("an image reference is required")
        labels = {IMAGE_LABEL: image_label(key.image)}
        if key.egress:
            labels[EGRESS_LABEL] = "true"
        annotations = {IMAGE_ANNOTATION: key.image, POOL_NAME_ANNOTATION: name}
        with self._lock:
            if name in self._entries:
                raise ProviderError(f"{name} already exists")
            try:
                ticket = self.provisioner.submit(
                    pod=pod_settings_for(self.settings.pod, key), labels=labels,
                    annotations=annotations)
            except ProvisionerError as exc:
                raise ProviderError(str(exc)) from exc
            self._entries[name] = _Entry(key, ticket)

    def _entry(self, name: str) -> _Entry | None:
        with self._lock:
            return self._entries.get(name)

    def status(self, name: str) -> PodStatus:
        entry = self._entry(name)
        if entry is None:
            return PodStatus(name, "gone")
        ticket = entry.ticket
        if not ticket.done:
            return PodStatus(name, "creating")
        if ticket.state != "created" or ticket.record is None:
            return PodStatus(name, "failed", reason=f"create {ticket.state}: {ticket.error or ''}")
        try:
            pod = self.provisioner.read_pod(ticket.record.name)
        except ProvisionerError as exc:  # the API did not answer: no news, not a verdict
            return PodStatus(name, "creating", reason=str(exc))
        return replace(phase_of(pod, self.settings.pod.port), name=name)

    def pod_name(self, name: str) -> str | None:
        """The Kubernetes name of the pod made for ``name`` (None until it was created)."""
        entry = self._entry(name)
        record = entry.ticket.record if entry is not None else None
        return record.name if record is not None else None

    def delete(self, name: str) -> None:
        entry = self._entry(name)
        if entry is None:
            return
        ticket = entry.ticket
        ticket.cancel()  # unsent: withdrawn; landing late: deleted by the worker
        budget = self.settings.create_timeout_s + self.settings.delete_timeout_s
        if not ticket.wait(budget):
            raise ProviderError(f"create of {name} did not settle within {budget:g}s")
        if ticket.record is not None and not self.provisioner.release(ticket.record.name):
            raise ProviderError(f"delete of {name} not confirmed; the drain and reap remain")
        with self._lock:
            self._entries.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._entries)

    def close(self) -> None:
        left = self.provisioner.drain()
        with self._lock:
            self._entries.clear()
        if left:
            raise ProviderError(f"{left} pods not confirmed deleted; run dockyard fleet reap")
