"""What the provisioner tracks: one record per pod it answers for, one ticket per create."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .api import Pod
from .manifests import PodSettings


@dataclass
class PodRecord:
    """One pod this provisioner answers for, from slot reservation until its delete is confirmed."""

    name: str
    nonce: str
    state: str = "creating"  # creating | pending | ready | failed | spare | unknown | deleting
    uid: str | None = None
    ip: str | None = None


class CreateTicket:
    """The caller's handle on one asynchronous create. Cancelling abandons it; it never leaks."""

    def __init__(self, on_cancel: Callable[[], None] | None = None,
                 pod: PodSettings | None = None, labels: Mapping[str, str] | None = None,
                 annotations: Mapping[str, str] | None = None) -> None:
        """``pod``, ``labels`` and ``annotations``: this create's own pod shape (the image pool
        asks for a different task image per create); None keeps the provisioner's."""
        self._on_cancel = on_cancel
        self.pod = pod
        self.labels = dict(labels or {})
        self.annotations = dict(annotations or {})
        self._cancelled = threading.Event()
        self._done = threading.Event()
        self.state = "queued"
        self.record: PodRecord | None = None
        self.error: BaseException | None = None

    def cancel(self) -> None:
        """Give up: a queued create is withdrawn; a sent one is settled and cleaned up for you."""
        self._cancelled.set()
        if self._on_cancel is not None:
            self._on_cancel()  # wake a worker waiting for a slot, so it withdraws at once

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def _finish(self, state: str, error: BaseException | None = None) -> None:
        self.state, self.error = state, error
        self._done.set()


def pod_ready(pod: Pod) -> bool:
    status = pod.get("status") or {}
    return bool(status.get("podIP")) and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or [])
