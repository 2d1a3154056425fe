"""The provisioner's ordinary life: URLs, labels and owners, the cap under churn, drain and reap."""

from __future__ import annotations

import random
import threading

import pytest

pytest.importorskip("kubernetes")

from sandbox_client.provisioner import ProvisionerClosed, ReapReport, reap
from sandbox_client.provisioner.manifests import (
    JOB_LABEL,
    NONCE_LABEL,
    PROVISIONER_LABEL,
    dns_label,
)
from sandbox_client.provisioner.testing import Fault

from .conftest import NAMESPACE, TRAINER, Harness, foreign_pod, wait_arrival


def test_provision_returns_pod_ip_urls_of_labelled_owned_pods(harness: Harness) -> None:
    prov = harness.provisioner()
    urls = prov.provision(3)
    pods = harness.job_pods(prov.settings.job)
    assert sorted(urls) == sorted(f"http://{p['status']['podIP']}:9090" for p in pods)
    assert all(url.startswith("http://127.") for url in urls)
    for pod in pods:
        labels = pod["metadata"]["labels"]
        assert labels[JOB_LABEL] == dns_label(prov.settings.job, 63)
        assert labels[PROVISIONER_LABEL] == prov.settings.instance
        assert len(labels[NONCE_LABEL]) == 16
        assert pod["metadata"]["ownerReferences"] == [TRAINER]
        assert pod["spec"]["enableServiceLinks"] is False
    assert len({p["metadata"]["labels"][NONCE_LABEL] for p in pods}) == 3
    assert sorted(prov.urls()) == sorted(urls)
    harness.assert_drained(prov)


def test_drain_on_normal_exit_removes_everything(harness: Harness) -> None:
    prov = harness.provisioner()
    with prov:
        prov.provision(4)
        assert len(harness.job_pods(prov.settings.job)) == 4
    assert harness.job_pods(prov.settings.job) == []
    assert prov.drain() == 0  # idempotent
    with pytest.raises(ProvisionerClosed):
        prov.submit()


def test_sweep_retries_a_pod_the_drain_could_not_delete_and_counts_it_once(
        harness: Harness) -> None:
    """The drain's delete fails; the sweep retries the same tracked pod: gone means freed, and
    failing again means one pod left, not two."""
    freed = harness.provisioner(delete_timeout_s=0.5)
    freed.provision(1)
    # Answered after the drain's 0.5 s delete deadline: that delete gives up, the sweep's works.
    harness.standin.inject(Fault("delete", status=500, store=False, delay=0.6))
    assert freed.drain() == 0
    assert freed.live_count() == 0
    stuck = harness.provisioner(delete_timeout_s=0.0)  # one attempt per delete, no retry
    stuck.provision(1)
    harness.standin.inject(Fault("delete", status=500, store=False, times=2))
    assert stuck.drain() == 1
    assert harness.standin.pending_faults() == 0  # the drain and the sweep both tried
    assert [r.name for r in stuck.pods()] == [
        p["metadata"]["name"] for p in harness.job_pods(stuck.settings.job)]


def test_cap_holds_under_churn_with_faults(harness: Harness) -> None:
    """Four callers provision and release against a cap of 3 while creates and deletes fail."""
    prov = harness.provisioner(max_live=3, create_workers=8)
    rng = random.Random(5)
    faults = [Fault("create", status=500), Fault("create", drop=True),
              Fault("create", status=500, store=False), Fault("delete", drop=True),
              Fault("delete", status=500, store=False), Fault("create", status=429, store=False,
                                                              retry_after=0.01)]
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            for _ in range(6):
                harness.standin.inject(rng.choice(faults))
                urls = prov.provision(1, min_ready=0, timeout=2.0)
                for record in prov.pods():
                    if record.state == "ready" and urls:
                        prov.release(record.name)
                        break
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    harness.assert_accounted(prov)
    harness.assert_drained(prov)
    assert harness.standin.high_water_by_job[dns_label(prov.settings.job, 63)] <= 3


def test_detached_pods_are_removed_by_reap(harness: Harness) -> None:
    first = harness.provisioner()
    second = harness.provisioner(job=first.settings.job)  # two trainers of one job
    other = harness.provisioner()
    first.provision(2)
    second.provision(1)
    other.provision(1)
    harness.standin.add_pod(NAMESPACE, foreign_pod("someone-else"))
    first.detach()
    second.detach()
    harness.standin.inject(Fault("delete", drop=True), Fault("delete", status=500, store=False))
    report = reap(first.settings.job, NAMESPACE, api=harness.api, poll_s=0.005,
                  backoff_s=(0.005,))
    assert (report.deleted, report.left) == (3, 0)
    assert harness.job_pods(first.settings.job) == []
    assert len(harness.job_pods(other.settings.job)) == 1  # another job's pods are not touched
    assert harness.standin.read(NAMESPACE, "someone-else")[0] == 200
    harness.assert_drained(other)


def test_reap_catches_a_pod_that_lands_while_it_runs(harness: Harness) -> None:
    """The late pod lands while the reaper's first delete is held, after its first list: only a
    reap that lists again after deleting finds it."""
    prov = harness.provisioner()
    prov.provision(1)
    (early,) = prov.detach()
    late = harness.provisioner(job=prov.settings.job)
    hold = threading.Event()
    harness.standin.inject(Fault("delete", hold=hold, name=early.name))
    deletes = harness.standin.count("delete")
    reports: list[ReapReport] = []
    reaper = threading.Thread(target=lambda: reports.append(reap(
        prov.settings.job, NAMESPACE, api=harness.api, poll_s=0.01, backoff_s=(0.005,))),
        daemon=True)  # on a failure, a reaper retrying until its deadline must not hang the run
    reaper.start()
    wait_arrival(harness, "delete", deletes)  # listed (one pod), now deleting it
    ticket = late.submit()
    assert ticket.wait(5) and ticket.state == "created"
    late.detach()
    hold.set()
    reaper.join(10)
    assert [(r.deleted, r.left) for r in reports] == [(2, 0)]
    assert harness.job_pods(prov.settings.job) == []


def test_sandbox_client_is_built_from_ready_urls(harness: Harness) -> None:
    client_module = pytest.importorskip("sandbox_client.client")
    prov = harness.provisioner()
    urls = prov.provision(2)
    client = prov.sandbox_client(token="t")
    assert isinstance(client, client_module.SandboxClient)
    assert sorted(urls) == sorted(prov.urls())
    harness.assert_drained(prov)
