"""Fixtures for the provisioner: a stand-in API server on 127.0.0.1, and settings with tiny timings.

Every provisioner test module starts with ``pytest.importorskip("kubernetes")``, so the tier skips
cleanly where the ``[k8s]`` extra is not installed (this conftest itself needs only the stdlib).
Timings are scaled down (milliseconds instead of seconds) so each failure window can be repeated
20 times in the default tier.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from sandbox_client.provisioner import APIConfig, PodAPI, Provisioner, ProvisionerSettings
from sandbox_client.provisioner.manifests import JOB_LABEL, NONCE_LABEL, dns_label
from sandbox_client.provisioner.testing import StandInAPI, StandInServer

NAMESPACE = "dockyard-test"
REPEATS = 20
"""Each failure window runs this many times, as in Sandman's table A21."""
READY_BUDGET = 60.0
"""Budget for windows where a never-Ready pod must run it out while healthy pods get Ready: on
a ``BudgetOnceSettled`` clock it runs out as soon as they are; it only guards against a hang."""
TRAINER = {"apiVersion": "v1", "kind": "Pod", "name": "trainer-0", "uid": "trainer-uid-0"}
_jobs = itertools.count()


@dataclass
class Harness:
    """One stand-in server plus helpers to run a provisioner against it and judge what is left."""

    server: StandInServer
    api: PodAPI = field(init=False)
    provisioners: list[Provisioner] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.api = PodAPI(api_config(self), NAMESPACE)

    @property
    def standin(self) -> StandInAPI:
        return self.server.api

    def settings(self, **changes: Any) -> ProvisionerSettings:
        values: dict[str, Any] = {
            "job": f"job-{next(_jobs)}",
            "namespace": NAMESPACE,
            "api": api_config(self),
            "owner": TRAINER,
            "max_live": 8,
            "rate": 1000.0,
            "burst": 100,
            "jitter_s": 0.0,
            "readiness_timeout_s": 5.0,
            "create_timeout_s": 5.0,
            "delete_timeout_s": 5.0,
            "poll_interval_s": 0.01,
            "settle_s": 0.05,
            "backoff_s": (0.005, 0.01, 0.02),
            "handle_signals": False,
        }
        values.update(changes)
        return ProvisionerSettings(**values)

    def provisioner(self, settings: ProvisionerSettings | None = None, shared_api: bool = True,
                    name_factory: Callable[[], str] | None = None,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep, **changes: Any) -> Provisioner:
        settings = settings or self.settings(**changes)
        prov = Provisioner(settings, api=self.api if shared_api else None,
                           name_factory=name_factory, clock=clock, sleep=sleep)
        self.provisioners.append(prov)
        return prov

    def job_pods(self, job: str) -> list[dict[str, Any]]:
        """Pods on the stand-in labelled with ``job`` (terminating ones included)."""
        label = dns_label(job, 63)
        return [p for p in self.standin.live(NAMESPACE)
                if p["metadata"]["labels"].get(JOB_LABEL) == label]

    def assert_accounted(self, prov: Provisioner) -> None:
        """Every pod of the job on the server is tracked by ``prov``, owned, and within the cap."""
        tracked = {record.name for record in prov.pods()}
        pods = self.job_pods(prov.settings.job)
        stray = [p["metadata"]["name"] for p in pods if p["metadata"]["name"] not in tracked]
        assert not stray, f"pods on the server the provisioner does not answer for: {stray}"
        for pod in pods:
            assert pod["metadata"].get("ownerReferences") == [TRAINER]
        assert len(pods) <= prov.settings.max_live

    def assert_drained(self, prov: Provisioner) -> None:
        left = prov.drain()
        assert left == 0
        assert self.job_pods(prov.settings.job) == []
        assert prov.live_count() == 0


class BudgetOnceSettled:
    """A provisioner clock on which a readiness budget runs out once every create has settled
    and ``ready`` pods are Ready, however long that took: real time until then, ``READY_BUDGET``
    ahead after.

    Windows whose never-Ready pods must run the budget out then race no wall clock (a 0.1 s
    budget was shorter than three creates and a list on a loaded machine). The jump comes at the
    readiness loop's next look at the clock after the one that found everything settled, so the
    loop has taken in the settled creates (it lists finished creates before it reads the clock)
    before its budget ends. Only the calling thread's reads count; the workers' see the jump.
    """

    def __init__(self, ready: int) -> None:
        self.ready = ready
        self.provisioner: Provisioner | None = None
        self._caller = threading.get_ident()
        self._settled_seen = False
        self._offset = 0.0

    def __call__(self) -> float:
        if threading.get_ident() == self._caller and not self._offset:
            if self._settled_seen:
                self._offset = READY_BUDGET
            else:
                self._settled_seen = self._settled()
        return time.monotonic() + self._offset

    def _settled(self) -> bool:
        prov = self.provisioner
        if prov is None:
            return False
        pods = prov.pods()
        ready = sum(record.state == "ready" for record in pods)
        return bool(pods) and ready >= self.ready and prov.settle(0)

    def watch(self, prov: Provisioner) -> Provisioner:
        self.provisioner = prov
        return prov


Window = Callable[[Harness], None]


def register(registry: dict[str, Window]) -> Callable[[Window], Window]:
    """A decorator that adds a window function to ``registry`` under its name."""
    def add(fn: Window) -> Window:
        registry[fn.__name__] = fn
        return fn
    return add


def repeat_window(h: Harness, run: Window) -> None:
    """Run one failure window REPEATS times on the same stand-in; every fault must be hit."""
    for _ in range(REPEATS):
        run(h)
        h.standin.never_ready_next = 0
    assert h.standin.pending_faults() == 0


def api_config(h: Harness, read_timeout_s: float = 2.0) -> APIConfig:
    """API settings for the stand-in; a short read timeout for windows where ours must fire."""
    return APIConfig(host=h.server.url, connect_timeout_s=1.0, read_timeout_s=read_timeout_s)


def foreign_pod(name: str) -> dict[str, Any]:
    """Another tenant's pod: no job label, its own nonce."""
    return {"metadata": {"name": name, "labels": {"team": "other", NONCE_LABEL: "not-ours"}},
            "spec": {"containers": [{"name": "c", "image": "other"}]}}


def names(*values: str) -> Callable[[], str]:
    """A pod-name factory returning ``values`` in order (to force a name collision)."""
    it = iter(values)
    return lambda: next(it)


def wait_arrival(h: Harness, verb: str, before: int) -> None:
    # The timeout only turns a hang into a failure: a loaded machine may take seconds.
    assert h.standin.wait_for(verb, before + 1, timeout=60), f"no {verb} arrived"


@pytest.fixture()
def harness() -> Iterator[Harness]:
    pytest.importorskip("kubernetes")
    with StandInServer(StandInAPI()) as server:
        h = Harness(server)
        try:
            yield h
        finally:
            for prov in h.provisioners:
                prov.drain(timeout=5.0)
            h.api.close()
