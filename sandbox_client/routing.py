"""Where a task or a new session goes: rendezvous ranking, outlier ejection, placement by room.

``Fleet`` is one ``SandboxClient``'s view of its executors, shared by all its threads:

* **Ranking.** Under ``affinity`` routing, a call's executors are ranked by rendezvous
  (highest-random-weight) hashing of its template key: an executor's weight for a key is a hash of
  the pair, highest first. A template so lives on the executors its key ranks first, every client
  agrees on them without talking, and removing an executor moves only the keys it ranked first
  (adding one, only those it now ranks first). ``round_robin`` starts from the next executor in
  turn instead.
* **Ejection.** An executor whose connect failed is out of rotation at once, and so is one whose
  connections broke mid-call ``BREAKS_TO_EJECT`` times in a row (it takes requests and never
  answers them): while any other is in, no call is sent there. A monitor thread probes it with
  ``GET /health`` on a jittered, doubling backoff and re-admits it when it answers (so does any
  answer it gives meanwhile). When every executor is out, calls try them anyway: failing is
  certain otherwise.
* **Room.** This client's calls in flight are counted per executor, and the sessions it holds
  there. An executor is full for tasks when they reach its task capacity, for session starts when
  starts plus held sessions reach its session capacity, or, after it answered 429, at the number
  it was running for us then, until its Retry-After has passed. A call takes the first executor in
  its preference (the first ``affinity_k`` least busy first, then the rest by rank) that has room;
  when none has, a fresh call waits in the client for one of this client's calls to end instead
  of being sent to be refused.
* **Capacity is learned, and learned again.** The first call placed on an executor asks its
  ``/health`` first (one caller asks; the others placed there meanwhile wait for the answer), so a
  cold batch sends no more than fits and meets no 429 (issue #25: 16 gradings on a capacity-4
  executor took 7.95 s waiting out 429s, 4.09 s after one ``/health``). What was learned is not
  trusted forever: it is asked again after ``CAPACITY_TTL_S``, after a 429 all the same, and after
  a broken connection or an ejection (an executor restarted with other limits); any ``/health``
  the client reads (probes, ``SandboxClient.health``) refreshes it too. An executor that does not
  answer ``/health`` keeps an unknown capacity (no limit but its 429s) until the next due time.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from .errors import ExecutorUnreachable

log = logging.getLogger(__name__)

Kind = Literal["task", "session"]
"""What a placed call starts: a grading (holds a task slot) or a session."""

#: Connections broken after connecting, in a row with no answer between, that eject an executor.
BREAKS_TO_EJECT = 3
#: How long a 429 without Retry-After marks an executor full.
DEFAULT_BUSY_S = 1.0
#: Longest a waiting call sleeps before looking again (wake-ups normally come sooner).
_RECHECK_S = 1.0
#: Seconds a capacity learned from ``/health`` is trusted before it is asked again.
CAPACITY_TTL_S = 60.0


def rendezvous_rank(key: str, urls: Iterable[str]) -> list[str]:
    """``urls`` by their rendezvous weight for ``key``, highest first (stable and independent of
    the order ``urls`` come in)."""
    return sorted(urls, key=lambda url: (_weight(key, url), url), reverse=True)


def _weight(key: str, url: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{key}\0{url}".encode()).digest()[:8], "big")


def backoff_delay(
    attempt: int, base: float, cap: float, rng: random.Random, floor: float = 0.0
) -> float:
    """``base`` doubled ``attempt`` times up to ``cap``, at least ``floor``, jittered upwards by
    up to a quarter (so waits that began together do not end together)."""
    return max(floor, min(cap, base * 2**attempt)) * (1.0 + 0.25 * rng.random())


@dataclass(frozen=True)
class ExecutorStatus:
    """One executor as this client sees it (``SandboxClient.fleet_status()``)."""

    url: str
    #: False while ejected: its last connect failed and no probe has been answered since.
    healthy: bool
    #: Requests of this client on their way to it or waiting for its answer.
    in_flight: int
    #: The last transport error or failed probe, if any (kept after re-admission).
    last_error: str | None
    #: Times it was taken out of rotation.
    ejections: int
    #: Calls of this client whose connect to it failed (probes not counted).
    connect_failures: int
    #: Gradings it runs at once, from its ``/health`` (None until one was seen).
    task_capacity: int | None
    #: Sessions it keeps at once, from its ``/health`` (None until one was seen).
    session_capacity: int | None
    #: Sessions this client started there and has not finished or closed.
    sessions: int
    #: Seconds until it is probed again (None unless ejected).
    next_probe_s: float | None


@dataclass
class _Executor:
    url: str
    healthy: bool = True
    in_flight: int = 0
    placed: dict[str, int] = field(default_factory=dict)
    """Calls placed here by kind and not ended yet."""
    full: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Kind -> (calls of ours it held when it last answered 429, monotonic time that holds till)."""
    task_capacity: int | None = None
    session_capacity: int | None = None
    sessions: int = 0
    """Sessions of this client live there (started, not yet finished or closed)."""
    learned_at: float | None = None
    """Monotonic time its capacity was last asked (answered or not); None: ask before using it."""
    learning: bool = False
    """A call is asking its ``/health`` for its capacity."""
    last_error: str | None = None
    ejections: int = 0
    connect_failures: int = 0
    broken: int = 0
    """Connections broken mid-call since its last answer."""
    gone: bool = False
    """Since its last answer a connect failed, or ``/health`` went unanswered: what it held is
    as good as lost."""
    suspect: bool = False
    """A connection to it broke since its last answer: is it still there?"""
    checking: bool = False
    """A call is asking its ``/health`` whether it is (see ``Fleet.still_there``)."""
    generation: int = 0
    """Bumped by every break and ejection: an answer to a request sent before one is old news
    (a reply read just before a kill must not put the dead executor back in rotation)."""
    probes: int = 0
    next_probe: float = 0.0

    def has_room(self, kind: str, now: float) -> bool:
        running = self.placed.get(kind, 0)
        if kind == "task":
            capacity = self.task_capacity
        else:
            capacity, running = self.session_capacity, running + self.sessions
        if capacity is not None and running >= capacity:
            return False
        mark = self.full.get(kind)
        return mark is None or mark[1] <= now or self.placed.get(kind, 0) < mark[0]

    def learn_capacity(self, load: Mapping[str, float], now: float) -> None:
        # A /health without the keys (an older executor) leaves the capacity unknown.
        self.task_capacity = _capacity(load, "task_capacity")
        self.session_capacity = _capacity(load, "session_capacity")
        self.learned_at = now


