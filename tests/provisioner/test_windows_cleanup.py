"""Failure windows of Sandman's table A21 after the create: other tenants' same-named pods,
deletes that fail or lose their reply, and readiness budgets against the cap. 20 repeats each.

Same judgement as test_windows.py: while the job runs, every pod of the job on the server is one
the provisioner answers for (tracked, owned, within the cap); after the drain none is left; and
another tenant's pod is never touched.

    another tenant's pod with the same name
      conflict_foreign [25]      409: the name is another tenant's; left alone, new name
      error_foreign [25]         500, read back shows another tenant's pod: left alone
      replaced_before_delete     our pod replaced by a stranger of the same name: uid spares it
    a sent delete is not a done delete
      delete_reply_lost          the delete happened, its reply is lost: retried until 404
      delete_500                 the delete failed twice with 500: retried until 404
      delete_slow                the pod terminates slowly: polled until 404
      delete_429                 429 with Retry-After on delete: honoured
      delete_read_timeout        our read timeout fires before the delete is done: retried
    readiness and the cap
      partial_ready              some pods never Ready: deleted, the rest kept (min_ready)
      fallback_respects_cap      a replacement create right after a failed one stays in the cap
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kubernetes")

from sandbox_client.provisioner.manifests import dns_label
from sandbox_client.provisioner.testing import Fault

from .conftest import (
    NAMESPACE,
    READY_BUDGET,
    BudgetOnceSettled,
    Harness,
    Window,
    api_config,
    foreign_pod,
    names,
    register,
    repeat_window,
)

WINDOWS: dict[str, Window] = {}
window = register(WINDOWS)


# -- another tenant's pod with the same name ---------------------------------------------------


def _foreign(h: Harness, *faults: Fault) -> None:
    h.standin.add_pod(NAMESPACE, foreign_pod("taken"))
    settings = h.settings()
    prov = h.provisioner(settings, name_factory=names("taken", f"ours-{settings.job}"))
    h.standin.inject(*faults)
    deletes = h.standin.count("delete")
    assert len(prov.provision(1)) == 1
    assert prov.stats.get("collision") == 1
    assert [r.name for r in prov.pods()] == [f"ours-{prov.settings.job}"]
    h.assert_accounted(prov)
    h.assert_drained(prov)
    assert h.standin.count("delete") == deletes + 1  # ours only
    status, pod = h.standin.read(NAMESPACE, "taken")
    assert status == 200 and pod["metadata"]["labels"]["team"] == "other"
    h.standin.delete(NAMESPACE, "taken")


@window
def conflict_foreign(h: Harness) -> None:
    _foreign(h)


@window
def error_foreign(h: Harness) -> None:
    _foreign(h, Fault("create", status=500, store=False, name="taken"))


@window
def replaced_before_delete(h: Harness) -> None:
    prov = h.provisioner()
    assert len(prov.provision(1)) == 1
    (record,) = prov.pods()
    with h.standin._lock:  # the pod is gone and a stranger took its name, between our calls
        del h.standin.pods[(NAMESPACE, record.name)]
    h.standin.add_pod(NAMESPACE, foreign_pod(record.name))
    assert prov.drain() == 0
    status, pod = h.standin.read(NAMESPACE, record.name)
    assert status == 200 and pod["metadata"]["labels"]["team"] == "other"
    h.standin.delete(NAMESPACE, record.name)


# -- a sent delete is not a done delete --------------------------------------------------------


def _delete_window(h: Harness, *faults: Fault, min_deletes: int, **changes: Any) -> None:
    prov = h.provisioner(**changes)
    assert len(prov.provision(1)) == 1
    h.standin.inject(*faults)
    deletes = h.standin.count("delete")
    h.assert_drained(prov)
    assert h.standin.pending_faults() == 0, "the fault was not hit"
    assert h.standin.count("delete") - deletes >= min_deletes


@window
def delete_reply_lost(h: Harness) -> None:
    _delete_window(h, Fault("delete", drop=True), min_deletes=2)


@window
def delete_500(h: Harness) -> None:
    _delete_window(h, Fault("delete", status=500, store=False, times=2), min_deletes=3)


@window
def delete_slow(h: Harness) -> None:
    h.standin.delete_after = 0.03
    try:
        _delete_window(h, min_deletes=1)
    finally:
        h.standin.delete_after = 0.0


@window
def delete_429(h: Harness) -> None:
    deletes = h.standin.count("delete")
    _delete_window(h, Fault("delete", status=429, store=False, retry_after=0.03), min_deletes=2)
    first, second = h.standin.times("delete")[deletes:deletes + 2]
    assert second - first >= 0.03


@window
def delete_read_timeout(h: Harness) -> None:
    _delete_window(h, Fault("delete", delay=0.06), min_deletes=1,
                   api=api_config(h, 0.03), shared_api=False)


# -- readiness and the cap ---------------------------------------------------------------------


@window
def partial_ready(h: Harness) -> None:
    clock = BudgetOnceSettled(1)
    prov = clock.watch(h.provisioner(clock=clock))
    h.standin.never_ready_next = 2
    urls = prov.provision(3, min_ready=1, timeout=READY_BUDGET)
    assert len(urls) == 1
    assert len(h.job_pods(prov.settings.job)) == 1
    h.assert_accounted(prov)
    h.assert_drained(prov)


@window
def fallback_respects_cap(h: Harness) -> None:
    clock = BudgetOnceSettled(1)
    prov = clock.watch(h.provisioner(max_live=2, clock=clock))
    h.standin.never_ready_next = 1
    h.standin.delete_after = 0.02
    try:
        assert len(prov.provision(2, min_ready=1, timeout=READY_BUDGET)) == 1
        assert len(prov.provision(1)) == 1  # the fallback for the pod that never got Ready
        h.assert_accounted(prov)
        h.assert_drained(prov)
    finally:
        h.standin.delete_after = 0.0
    assert h.standin.high_water_by_job[dns_label(prov.settings.job, 63)] <= 2


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_window_leaves_no_pod(harness: Harness, name: str) -> None:
    repeat_window(harness, WINDOWS[name])
