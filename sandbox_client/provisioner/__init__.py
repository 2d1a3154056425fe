"""Executor pods on a shared Kubernetes cluster: paced, spread, owned, capped and never leaked.

Needs the ``[k8s]`` extra (the official ``kubernetes`` client). Typical use in a trainer::

    from sandbox_client.provisioner import Provisioner, ProvisionerSettings

    settings = ProvisionerSettings.from_env(job="run-42")
    with Provisioner(settings) as fleet:           # drains on exit, SIGTERM, SIGINT and atexit
        urls = fleet.provision(16)                 # http://<podIP>:9090 of Ready pods
        client = fleet.sandbox_client(token=...)   # a SandboxClient over them

Modules: ``manifests`` (pure pod/Deployment/NetworkPolicy/RBAC builders), ``pacing`` (token
bucket), ``api`` (the client, configured for failure paths), ``podops`` (create with read-back,
delete until gone), ``provisioner``, ``reaper``, ``errors``, ``testing`` (a stand-in API server)
and ``cli`` (``dockyard-provision``).
"""

from __future__ import annotations

from .api import APIConfig, PodAPI
from .config import ProvisionerSettings
from .errors import (
    APIError,
    CapacityError,
    ProvisionerClosed,
    ProvisionerError,
    ReadinessTimeout,
    ReplyLost,
    RequestNotSent,
)
from .manifests import PodSettings, owner_reference_from_env, pod_manifest, pod_template
from .pacing import TokenBucket
from .provisioner import Provisioner
from .reaper import ReapReport, reap
from .tickets import CreateTicket, PodRecord

__all__ = [
    "APIConfig",
    "APIError",
    "CapacityError",
    "CreateTicket",
    "PodAPI",
    "PodRecord",
    "PodSettings",
    "Provisioner",
    "ProvisionerClosed",
    "ProvisionerError",
    "ProvisionerSettings",
    "ReadinessTimeout",
    "ReapReport",
    "ReplyLost",
    "RequestNotSent",
    "TokenBucket",
    "owner_reference_from_env",
    "pod_manifest",
    "pod_template",
    "reap",
]