def _capacity(load: Mapping[str, float], key: str) -> int | None:
    value = load.get(key)
    return int(value) if isinstance(value, (int, float)) and value >= 0 else None


class Fleet:
    """Ranking, health and room of a fixed list of executors; thread-safe.

    ``probe(url)`` asks an executor's ``/health`` and returns its ``load`` (raising when it does
    not answer); the monitor thread calls it for ejected executors only. ``learn(url)`` does the
    same for a call about to be placed on an executor whose capacity is unknown or due
    (None: capacity is known only from ``/health`` answers read otherwise, and never expires).
    """

    def __init__(
        self,
        urls: Iterable[str],
        *,
        routing: str,
        affinity_k: int,
        probe: Callable[[str], Mapping[str, float]],
        probe_base_s: float,
        probe_max_s: float,
        learn: Callable[[str], Mapping[str, float]] | None = None,
        capacity_ttl_s: float = CAPACITY_TTL_S,
    ) -> None:
        self.urls = tuple(urls)
        self._distinct = tuple(dict.fromkeys(self.urls))
        self._executors = {url: _Executor(url) for url in self._distinct}
        self._routing = routing
        self._affinity_k = affinity_k
        self._probe = probe
        self._probe_base_s = probe_base_s
        self._probe_max_s = probe_max_s
        self._learn = learn
        self._capacity_ttl_s = capacity_ttl_s
        self._rng = random.Random()
        self._turns = itertools.count()
        self._cond = threading.Condition()
        self._monitor: threading.Thread | None = None
        self._closed = False
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Calls waiting in the client for an executor with room."""
        with self._cond:
            return self._waiting

    # -- choosing -------------------------------------------------------------------------------

    def next_turn(self) -> int:
        """The next round-robin position (a shared counter)."""
        with self._cond:
            return next(self._turns) % len(self.urls)

    def rank(self, key: str) -> list[str]:
        """Every distinct executor in the order a call for ``key`` prefers them, before health and
        room are considered (round-robin advances the shared counter)."""
        if self._routing == "round_robin":
            start = self.next_turn()
            return list(dict.fromkeys(self.urls[start:] + self.urls[:start]))
        return rendezvous_rank(key, self._distinct)

    def reserve(
        self, kind: Kind, ranked: list[str], exclude: set[str], wait_until: float | None
    ) -> str | None:
        """The executor this attempt goes to, counted as placed until ``release``; None when
        every executor in rotation is in ``exclude``.

        Until ``wait_until`` (a ``time.monotonic()`` value; None: never wait), a call that finds
        no executor with room waits for one.
        """
        asked: set[str] = set()  # executors this call asked the capacity of: not again
        with self._cond:
            while True:
                now = time.monotonic()
                healthy = [url for url in ranked if self._executors[url].healthy]
                if not healthy:
                    rest = [url for url in ranked if url not in exclude]
                    choice = rest[0] if rest else None
                    break
                candidates = [url for url in healthy if url not in exclude]
                if not candidates:
                    return None
                choice = self._preferred(kind, candidates, now)
                if choice not in asked:
                    step = self._learn_if_due(self._executors[choice], now)
                    if step == "asked":
                        asked.add(choice)
                    if step is not None:
                        continue  # learned, or waited for whoever learns it: choose again
                if (
                    self._executors[choice].has_room(kind, now)
                    or wait_until is None
                    or now >= wait_until
                    or self._closed
                ):
                    break
                self._waiting += 1
                try:
                    self._cond.wait(min(wait_until - now, self._next_expiry(kind, now)))
                finally:
                    self._waiting -= 1
            if choice is not None:
                placed = self._executors[choice].placed
                placed[kind] = placed.get(kind, 0) + 1
            return choice

    def _learn_if_due(
        self, executor: _Executor, now: float
    ) -> Literal["asked", "waited"] | None:
        """With the lock held: when ``executor``'s capacity must be asked before a call is placed
        there, ask its ``/health`` (the lock released meanwhile: "asked"), or, while another call
        asks it for the first time, wait a while for that answer ("waited"); None when what is
        known will do."""
        if self._learn is None or self._closed:
            return None
        never = executor.learned_at is None
        if not never and (executor.learning or now - executor.learned_at < self._capacity_ttl_s):
            return None  # known: a refresh under way elsewhere need not hold this call
        if executor.learning:
            self._cond.wait(_RECHECK_S)
            return "waited"
        executor.learning = True
        self._cond.release()
        load: Mapping[str, float] | None = None
        try:
            load = self._learn(executor.url)
        except Exception as exc:  # noqa: BLE001 -- whatever it is, the call goes ahead unlimited
            log.info("%s: capacity not learned (%s); placing without it", executor.url, exc)
        finally:
            self._cond.acquire()
            executor.learning = False  # even on an interrupt: the waiters must not wait forever
            self._cond.notify_all()
        if load is None:
            # Not asked again before the TTL: a dead executor costs one failed /health, not one
            # per call (its calls fail and eject it on their own).
            executor.learned_at = time.monotonic()
        else:
            executor.learn_capacity(load, time.monotonic())
            log.info("%s: capacity learned: %s gradings, %s sessions", executor.url,
                     executor.task_capacity, executor.session_capacity)
        return "asked"

    def _relearn(self, executor: _Executor) -> None:
        """With the lock held: what was learned of ``executor``'s capacity is in doubt (a 429 all
        the same, a broken connection, an ejection); the next call placed there asks again."""
        if executor.learned_at is not None:
            executor.learned_at = float("-inf")

    def _preferred(self, kind: str, candidates: list[str], now: float) -> str:
        head = candidates[: self._affinity_k] if self._routing == "affinity" else []
        # Among a template's own executors the least busy takes it (the sort is stable: rank
        # breaks ties); a full one yields to the next with room, in preference order.
        order = sorted(head, key=lambda url: self._executors[url].placed.get(kind, 0))
        order += candidates[len(head) :]
        return min(order, key=lambda url: not self._executors[url].has_room(kind, now))

    def _next_expiry(self, kind: str, now: float) -> float:
        ends = [
            mark[1] - now
            for executor in self._executors.values()
            if (mark := executor.full.get(kind)) is not None and mark[1] > now
        ]
        return min([_RECHECK_S, *ends])

    def release(self, url: str, kind: Kind, busy: bool = False, retry_after: float | None = None
                ) -> None:
        """The attempt placed on ``url`` ended; ``busy``: it was answered 429/503, so ``url``
        counts as full at what it still runs for us until ``retry_after`` has passed."""
        with self._cond:
            executor = self._executors[url]
            executor.placed[kind] -= 1
            if busy:
                now = time.monotonic()
                limit = executor.placed[kind]
                earlier = executor.full.get(kind)
                if earlier is not None and earlier[1] > now:
                    limit = min(limit, earlier[0])
                until = now + (retry_after if retry_after else DEFAULT_BUSY_S)
                executor.full[kind] = (limit, until)
                self._relearn(executor)
            self._cond.notify_all()

    def session_opened(self, url: str) -> None:
        """A session this client started on ``url`` is live: it holds room there."""
        with self._cond:
            if (executor := self._executors.get(url)) is not None:
                executor.sessions += 1

    def session_ended(self, url: str) -> None:
        """A session this client started on ``url`` was finished, closed or dropped."""
        with self._cond:
            if (executor := self._executors.get(url)) is not None and executor.sessions > 0:
                executor.sessions -= 1
                self._cond.notify_all()

    # -- what calls saw -------------------------------------------------------------------------

    def entered(self, url: str) -> int | None:
        """A request to ``url`` leaves; returns the generation to hand to ``answered``."""
        with self._cond:
            if (executor := self._executors.get(url)) is None:
                return None
            executor.in_flight += 1
            return executor.generation

    def left(self, url: str) -> None:
        with self._cond:
            if (executor := self._executors.get(url)) is not None:
                executor.in_flight -= 1

    def connect_failed(self, url: str, error: str) -> None:
        """A call could not connect to ``url``: take it out of rotation and start probing it."""
        with self._cond:
            executor = self._executors.get(url)
            if executor is not None:
                executor.connect_failures += 1
                executor.gone = True
                self._eject(executor, error)

    def connection_broke(self, url: str, error: str) -> None:
        """A call's connection to ``url`` broke after connecting (no answer came back)."""
        with self._cond:
            executor = self._executors.get(url)
            if executor is None:
                return
            executor.broken += 1
            executor.generation += 1
            executor.suspect = True
            executor.last_error = error
            self._relearn(executor)
            if executor.broken >= BREAKS_TO_EJECT:
                self._eject(executor, f"{executor.broken} connections broke in a row: {error}")

    def _eject(self, executor: _Executor, error: str) -> None:
        executor.last_error = error
        executor.generation += 1
        self._relearn(executor)
        if executor.healthy:
            executor.healthy = False
            executor.ejections += 1
            executor.probes = 0
            executor.next_probe = time.monotonic() + self._probe_delay(0)
            log.warning("%s ejected (%s); probing its /health until it answers", executor.url,
                        error)
            if self._monitor is None and not self._closed:
                self._monitor = threading.Thread(
                    target=self._watch, name="dockyard-fleet-monitor", daemon=True
                )
                self._monitor.start()
        self._cond.notify_all()

    def answered(
        self, url: str, load: Mapping[str, float] | None = None, since: int | None = None
    ) -> None:
        """``url`` answered (anything, an error status included): it is in rotation, unless the
        request left before a break or ejection there (``since``: its ``entered`` generation;
        None for an answer to a request sent just now)."""
        with self._cond:
            executor = self._executors.get(url)
            if executor is None:
                return
            if load is not None:
                executor.learn_capacity(load, time.monotonic())
            if since is not None and since != executor.generation:
                return
            executor.broken = 0
            executor.gone = executor.suspect = False
            if not executor.healthy:
                executor.healthy = True
                log.info("%s answers again; back in rotation", url)
                self._cond.notify_all()

    def failed(self, url: str, error: str) -> None:
        """A call to ``url`` failed otherwise (a read timeout): its last error, no ejection."""
        with self._cond:
            if (executor := self._executors.get(url)) is not None:
                executor.last_error = error

    def still_there(self, url: str) -> bool:
        """Whether ``url`` may still hold what a call whose reply was lost sent it. After a
        broken connection one caller asks its ``/health`` and the others wait for that answer:
        there only if it answers. So an executor killed under many calls costs one failed
        connect, not one per call."""
        with self._cond:
            executor = self._executors.get(url)
            if executor is None:
                return True
            while executor.checking:
                self._cond.wait()
            if executor.gone or not executor.suspect:
                return not executor.gone
            executor.checking = True
        try:
            load = self._probe(url)
        except Exception as exc:  # no answer: what it held is as good as gone
            with self._cond:
                executor.checking = False
                executor.gone = True
                if isinstance(exc, ExecutorUnreachable):
                    executor.connect_failures += 1
                    self._eject(executor, exc.message)
                else:
                    executor.broken += 1
                    self._eject(executor, f"/health unanswered after a broken connection: {exc}")
            return False
        with self._cond:
            executor.checking = False
            self._cond.notify_all()
        self.answered(url, load)
        return True

    def status(self) -> dict[str, ExecutorStatus]:
        """Every executor's state, by URL, in the configured order."""
        now = time.monotonic()
        with self._cond:
            return {
                e.url: ExecutorStatus(
                    url=e.url,
                    healthy=e.healthy,
                    in_flight=e.in_flight,
                    last_error=e.last_error,
                    ejections=e.ejections,
                    connect_failures=e.connect_failures,
                    task_capacity=e.task_capacity,
                    session_capacity=e.session_capacity,
                    sessions=e.sessions,
                    next_probe_s=None if e.healthy else max(0.0, e.next_probe - now),
                )
                for e in self._executors.values()
            }

    def close(self) -> None:
        """Stop the monitor (a probe under way ends on its own: the thread is a daemon)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the monitor ----------------------------------------------------------------------------

    def _probe_delay(self, attempt: int) -> float:
        return backoff_delay(attempt, self._probe_base_s, self._probe_max_s, self._rng)

    def _watch(self) -> None:
        """Probe ejected executors when due; ends when none is ejected (restarted on the next)."""
        while True:
            with self._cond:
                ejected = [e for e in self._executors.values() if not e.healthy]
                if self._closed or not ejected:
                    self._monitor = None
                    return
                now = time.monotonic()
                due = [e.url for e in ejected if e.next_probe <= now]
                if not due:
                    self._cond.wait(min(e.next_probe for e in ejected) - now)
                    continue
            for url in due:
                self._probe_once(url)

    def _probe_once(self, url: str) -> None:
        try:
            load = self._probe(url)
        except Exception as exc:  # whatever stops it answering, it stays out
            with self._cond:
                executor = self._executors[url]
                if not executor.healthy:
                    executor.probes += 1
                    executor.gone = True
                    executor.last_error = f"probe: {exc}"
                    executor.next_probe = time.monotonic() + self._probe_delay(executor.probes)
            return
        self.answered(url, load)
