"""Create-side failure windows of Sandman's table A21, 20 repeats each, on the stand-in.

Each window sets up one precise fault, runs one repetition, and then checks the two things that
matter: while the job runs, every pod of the job on the server is one the provisioner answers
for (tracked, carrying the trainer's owner reference, within the cap); after the drain, none is
left. Where the window's path is deterministic the test also checks it was taken ("condition
hit", as Sandman's tables say): the late pod was deleted, the ambiguous create adopted, etc.

Windows (A21 row in brackets where the seed names it; the others are its error-path groups):

    cancel before the API stores the pod
      queued_cancel [1]          cancel while the create waits in the pacer: withdrawn, never sent
      admission_cancel [2]       cancel during admission, the pod is then stored: deleted
      admission_cancel_keep      same, keep_late_pods: kept as an owned spare and reused
      admission_cancel_403 [3]   cancel during admission, then refused: no pod, nothing to undo
      cap_wait_timeout [4]       the deadline passes while waiting for a slot: never sent
    cancel after the API stores the pod, before the caller has it
      stored_reply_held_cancel   cancel after the store while the reply is held: deleted
      never_ready_timeout        the readiness budget ends with the pod stored, not Ready: deleted
      drain_during_admission     drain (SIGTERM path) while a create is in admission: deleted
      exception_in_with          an exception leaves the ``with`` block mid-create: deleted
      lost_reply_late_landing    cancelled, reply lost, the pod lands later: found on re-read
    an error answer is not proof of no pod
      error_after_store          500 after the store: read back, adopted, no second create
      error_before_store         500 before the store: read back 404, retried under the same name
      lost_reply_after_store     connection closed after the store: adopted
      lost_reply_before_store    connection closed before the store: retried
      read_timeout_slow_admission  our read timeout fires, admission stores later: one pod, ours
      throttled_429              429 with Retry-After: waited at least that long, then created
      readback_reply_lost        500, and the read-back's reply is lost too: adopted
      readback_errors            lost reply, then three 500s on the read-back: adopted

The windows about other tenants' pods, deletes and readiness are in test_windows_cleanup.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytest.importorskip("kubernetes")

from sandbox_client.provisioner import ReadinessTimeout
from sandbox_client.provisioner.testing import Fault
from tests.processes import wait_until

from .conftest import (
    READY_BUDGET,
    BudgetOnceSettled,
    Harness,
    Window,
    api_config,
    register,
    repeat_window,
    wait_arrival,
)

WINDOWS: dict[str, Window] = {}
window = register(WINDOWS)


# -- cancel before the API stores the pod ----------------------------------------------------


@window
def queued_cancel(h: Harness) -> None:
    prov = h.provisioner(rate=0.5, burst=1)
    creates = h.standin.count("create")
    first = prov.submit()
    assert first.wait(5) and first.state == "created"
    queued = prov.submit()  # the bucket is empty for two seconds: it waits for a token
    queued.cancel()
    assert queued.wait(5)
    assert queued.state == "withdrawn"
    assert h.standin.count("create") == creates + 1
    h.assert_accounted(prov)
    h.assert_drained(prov)


def _admission_cancel(h: Harness, keep: bool) -> None:
    prov = h.provisioner(keep_late_pods=keep)
    hold = threading.Event()
    h.standin.inject(Fault("create", hold=hold))
    creates = h.standin.count("create")
    ticket = prov.submit()
    wait_arrival(h, "create", creates)
    ticket.cancel()
    hold.set()
    assert ticket.wait(5)
    assert ticket.state == ("late-kept" if keep else "late-deleted")
    h.assert_accounted(prov)
    if keep:
        assert len(h.job_pods(prov.settings.job)) == 1
        assert len(prov.provision(1)) == 1  # the spare serves the next request
        assert h.standin.count("create") == creates + 1
    else:
        assert h.job_pods(prov.settings.job) == []
    h.assert_drained(prov)


@window
def admission_cancel(h: Harness) -> None:
    _admission_cancel(h, keep=False)


@window
def admission_cancel_keep(h: Harness) -> None:
    _admission_cancel(h, keep=True)


@window
def admission_cancel_403(h: Harness) -> None:
    prov = h.provisioner()
    hold = threading.Event()
    h.standin.inject(Fault("create", hold=hold, status=403, store=False))
    creates, deletes = h.standin.count("create"), h.standin.count("delete")
    ticket = prov.submit()
    wait_arrival(h, "create", creates)
    ticket.cancel()
    hold.set()
    assert ticket.wait(5) and ticket.state == "failed"
    assert h.standin.count("delete") == deletes  # nothing was stored, nothing to undo
    assert prov.live_count() == 0
    h.assert_drained(prov)


@window
def cap_wait_timeout(h: Harness) -> None:
    prov = h.provisioner(max_live=1)
    creates = h.standin.count("create")
    assert len(prov.provision(1)) == 1
    with pytest.raises(ReadinessTimeout):
        prov.provision(1, timeout=0.03)
    assert prov.settle(5)
    assert h.standin.count("create") == creates + 1
    h.assert_accounted(prov)
    h.assert_drained(prov)


# -- cancel after the API stores the pod -------------------------------------------------------


@window
def stored_reply_held_cancel(h: Harness) -> None:
    prov = h.provisioner()
    after = threading.Event()
    h.standin.inject(Fault("create", after_hold=after))
    ticket = prov.submit()
    wait_until(lambda: bool(h.job_pods(prov.settings.job)))  # stored, its reply held
    ticket.cancel()
    after.set()
    assert ticket.wait(5) and ticket.state == "late-deleted"
    assert h.job_pods(prov.settings.job) == []
    h.assert_drained(prov)


@window
def never_ready_timeout(h: Harness) -> None:
    # The pod never turns Ready; the budget ends once its create has settled (stored, not
    # Ready), however slow the machine: a budget shorter than the create would take the
    # admission_cancel path instead (the pod landing after the cancel, the worker's to delete).
    clock = BudgetOnceSettled(0)
    prov = clock.watch(h.provisioner(clock=clock))
    h.standin.never_ready_next = 1
    with pytest.raises(ReadinessTimeout) as caught:
        prov.provision(1, timeout=READY_BUDGET)
    assert caught.value.ready_urls == []
    assert h.job_pods(prov.settings.job) == []
    h.assert_drained(prov)


@window
def drain_during_admission(h: Harness) -> None:
    prov = h.provisioner()
    hold = threading.Event()
    h.standin.inject(Fault("create", hold=hold))
    creates = h.standin.count("create")
    ticket = prov.submit()
    wait_arrival(h, "create", creates)
    threading.Timer(0.01, hold.set).start()
    h.assert_drained(prov)  # drain waits for the create to settle, then deletes its pod
    assert ticket.state == "late-deleted"


@window
def exception_in_with(h: Harness) -> None:
    prov = h.provisioner()
    hold = threading.Event()
    h.standin.inject(Fault("create", hold=hold))
    creates = h.standin.count("create")
    with pytest.raises(RuntimeError), prov:
        prov.submit()
        wait_arrival(h, "create", creates)
        threading.Timer(0.01, hold.set).start()
        raise RuntimeError("the trainer crashed")
    assert h.job_pods(prov.settings.job) == []
    assert prov.live_count() == 0


@window
def lost_reply_late_landing(h: Harness) -> None:
    settle_s = 0.08
    job: list[str] = []

    def sleep(seconds: float) -> None:
        # The settle before the last read-back lasts until the late pod has landed, however long
        # a loaded machine takes to store it after the hold is released: the window is a landing
        # during the settle, not a race with it.
        if seconds == settle_s:
            wait_until(lambda: bool(h.job_pods(job[0])))
        time.sleep(seconds)

    prov = h.provisioner(api=api_config(h, 0.03), settle_s=settle_s, shared_api=False,
                         sleep=sleep)
    job.append(prov.settings.job)
    hold = threading.Event()
    h.standin.inject(Fault("create", hold=hold))  # admission outlasts our 30 ms read timeout
    creates, reads = h.standin.count("create"), h.standin.count("read")
    ticket = prov.submit()
    wait_arrival(h, "create", creates)
    ticket.cancel()
    wait_arrival(h, "read", reads)  # our first read-back has been sent...
    hold.set()  # ...and only then does admission store the pod
    assert ticket.wait(5) and ticket.state == "late-deleted"
    h.assert_accounted(prov)
    h.assert_drained(prov)


# -- an error answer is not proof of no pod ----------------------------------------------------


def _one_pod(h: Harness, *faults: Fault, creates_expected: int, adopted: bool,
             **changes: Any) -> None:
    prov = h.provisioner(**changes)
    h.standin.inject(*faults)
    creates = h.standin.count("create")
    assert len(prov.provision(1)) == 1
    assert h.standin.pending_faults() == 0, "the fault was not hit"
    assert h.standin.count("create") == creates + creates_expected
    assert prov.stats.get("adopted", 0) == int(adopted)
    assert len(h.job_pods(prov.settings.job)) == 1
    h.assert_accounted(prov)
    h.assert_drained(prov)


@window
def error_after_store(h: Harness) -> None:
    _one_pod(h, Fault("create", status=500), creates_expected=1, adopted=True)


@window
def error_before_store(h: Harness) -> None:
    _one_pod(h, Fault("create", status=500, store=False), creates_expected=2, adopted=False)


@window
def lost_reply_after_store(h: Harness) -> None:
    _one_pod(h, Fault("create", drop=True), creates_expected=1, adopted=True)


@window
def lost_reply_before_store(h: Harness) -> None:
    _one_pod(h, Fault("create", drop=True, store=False), creates_expected=2, adopted=False)


@window
def readback_reply_lost(h: Harness) -> None:
    _one_pod(h, Fault("create", status=500), Fault("read", drop=True),
             creates_expected=1, adopted=True)


@window
def readback_errors(h: Harness) -> None:
    _one_pod(h, Fault("create", drop=True), Fault("read", status=500, times=3),
             creates_expected=1, adopted=True)


@window
def read_timeout_slow_admission(h: Harness) -> None:
    prov = h.provisioner(api=api_config(h, 0.03), shared_api=False)
    hold = threading.Event()
    h.standin.inject(Fault("create", hold=hold))
    reads = h.standin.count("read")

    def release_after_readback() -> None:
        h.standin.wait_for("read", reads + 1)
        hold.set()  # admission finishes only after we have looked and found nothing

    threading.Thread(target=release_after_readback, daemon=True).start()
    assert len(prov.provision(1)) == 1
    assert len(h.job_pods(prov.settings.job)) == 1
    h.assert_accounted(prov)
    h.assert_drained(prov)


@window
def throttled_429(h: Harness) -> None:
    creates = h.standin.count("create")
    _one_pod(h, Fault("create", status=429, store=False, retry_after=0.03),
             creates_expected=2, adopted=False)
    first, second = h.standin.times("create")[creates:creates + 2]
    assert second - first >= 0.03


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_window_leaves_no_pod(harness: Harness, name: str) -> None:
    repeat_window(harness, WINDOWS[name])
