"""The provisioner: paced, capped, owned executor pods for one job, drained whatever happens.

Life of a create (each step answers a row of Sandman's tables 2 and A21)::

    submit() ─▶ work queue ─▶ slot under the cap ─▶ token from the bucket ─▶ create_owned()
                  │ cancel: withdrawn, never sent     │ (every retry takes a token too)
                  ▼                                   ▼
             nothing to undo          settled by the worker, never by the caller:
                                      ours → pending/ready; caller gone → deleted or kept;
                                      unknown → deleted by nonce, else left for the drain

A create runs on a provisioner worker thread, so a caller that times out, is cancelled or gets a
signal only *abandons* its ticket: the worker still learns what the API did and either keeps the
pod (owned, counted under the cap, drained at exit) or deletes it until the API says 404. The cap
counts every pod from before its create is sent until its delete is confirmed, so no path —
retries, fallbacks, late landings — can exceed it. ``drain()`` runs on ``with`` exit, on
SIGTERM/SIGINT (when handlers are installed) and from ``atexit``; it is idempotent.
"""

from __future__ import annotations

import atexit
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from .api import Pod, PodAPI
from .config import ProvisionerSettings
from .errors import (
    APINotFoundError,
    CapacityError,
    ProvisionerClosed,
    ReadinessTimeout,
    ReplyLost,
)
from .manifests import PodSettings, dns_label, job_labels, label_selector, pod_manifest
from .pacing import Clock, Sleep, TokenBucket
from .podops import (
    COLLISION,
    CREATED,
    UNKNOWN,
    CreateResult,
    Retry,
    create_owned,
    delete_until_gone,
    run_parallel,
)
from .signals import SignalDrain
from .tickets import CreateTicket, PodRecord, pod_ready

log = logging.getLogger(__name__)


