"""Fixtures for the provisioner: a stand-in API server on 127.0.0.1, and settings with tiny timings.

Every provisioner test module starts with ``pytest.importorskip("kubernetes")``, so the tier skips
cleanly where the ``[k8s]`` extra is not installed (this conftest itself needs only the stdlib).
Timings are scaled down (milliseconds instead of seconds) so each failure window can be repeated
20 times in the default tier.
"""

from __future__ import annotations

import itertools
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
READY_BUDGET = 0.1
"""Budget for windows where a never-Ready pod must run it out while healthy pods get Ready."""
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
                    name_factory: Callable[[], str] | None = None, **changes: Any) -> Provisioner:
        settings = settings or self.settings(**changes)
        prov = Provisioner(settings, api=self.api if shared_api else None,
                           name_factory=name_factory)
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
    assert h.standin.wait_for(verb, before + 1, timeout=5), f"no {verb} arrived"


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
