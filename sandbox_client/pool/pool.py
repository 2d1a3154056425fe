"""``Pool``: one executor pod per task image in use, shared by every session and grading of it.

Each rule is one someone recorded (Sandman A17-A19, A46, A47; DESIGN.md "Task images and the
pool"):

- Pods per key = in-flight work / pod capacity (``/health``: ``load.session_capacity`` and
  ``load.task_capacity``), never one pod per rollout. An acquire takes the busiest ready pod of
  its key with room (``hit``), so load packs and the rest go idle and are reclaimed.
- Pods being created count toward their key: an acquire waits on a create in flight (``join``)
  while its expected capacity holds the waiters, and only past that starts another (``miss``).
- One cap over every pod, from create until the delete is confirmed. A new key that needs room
  trims the least recently used idle pods first; busy pods never. No room within the acquire's
  budget is ``PoolFull`` (``refused``).
- A pod idle for ``idle_timeout_s`` is deleted; nothing refills on release.
- A pod still pulling its image is waited for, never replaced, within ``ready_timeout_s``; an
  unschedulable pod is reported (``PodUnschedulable``) and kept, not re-created in a loop; a pod
  that failed, or whose executor died, is deleted and the next acquire makes another.

Thread-safe: one lock guards the books; the provider and the network are called outside it. A
watcher thread moves pending pods along and reclaims idle ones; ``drain`` stops it and deletes
everything.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import requests

from ..errors import TaskExecutorError
from ..provisioner.signals import SignalDrain
from .keys import PoolSettings, pool_key
from .provider import ImageNotFound, PoolKey, Provider, ProviderError

log = logging.getLogger(__name__)

Kind = Literal["session", "task"]
_TEMPLATES_KEPT = 64
Outcome = Literal["hit", "join", "miss", "refused"]


class PoolError(TaskExecutorError):
    """The pool could not hand out a pod; ``code`` says why."""

    code = "pool_error"


class PoolFull(PoolError):
    """Every pod under the cap is busy, and none frees up within the acquire's budget."""

    code = "pool_full"


class PodUnschedulable(PoolError):
    """The cluster cannot place a pod of this key (the scheduler's reason is in the message)."""

    code = "pod_unschedulable"


class PodNotReady(PoolError):
    """A pod of this key failed, or was not ready within the readiness budget."""

    code = "pod_not_ready"


class ImageUnavailable(PoolError):
    """The provider has no such image (local: no root filesystem for the reference)."""

    code = "image_not_found"


@dataclass
class _Pod:
    name: str
    key: PoolKey
    created: float
    phase: str = "creating"
    url: str | None = None
    capacity: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    """Work in flight by kind: sessions and gradings each have their own room (``/health``
    gives each its capacity), so a pod full of sessions still takes gradings."""
    templates: dict[str, None] = field(default_factory=dict)
    """Template keys this pod served (oldest first, a bounded few): it has built them."""
    submitted: bool = False
    """The provider's create returned: before that the provider may not know the name yet, and
    its "gone" would be read as a failure (a pod was replaced that way while being made)."""
    waiters: int = 0
    last_used: float = 0.0
    idle_since: float = 0.0
    reason: str = ""
    deleting: bool = False
    checked: float = 0.0

    def room(self, kind: Kind) -> int:
        return self.capacity.get(kind, 0) - self.by_kind[kind]


