"""The reaper: delete every pod labelled with a job id, and confirm each one gone.

For the end of a job whose provisioners could not drain (killed with SIGKILL, node lost) and for
``dockyard fleet reap --job ID``. Pods are deleted with their uid as a precondition and listed
again until none is left, so a pod that lands while the reaper runs is caught on the next pass.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from .api import APIConfig, Pod, PodAPI
from .config import ProvisionerSettings
from .errors import ProvisionerError
from .manifests import job_selector, label_selector
from .pacing import Clock, Sleep
from .podops import Retry, delete_until_gone, run_parallel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReapReport:
    """How a reap ended: pods deleted, and pods still there when the deadline came."""

    deleted: int
    left: int


def reap(job: str, namespace: str | None = None, api: PodAPI | None = None,
         config: APIConfig | None = None, timeout_s: float = 300.0,
         workers: int = ProvisionerSettings.delete_workers,
         poll_s: float = ProvisionerSettings.poll_interval_s,
         backoff_s: tuple[float, ...] = ProvisionerSettings.backoff_s,
         clock: Clock = time.monotonic, sleep: Sleep = time.sleep) -> ReapReport:
    """Delete all pods labelled ``dockyard.io/job=<job>`` in ``namespace`` until none is left.

    ``namespace`` and ``config`` default to what :meth:`ProvisionerSettings.from_env` reads
    (``DOCKYARD_K8S_NAMESPACE``/``POD_NAMESPACE``, ``DOCKYARD_K8S_HOST``, in-cluster config or
    the kubeconfig), so ``reap(job_id)`` works as an entry point on its own.
    """
    if namespace is None or (api is None and config is None):
        defaults = ProvisionerSettings.from_env(job=job)
        namespace = namespace or defaults.namespace
        config = config or defaults.api
    own = api is None
    api = api if api is not None else PodAPI(config or APIConfig(), namespace)
    selector = label_selector(job_selector(job))
    deadline = clock() + timeout_s
    deleted = 0
    list_retry = Retry(backoff_s, deadline, clock, sleep)

    def delete(pod: Pod) -> bool:
        meta = pod["metadata"]
        return delete_until_gone(api, meta["name"], Retry(backoff_s, deadline, clock, sleep),
                                 poll_s, uid=meta.get("uid"))

    try:
        while True:
            try:
                pods = api.list(selector)
            except ProvisionerError as exc:
                log.warning("listing pods of job %s failed: %s", job, exc)
                if not list_retry.wait():
                    raise
                continue
            if not pods:
                return ReapReport(deleted, 0)
            if clock() >= deadline:
                return ReapReport(deleted, len(pods))
            deleted += sum(run_parallel(delete, pods, workers))
    finally:
        if own:
            api.close()
