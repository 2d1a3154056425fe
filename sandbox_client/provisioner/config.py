"""One typed settings object for a provisioner, read from the environment in one function.

Every knob lives on :class:`ProvisionerSettings`; :meth:`ProvisionerSettings.from_env` is the only
code that reads ``os.environ``-style mappings, and it validates as it reads.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .api import APIConfig
from .manifests import PodSettings, owner_reference_from_env


@dataclass(frozen=True)
class ProvisionerSettings:
    """How one job's executor pods are created, paced, capped, awaited and removed."""

    job: str
    """Job id: every pod carries it as a label, and ``reap(job)`` removes them all."""
    namespace: str = "default"
    pod: PodSettings = field(default_factory=PodSettings)
    api: APIConfig = field(default_factory=APIConfig)
    owner: Mapping[str, Any] | None = None
    """Owner reference put on every pod (the trainer pod, in-cluster): GC removes what we miss."""
    instance: str = field(default_factory=lambda: secrets.token_hex(4))
    """Tells this provisioner's pods from those of other provisioners in the same job."""
    max_live: int = 64
    """Cap on this provisioner's live pods: creating, pending, ready, kept or being deleted."""
    rate: float = 5.0
    """Creates per second (the bucket's refill rate). Sandman ran 10-20/s on a shared cluster."""
    burst: int = 10
    jitter_s: float = 0.05
    create_workers: int = 16
    """Creates in flight at once (each waits for a slot under the cap and a token first)."""
    delete_workers: int = 16
    readiness_timeout_s: float = 300.0
    """Per-job budget from ``provision()`` to Ready: set it above the image pull time."""
    create_timeout_s: float = 120.0
    """How long one create may keep retrying before its outcome is settled as it stands."""
    delete_timeout_s: float = 120.0
    poll_interval_s: float = 1.0
    settle_s: float = 2.0
    """After an ambiguous create that read back as absent, read once more after this long."""
    backoff_s: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0, 5.0)
    """Waits between retries of one call; the last value repeats."""
    keep_late_pods: bool = False
    """A create that lands after its caller gave up: keep it as a spare (True) or delete it."""
    handle_signals: bool = True
    """On entering the context in the main thread, drain on SIGTERM and SIGINT."""

    def __post_init__(self) -> None:
        if not self.job:
            raise ValueError("job id must not be empty")
        if self.max_live < 1:
            raise ValueError("max_live must be at least 1")
        if self.create_workers < 1 or self.delete_workers < 1:
            raise ValueError("worker counts must be at least 1")
        if not self.backoff_s:
            raise ValueError("backoff_s needs at least one value")

    def with_changes(self, **changes: Any) -> ProvisionerSettings:
        """A copy with some fields changed (tests and the CLI use it)."""
        return replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 **overrides: Any) -> ProvisionerSettings:
        """Settings from ``DOCKYARD_*`` variables and the downward API's ``POD_*`` ones."""
        env = os.environ if env is None else env

        def number(key: str, default: float) -> float:
            raw = env.get(key, "").strip()
            if not raw:
                return default
            try:
                return float(raw)
            except ValueError as exc:
                raise ValueError(f"{key} must be a number, got {raw!r}") from exc

        def flag(key: str, default: bool) -> bool:
            raw = env.get(key, "").strip().lower()
            if not raw:
                return default
            if raw in ("1", "true", "yes", "on"):
                return True
            if raw in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"{key} must be 1 or 0 (true/false), got {raw!r}")

        pod = PodSettings(
            image=env.get("DOCKYARD_EXECUTOR_IMAGE") or PodSettings.image,
            carrier_image=env.get("DOCKYARD_CARRIER_IMAGE") or None,
            token_secret=env.get("DOCKYARD_TOKEN_SECRET") or PodSettings.token_secret,
            sandbox=flag("DOCKYARD_POD_SANDBOX", PodSettings.sandbox),
        )
        api = APIConfig(
            host=env.get("DOCKYARD_K8S_HOST") or None,
            kubeconfig=env.get("KUBECONFIG") or None,
            connect_timeout_s=number("DOCKYARD_K8S_CONNECT_TIMEOUT", APIConfig.connect_timeout_s),
            read_timeout_s=number("DOCKYARD_K8S_READ_TIMEOUT", APIConfig.read_timeout_s),
        )
        values: dict[str, Any] = {
            "job": env.get("DOCKYARD_JOB_ID", ""),
            "namespace": env.get("DOCKYARD_K8S_NAMESPACE") or env.get("POD_NAMESPACE") or "default",
            "pod": pod,
            "api": api,
            "owner": owner_reference_from_env(env),
            "max_live": int(number("DOCKYARD_MAX_PODS", cls.max_live)),
            "rate": number("DOCKYARD_CREATE_RATE", cls.rate),
            "burst": int(number("DOCKYARD_CREATE_BURST", cls.burst)),
            "readiness_timeout_s": number("DOCKYARD_READY_TIMEOUT", cls.readiness_timeout_s),
            "poll_interval_s": number("DOCKYARD_K8S_POLL_INTERVAL", cls.poll_interval_s),
        }
        values.update(overrides)
        return cls(**values)