@dataclass
class Lease:
    """One unit of work on one pod; ``release`` it (or use ``with``) when the work is done."""

    pool: Pool
    pod: str
    url: str
    key: PoolKey
    kind: Kind
    outcome: Outcome
    released: bool = False

    def release(self, dead: bool = False) -> None:
        """Give the room back; ``dead``: the executor did not answer (it is deleted)."""
        self.pool.release(self, dead=dead)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Pool:
    """Executors per task image for one training job (see the module docstring)."""

    def __init__(self, settings: PoolSettings, provider: Provider, *,
                 clock: Callable[[], float] = time.monotonic,
                 health: Callable[[str], Mapping[str, float]] | None = None,
                 watch: bool = True) -> None:
        self.settings = settings
        self.provider = provider
        self._clock = clock
        self._health = health or self._http_health
        self._lock = threading.Condition()
        self._pods: dict[str, _Pod] = {}
        self._names = itertools.count(1)
        self._closed = False
        self._counts: Counter[str] = Counter()
        self._latency: dict[str, list[float]] = defaultdict(list)
        self._evictions: Counter[str] = Counter()
        self._idle_pod_s = 0.0
        self._http = requests.Session()
        self._http.trust_env = False
        self._stop = threading.Event()
        self._drained = False
        # Sandman's pods outlived their job when a teardown hook did not run (A47): drain at
        # exit too, and on SIGTERM/SIGINT inside ``with pool:`` (see provisioner.signals).
        self._signals = SignalDrain(lambda: self._closed, f"pool {settings.job}")
        atexit.register(self._drain_at_exit)
        self._watcher: threading.Thread | None = None
        if watch:
            self._watcher = threading.Thread(target=self._watch, name="dockyard-pool",
                                             daemon=True)
            self._watcher.start()

    def __enter__(self) -> Pool:
        self._signals.install()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.drain()
        finally:
            self._signals.restore()

    def _drain_at_exit(self) -> None:
        if not self._drained:
            self.drain()

    # -- public calls -------------------------------------------------------------------------

    def acquire(self, image: str, spec: Any = None, kind: Kind = "session",
                timeout: float | None = None, template: str | None = None) -> Lease:
        """A lease on a ready pod of ``image`` (for ``spec``'s key) with room for one ``kind``
        of work; waits for a create in flight or for room, within ``timeout``. With
        ``template`` (the spec's template key), a pod that already built that template is
        preferred: a GRPO group builds its template once per pod, as on the default fleet."""
        key = pool_key(image, spec)
        started = self._clock()
        deadline = started + (self.settings.acquire_timeout_s if timeout is None else timeout)
        outcome: Outcome | None = None
        joined: _Pod | None = None
        with self._lock:
            try:
                while True:
                    self._check_open()
                    if joined is not None:
                        joined.waiters -= 1
                        joined = None
                    pod = self._best(key, kind, template)
                    if pod is not None:
                        if template is not None:
                            pod.templates[template] = None
                            while len(pod.templates) > _TEMPLATES_KEPT:
                                pod.templates.pop(next(iter(pod.templates)))
                        return self._lease(pod, kind, outcome or "hit", started)
                    blocked = [p for p in self._of(key) if p.phase == "unschedulable"]
                    if blocked:
                        raise PodUnschedulable(
                            f"a pod of {key.image} cannot be scheduled: {blocked[0].reason}")
                    if self._clock() >= deadline:
                        self._count("refused", started)
                        waiting = [p for p in self._of(key) if p.phase != "ready"]
                        if waiting:
                            raise PodNotReady(
                                f"pod {waiting[0].name} of {key.image} not ready within "
                                f"{deadline - started:.0f}s ({waiting[0].phase})")
                        raise PoolFull(
                            f"all {self.settings.max_pods} pods busy; no room for {key.image} "
                            f"within {deadline - started:.0f}s")
                    pending = self._pending_with_room(key)
                    if pending is not None:
                        outcome = outcome or "join"
                        pending.waiters += 1
                        joined = pending
                    elif self._room_for_one(key):
                        outcome = outcome or "miss"
                        self._start_create(key)  # releases the lock while the provider works
                        continue
                    self._lock.wait(max(0.01, min(self.settings.poll_interval_s,
                                                  deadline - self._clock())))
            finally:
                if joined is not None:
                    joined.waiters -= 1

    def release(self, lease: Lease, dead: bool = False) -> None:
        """Give a lease's room back (idempotent); ``dead`` deletes its pod."""
        with self._lock:
            if lease.released:
                return
            lease.released = True
            pod = self._pods.get(lease.pod)
            if pod is None:
                return
            pod.in_flight -= 1
            pod.by_kind[lease.kind] -= 1
            now = self._clock()
            pod.last_used = now
            if pod.in_flight == 0:
                pod.idle_since = now
            if dead and not pod.deleting:
                pod.phase, pod.reason = "failed", "its executor did not answer"
                self._evictions["dead"] += 1
                self._begin_delete(pod)
            self._lock.notify_all()

    def alive(self, lease: Lease) -> bool:
        """Whether the lease's pod still runs: its provider says so, and it answers ``/health``
        (a SIGKILLed process can look alive to its provider for a moment)."""
        if self.provider.status(lease.pod).phase != "ready":
            return False
        try:
            self._health(lease.url)
        except Exception:  # noqa: BLE001 -- any failure to answer is "not alive"
            return False
        return True

    def prewarm(self, images: Mapping[str, int], spec: Any = None) -> list[str]:
        """Start pods so that each image has at least its count (ready or on the way) for
        ``spec``'s key; returns the names started. Without a spec nothing is built: a pod
        for the wrong key is never handed out, so it would only hold room under the cap."""
        if spec is None:
            raise ValueError("prewarm needs the spec its pods are for (the key is the image plus "
                             "its CPU, memory, workspace and egress)")
        started: list[str] = []
        with self._lock:
            for image, count in images.items():
                key = pool_key(image, spec)
                while len(self._of(key)) < count and self._room_for_one(key):
                    started.append(self._start_create(key))
        return started

    def drain(self, timeout: float = 300.0) -> dict[str, Any]:
        """Stop handing out pods and delete every one (confirmed); what was deleted and what
        could not be."""
        with self._lock:
            if self._drained:
                return {"deleted": [], "left": []}
            self._drained = self._closed = True
            self._lock.notify_all()
        atexit.unregister(self._drain_at_exit)
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=timeout)
        deleted, left = [], []
        for name in sorted(set(self._pods) | set(self.provider.names())):
            try:
                self.provider.delete(name)
                deleted.append(name)
            except ProviderError as exc:
                left.append(f"{name}: {exc}")
        with self._lock:
            for name in deleted:
                if (pod := self._pods.pop(name, None)) is not None:
                    self._evictions["drain"] += 1
                    self._idle_pod_s += self._idle_for(pod)
        self.provider.close()
        self._http.close()
        return {"deleted": deleted, "left": left}

    def stats(self) -> dict[str, Any]:
        """Acquires by outcome and their latency, pods by image and state, idle pod-seconds,
        creates per acquire, evictions by reason."""
        with self._lock:
            acquires = {o: self._counts[o] for o in ("hit", "join", "miss", "refused")}
            total = sum(acquires.values())
            pods: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
            idle = self._idle_pod_s
            for pod in self._pods.values():
                state = "deleting" if pod.deleting else (
                    "idle" if pod.phase == "ready" and pod.in_flight == 0 else pod.phase)
                pods[pod.key.image][state] += 1
                idle += self._idle_for(pod)
            return {
                "acquires": acquires,
                "acquire_latency_s": {o: _percentiles(v) for o, v in self._latency.items()},
                "pods": {image: dict(states) for image, states in pods.items()},
                "pods_total": len(self._pods),
                "idle_pod_seconds": round(idle, 3),
                "creates": self._counts["create"],
                "creates_per_acquire": round(self._counts["create"] / total, 4) if total else 0.0,
                "evictions": dict(self._evictions),
            }

    # -- placement (under the lock) ------------------------------------------------------------

    def _of(self, key: PoolKey) -> list[_Pod]:
        return [p for p in self._pods.values() if p.key == key and not p.deleting]

    def _best(self, key: PoolKey, kind: Kind, template: str | None = None) -> _Pod | None:
        """A ready pod of ``key`` with room: one that built ``template`` first (template
        affinity), then the busiest (packing lets the rest go idle)."""
        ready = [p for p in self._of(key) if p.phase == "ready" and p.room(kind) > 0]
        return max(ready, key=lambda p: (template is not None and template in p.templates,
                                         p.in_flight, -p.created), default=None)

    def _pending_with_room(self, key: PoolKey) -> _Pod | None:
        for pod in self._of(key):
            if pod.phase in ("creating", "pulling") and (
                    pod.waiters < self.settings.expected_capacity):
                return pod
        return None

    def _room_for_one(self, key: PoolKey) -> bool:
        """Whether a pod may be created now: under the cap, or after trimming idle pods (least
        recently used first; deletes count until confirmed, so this may mean waiting)."""
        if len(self._pods) < self.settings.max_pods:
            return True
        if any(p.deleting for p in self._pods.values()):
            return False  # room is on its way: wait for the confirmation, trim nothing more
        idle = sorted((p for p in self._pods.values()
                       if p.phase == "ready" and p.in_flight == 0 and not p.deleting),
                      key=lambda p: p.last_used)
        if idle:
            self._evictions["lru"] += 1
            log.info("pool full: trimming idle pod %s (%s) for %s", idle[0].name,
                     idle[0].key.image, key.image)
            self._begin_delete(idle[0])
        return False

    def _start_create(self, key: PoolKey) -> str:
        name = f"{self.settings.job}-{next(self._names)}"
        pod = _Pod(name=name, key=key, created=self._clock())
        self._pods[name] = pod
        self._counts["create"] += 1
        self._lock.release()
        try:
            self.provider.create(key, name)
            pod.submitted = True
        except ImageNotFound as exc:
            self._forget(name)
            raise ImageUnavailable(str(exc)) from exc
        except ProviderError as exc:
            self._forget(name)
            raise PodNotReady(f"could not create a pod of {key.image}: {exc}") from exc
        finally:
            self._lock.acquire()
        return name

    def _forget(self, name: str) -> None:
        with self._lock:
            self._pods.pop(name, None)
            self._lock.notify_all()

    def _lease(self, pod: _Pod, kind: Kind, outcome: Outcome, started: float) -> Lease:
        pod.in_flight += 1
        pod.by_kind[kind] += 1
        pod.last_used = self._clock()
        if pod.in_flight == 1:
            self._idle_pod_s += max(0.0, pod.last_used - pod.idle_since)
        self._count(outcome, started)
        assert pod.url is not None
        return Lease(self, pod.name, pod.url, pod.key, kind, outcome)

    def _count(self, outcome: str, started: float) -> None:
        self._counts[outcome] += 1
        self._latency[outcome].append(self._clock() - started)

    def _idle_for(self, pod: _Pod) -> float:
        if pod.phase != "ready" or pod.in_flight or pod.deleting:
            return 0.0
        return max(0.0, self._clock() - pod.idle_since)

    def _begin_delete(self, pod: _Pod) -> None:
        """Delete in the background; the pod counts under the cap until it is confirmed."""
        self._idle_pod_s += self._idle_for(pod)
        pod.deleting = True
        threading.Thread(target=self._delete, args=(pod.name,), daemon=True,
                         name=f"dockyard-pool-delete-{pod.name}").start()

    def _delete(self, name: str) -> None:
        try:
            self.provider.delete(name)
        except ProviderError as exc:
            log.error("pool: delete of %s not confirmed (%s); it stays under the cap", name, exc)
            return
        self._forget(name)

    def _check_open(self) -> None:
        if self._closed:
            raise PoolError("the pool is drained")

    # -- the watcher ----------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.wait(self.settings.poll_interval_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 -- the watcher must outlive one bad round
                log.exception("pool watcher round failed")

    def tick(self) -> None:
        """One round: pending pods moved along, dead ones dropped, idle ones reclaimed."""
        with self._lock:
            pods = [p for p in self._pods.values() if p.submitted and not p.deleting]
        now = self._clock()
        for pod in pods:
            if pod.phase in ("creating", "pulling", "unschedulable"):
                self._advance(pod)
            elif pod.phase == "ready" and now - pod.checked >= self.settings.check_interval_s:
                pod.checked = now
                self._check_ready(pod)

    def _advance(self, pod: _Pod) -> None:
        status = self.provider.status(pod.name)
        capacity: dict[str, int] = {}
        if status.phase == "ready" and status.url:
            try:
                load = self._health(status.url)
                capacity = {"session": int(load.get("session_capacity", 0)),
                            "task": int(load.get("task_capacity", 0))}
            except Exception as exc:  # noqa: BLE001 -- not answering yet: look again next round
                log.debug("pool: %s not answering /health yet: %s", pod.name, exc)
                return
        with self._lock:
            if pod.deleting:
                return
            now = self._clock()
            if status.phase == "ready" and capacity:
                pod.phase, pod.url, pod.capacity = "ready", status.url, capacity
                pod.idle_since = pod.last_used = now
                log.info("pool: %s ready for %s at %s (capacity %s)", pod.name, pod.key.image,
                         status.url, capacity)
            elif status.phase in ("failed", "gone"):
                pod.phase, pod.reason = "failed", status.reason or status.phase
                self._evictions["failed"] += 1
                self._begin_delete(pod)
            elif status.phase == "unschedulable":
                if pod.phase != "unschedulable":
                    log.error("pool: %s of %s cannot be scheduled: %s", pod.name, pod.key.image,
                              status.reason)
                pod.phase, pod.reason = "unschedulable", status.reason
            elif now - pod.created > self.settings.ready_timeout_s:
                pod.phase, pod.reason = "failed", f"not ready within {now - pod.created:.0f}s"
                self._evictions["not_ready"] += 1
                self._begin_delete(pod)
            else:
                pod.phase = status.phase  # creating or pulling: waited for, never replaced
            self._lock.notify_all()

    def _check_ready(self, pod: _Pod) -> None:
        """A ready pod whose provider says it is gone is deleted; an idle one past its time."""
        status = self.provider.status(pod.name)
        with self._lock:
            if pod.deleting:
                return
            if status.phase != "ready":
                pod.phase, pod.reason = "failed", status.reason or status.phase
                self._evictions["dead"] += 1
                self._begin_delete(pod)
            elif pod.in_flight == 0 and (
                    self._clock() - pod.idle_since >= self.settings.idle_timeout_s):
                self._evictions["idle"] += 1
                log.info("pool: %s (%s) idle for %.0fs: deleting", pod.name, pod.key.image,
                         self._clock() - pod.idle_since)
                self._begin_delete(pod)
            self._lock.notify_all()

    def _http_health(self, url: str) -> Mapping[str, float]:
        answer = self._http.get(url + "/health", timeout=(5, 30))
        answer.raise_for_status()
        return answer.json()["load"]


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)], 6)

    return {"p50": at(0.5), "p99": at(0.99), "n": len(ordered)}