class Provisioner:
    """Creates and removes one job's executor pods. Use as a context manager."""

    def __init__(self, settings: ProvisionerSettings, api: PodAPI | None = None,
                 clock: Clock = time.monotonic, sleep: Sleep = time.sleep,
                 name_factory: Callable[[], str] | None = None) -> None:
        """``api``, ``clock``, ``sleep`` and ``name_factory`` (pod names): injectable for tests."""
        self.settings = settings
        self._name_factory = name_factory
        self._api = api if api is not None else PodAPI(settings.api, settings.namespace)
        self._owns_api = api is None
        self._clock, self._sleep = clock, sleep
        self._bucket = TokenBucket(settings.rate, settings.burst, settings.jitter_s, clock, sleep)
        self._pace_lock = threading.Lock()  # one waiter sleeps on the bucket at a time: FIFO-ish
        self._lock = threading.Condition()
        self._records: dict[str, PodRecord] = {}
        self._queue: deque[CreateTicket] = deque()
        self._tickets: set[CreateTicket] = set()
        self._workers: list[threading.Thread] = []
        self._closing = threading.Event()
        self._drain_lock = threading.Lock()
        self._drained = False
        self._signals = SignalDrain(lambda: self._closing.is_set(), f"job {settings.job}")
        self.labels = job_labels(settings.job, settings.instance)
        self.stats: dict[str, int] = {}
        atexit.register(self._atexit)

    # -- public surface -----------------------------------------------------------------------

    def __enter__(self) -> Provisioner:
        if self.settings.handle_signals:
            self._signals.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.drain()

    def submit(self, pod: PodSettings | None = None, labels: Mapping[str, str] | None = None,
               annotations: Mapping[str, str] | None = None) -> CreateTicket:
        """Queue one create and return at once; the worker settles it whatever the caller does.

        ``pod`` (default: the settings' pod), ``labels`` and ``annotations`` shape this one pod;
        it is paced, capped, owned and drained like every other."""
        ticket = CreateTicket(on_cancel=self._wake, pod=pod, labels=labels,
                              annotations=annotations)
        with self._lock:
            if self._closing.is_set():
                raise ProvisionerClosed("the provisioner is draining")
            self._queue.append(ticket)
            self._tickets.add(ticket)
            if len(self._workers) < self.settings.create_workers:
                worker = threading.Thread(target=self._work, daemon=True,
                                          name=f"dockyard-create-{len(self._workers)}")
                self._workers.append(worker)
                worker.start()
            self._lock.notify_all()
        return ticket

    def provision(self, count: int, min_ready: int | None = None,
                  timeout: float | None = None) -> list[str]:
        """Create ``count`` pods and return the ``http://<podIP>:<port>`` URLs of the Ready ones.

        Waits at most ``timeout`` (default: the job's readiness budget). Pods not Ready by then
        are deleted and unsent creates withdrawn; fewer than ``min_ready`` (default ``count``)
        Ready pods raises :class:`ReadinessTimeout`, whose ``ready_urls`` stay provisioned.
        """
        min_ready = count if min_ready is None else min_ready
        budget = self.settings.readiness_timeout_s if timeout is None else timeout
        deadline = self._clock() + budget
        names = self._take_spares(count)
        tickets = [self.submit() for _ in range(count - len(names))]
        try:
            ready = self._await_ready(tickets, names, deadline)
        except BaseException:
            for ticket in tickets:
                ticket.cancel()  # abandoned, not leaked: the workers settle and clean up
            raise
        if len(ready) < min_ready:
            raise ReadinessTimeout(
                f"{len(ready)} of {count} pods Ready within {budget:g}s (needed {min_ready})",
                self._urls(ready))
        return self._urls(ready)

    def release(self, name: str) -> bool:
        """Delete one pod until it is gone and free its slot; False if the deadline came first."""
        with self._lock:
            record = self._records.get(name)
        return record is None or self._delete_record(record)

    def read_pod(self, name: str) -> Pod | None:
        """The pod ``name`` as the API has it now, None on 404 (other API errors raise)."""
        try:
            return self._api.read(name)
        except APINotFoundError:
            return None

    def pods(self) -> list[PodRecord]:
        with self._lock:
            return list(self._records.values())

    def live_count(self) -> int:
        with self._lock:
            return len(self._records)

    def urls(self) -> list[str]:
        with self._lock:
            return self._urls([r.name for r in self._records.values() if r.state == "ready"])

    def sandbox_client(self, token: str | None = None, **kwargs: Any) -> Any:
        """A ``SandboxClient`` over the Ready pods (imported late: the client is optional here)."""
        from sandbox_client.client import SandboxClient

        return SandboxClient(urls=self.urls(), token=token, **kwargs)

    def settle(self, timeout: float = 30.0) -> bool:
        """Wait until no create is queued or in flight (tests and the drain use it)."""
        end = time.monotonic() + timeout
        while True:
            with self._lock:
                pending = [t for t in self._tickets if not t.done]
            if not pending:
                return True
            if not pending[0].wait(max(0.0, end - time.monotonic())):
                return False

    # -- creates ------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing.is_set():
                    self._lock.wait()
                if not self._queue:
                    return
                ticket = self._queue.popleft()
            try:
                self._run(ticket)
            except BaseException as exc:  # never let a ticket hang: drain waits on it
                log.exception("create worker failed")
                ticket._finish("failed", exc)
            finally:
                with self._lock:
                    self._tickets.discard(ticket)

    def _stopped(self, ticket: CreateTicket) -> bool:
        return ticket.cancelled or self._closing.is_set()

    def _reserve_slot(self, ticket: CreateTicket) -> PodRecord | None:
        with self._lock:
            while len(self._records) >= self.settings.max_live:
                if self._stopped(ticket):
                    return None
                self._lock.wait(1.0)  # woken by a freed slot, a cancel or the drain
            if self._stopped(ticket):
                return None
            record = self._new_record()
            self._records[record.name] = record
            return record

    def _new_record(self) -> PodRecord:
        if self._name_factory is not None:
            name = self._name_factory()
        else:
            suffix = secrets.token_hex(3)
            name = f"{dns_label(f'dockyard-{self.settings.job}', 63 - len(suffix) - 1)}-{suffix}"
        return PodRecord(name=name, nonce=secrets.token_hex(8))

    def _pace(self, ticket: CreateTicket) -> bool:
        while not self._pace_lock.acquire(timeout=0.05):
            if self._stopped(ticket):
                return False
        try:
            if not self._bucket.acquire(cancelled=lambda: self._stopped(ticket)):
                return False
        finally:
            self._pace_lock.release()
        self._sleep(self._bucket.jitter_delay())  # outside the lock: jitter spreads, not slows
        if self._stopped(ticket):
            self._bucket.refund()
            return False
        return True

    def _run(self, ticket: CreateTicket) -> None:
        if self._stopped(ticket):
            ticket._finish("withdrawn")
            return
        record = self._reserve_slot(ticket)
        if record is None:
            ticket._finish("withdrawn", CapacityError("no room under the live-pod cap"))
            return
        ticket.state, ticket.record = "sending", record
        retry = self._retry(self.settings.create_timeout_s)
        while True:
            body = pod_manifest(ticket.pod or self.settings.pod, record.name, self.settings.job,
                                self.settings.instance, record.nonce, self.settings.owner,
                                ticket.labels, ticket.annotations)
            result = create_owned(self._api, body, retry, lambda: self._pace(ticket),
                                  lambda: self._stopped(ticket), self.settings.settle_s)
            self._count("adopted" if result.adopted else result.outcome)
            if result.outcome != COLLISION or self._stopped(ticket) or retry.expired():
                break
            # Someone else's pod holds the name: leave it alone, take a new name and nonce.
            with self._lock:
                del self._records[record.name]
                fresh = self._new_record()
                record.name, record.nonce = fresh.name, fresh.nonce
                self._records[record.name] = record
        self._settle(ticket, record, result)

    def _settle(self, ticket: CreateTicket, record: PodRecord, result: CreateResult) -> None:
        if result.outcome == CREATED and result.pod is not None:
            record.uid = result.pod["metadata"].get("uid")
            if not self._stopped(ticket):
                self._set_state(record, "pending")
                ticket._finish("created")
            elif self.settings.keep_late_pods and not self._closing.is_set():
                self._set_state(record, "spare")
                self._count("late_kept")
                ticket._finish("late-kept")
            else:
                self._count("late_deleted")
                self._delete_record(record)
                ticket._finish("late-deleted")
            return
        if result.outcome == UNKNOWN:
            # The API never told us; our nonce will: delete the pod if it is there and ours.
            self._set_state(record, "unknown")
            self._delete_record(record)
            ticket._finish("failed", result.error or ReplyLost("create outcome unknown"))
            return
        self._forget(record)  # ABSENT, or COLLISION given up: nothing of ours exists
        ticket._finish("withdrawn" if not result.sent else "failed", result.error)

    # -- readiness ----------------------------------------------------------------------------

    def _take_spares(self, count: int) -> list[str]:
        with self._lock:
            spares = [r for r in self._records.values() if r.state == "spare"][:count]
            for record in spares:
                record.state = "pending"
            return [r.name for r in spares]

    def _await_ready(self, tickets: list[CreateTicket], names: list[str],
                     deadline: float) -> list[str]:
        count = len(tickets) + len(names)
        while True:
            finished = [t for t in tickets if t.done]  # one snapshot: tickets finish meanwhile
            created = names + [t.record.name for t in finished
                               if t.state == "created" and t.record is not None]
            if created:
                self.refresh()
            with self._lock:
                states = {n: self._records[n].state for n in created if n in self._records}
            ready = [n for n, s in states.items() if s == "ready"]
            open_tickets = len(tickets) - len(finished)
            waiting = sum(s == "pending" for s in states.values())
            if len(ready) == count or (open_tickets == 0 and waiting == 0):
                break
            if self._clock() >= deadline:
                break
            self._sleep(min(self.settings.poll_interval_s, max(0.0, deadline - self._clock())))
        for ticket in tickets:
            ticket.cancel()  # creates still unsent are withdrawn; sent ones settle as late pods
        unready = [n for n, s in states.items() if s != "ready"]
        with self._lock:
            records = [self._records[n] for n in unready if n in self._records]
        run_parallel(self._delete_record, records, self.settings.delete_workers)
        return ready

    def refresh(self) -> None:
        """Poll the API once (one list by label) and update pod states: pending, ready, failed."""
        try:
            listed = self._api.list(label_selector(self.labels))
        except Exception as exc:  # a failed poll is retried on the next tick
            log.debug("listing pods failed: %s", exc)
            return
        with self._lock:
            for pod in listed:
                record = self._records.get(pod["metadata"]["name"])
                if record is None or record.state not in ("pending", "ready"):
                    continue
                phase = (pod.get("status") or {}).get("phase")
                if phase in ("Failed", "Succeeded"):
                    record.state = "failed"
                elif pod_ready(pod):
                    record.state, record.ip = "ready", pod["status"]["podIP"]

    def _urls(self, names: list[str]) -> list[str]:
        with self._lock:
            ips = [self._records[n].ip for n in names if n in self._records]
        return [f"http://{ip}:{self.settings.pod.port}" for ip in ips if ip]

    # -- deletes and the drain ----------------------------------------------------------------

    def _retry(self, budget: float) -> Retry:
        return Retry(self.settings.backoff_s, self._clock() + budget, self._clock, self._sleep)

    def _delete_record(self, record: PodRecord) -> bool:
        self._set_state(record, "deleting")
        retry = self._retry(self.settings.delete_timeout_s)
        gone = delete_until_gone(self._api, record.name, retry, self.settings.poll_interval_s,
                                 uid=record.uid, nonce=record.nonce)
        if gone:
            self._forget(record)
        else:
            log.error("pod %s not confirmed deleted; the drain, the reaper (job %s) and its owner "
                      "reference remain", record.name, self.settings.job)
        return gone

    def _set_state(self, record: PodRecord, state: str) -> None:
        with self._lock:
            record.state = state

    def _wake(self) -> None:
        with self._lock:
            self._lock.notify_all()

    def _forget(self, record: PodRecord) -> None:
        with self._lock:
            if self._records.get(record.name) is record:
                del self._records[record.name]
            self._lock.notify_all()  # a slot is free

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] = self.stats.get(key, 0) + 1

    def drain(self, timeout: float | None = None) -> int:
        """Stop creating, settle creates in flight, delete every pod of ours; idempotent.

        Returns how many pods were left undeleted (0 on success); they keep their job label for
        ``reap`` and their owner reference for the garbage collector.
        """
        with self._drain_lock:
            if self._drained:
                return 0
            self._closing.set()
            with self._lock:
                queued, self._queue = list(self._queue), deque()
                tickets = list(self._tickets)
                self._lock.notify_all()
            for ticket in queued:
                ticket._finish("withdrawn", ProvisionerClosed("drained before sending"))
            for ticket in tickets:
                ticket.cancel()
            budget = timeout if timeout is not None else (
                self.settings.create_timeout_s + self.settings.delete_timeout_s)
            self.settle(budget)
            with self._lock:
                records = list(self._records.values())
            run_parallel(self._delete_record, records, self.settings.delete_workers)
            left = self._sweep()
            self._drained = True
            log.info("drained job %s provisioner %s: %d pods left, stats %s",
                     self.settings.job, self.settings.instance, left, self.stats)
        self._release()
        return left

    def detach(self) -> list[PodRecord]:
        """Stop answering for the pods without deleting them; ``reap(job)`` removes them later.

        They keep their job label and owner reference, so the reaper and the garbage collector
        still find them. Returns what was handed over.
        """
        with self._drain_lock:
            self._closing.set()
            self.settle()
            self._drained = True
        self._release()
        return self.pods()

    def _release(self) -> None:
        """Let go of the process hooks and the client; the pods are drained or handed over."""
        self._signals.restore()
        atexit.unregister(self._atexit)
        if self._owns_api:
            self._api.close()

    def _sweep(self) -> int:
        """Delete whatever still carries this provisioner's label: late landings we never saw,
        and pods whose drain delete failed (tried once more). Returns how many are left."""
        try:
            listed = self._api.list(label_selector(self.labels))
        except Exception as exc:
            log.error("final sweep could not list pods: %s", exc)
            return self.live_count()
        with self._lock:
            # A pod still tracked (its drain delete failed) is retried under its own record:
            # ``_forget`` frees only that object, so a fresh one would leave it counted as live.
            records = [self._records.get(p["metadata"]["name"])
                       or PodRecord(p["metadata"]["name"], "", uid=p["metadata"].get("uid"))
                       for p in listed]
            strays = [r for r in records if self._records.get(r.name) is not r]
        confirmed: set[str] = set()

        def delete(record: PodRecord) -> None:
            if self._delete_record(record):
                confirmed.add(record.name)

        run_parallel(delete, records, self.settings.delete_workers)
        # Each left pod once: tracked ones are still in self._records, the others only here.
        return self.live_count() + sum(r.name not in confirmed for r in strays)

    def _atexit(self) -> None:
        self.drain()
