"""Replay a GRPO campaign on the stand-in Kubernetes API: on-demand pods, Sandman's per-image
pool, and Dockyard's pool (many sessions per pod), on one trace in one run.

The trace (seeded) has many images; each image gets groups of 8-16 rollouts that start together,
each rollout followed at once by its grading, so an image is asked for again within seconds
(Sandman Table A9). Every pod is made by the real :class:`KubernetesProvider` over the paced
Provisioner and the stand-in API, and becomes ready after a simulated create time drawn per
Sandman Table A15: image already on the node about 1.2 s p50; image pulled 13.4 / 69.4 / 85.1 s
(p50 / p90 / p99) plus that rest. The first pod of an image pulls it; later ones find it present,
or wait for that pull if it is still under way (Table A16: blocked by the same image).

The simulated pods do not run real executors: they answer ``/health`` from one small fake
executor reporting ``load.session_capacity`` and ``load.task_capacity`` (what the Pool sizes by;
``--session-capacity`` 64, ``--task-capacity`` 16 by default), because the bench measures the
pool's placement and pod accounting, not the executor (tests/pool covers pods that are real
executors). Simulated time runs ``--speed`` times faster than the wall clock; every figure is in
simulated time, and the Pool runs on the same simulated clock.

Arms (each rollout is a session, its grading a task acquired when the rollout ends):

- ``on_demand``: one pod per sandbox, created at acquire, deleted at release;
- ``sandman``: Sandman's per-image pool as its report describes it (Table 1, Tables A17-A19):
  one pod per sandbox; rollout pods on demand (its SWE jobs ran no warm rollout pods); gradings
  from 2 warm pods per image, warmed once the image is seen (its rollouts start), a used one
  deleted after its grading and the warm set refilled at once, a warm pod idle 300 s deleted.
  (Until this model, rollouts went through the warm set too, 2 pods for groups of 8-16, which
  is not Sandman's design and gave it a 56% hit rate.)
- ``dockyard``: ``sandbox_client.pool.Pool`` over the same provider (many sessions per pod).

``hit_rate`` is over gradings, Sandman's measure (Table A19: 94.5-97.7% in its replays);
``hit_rate_all`` over every acquire, rollouts too (a join, waiting on a create in flight, is not
a hit). ``pods_per_16_sessions``: the worst, at any acquire that started a create, of the
image's pods over ceil(its work in flight / 16) (goal: at most 1).

Prints a table and which of issue 22's goals the run met; with ``--json`` the last line is
``{"arms": {"on_demand": {...}, "sandman": {...}, "dockyard": {...}}}`` with ``hit_rate``,
``idle_pod_hours``, ``busy_pod_hours``, ``peak_pods``, ``creates_per_rollout``, ``leaks``,
``acquire_p50_s`` and ``acquire_p99_s`` (and the figures above, and by outcome) per arm.
``--local-hit N`` measures instead the hit latency on the local provider with a real executor
(``pool_local_hit.py``).

    python scripts/bench/bench_pool.py [--images 12] [--minutes 20] [--speed 20] [--json]
    python scripts/bench/bench_pool.py --local-hit 50
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sandbox_client.pool import Pool, PoolSettings  # noqa: E402
from sandbox_client.pool.kubernetes import KubernetesProvider  # noqa: E402
from sandbox_client.pool.pool import Lease  # noqa: E402
from sandbox_client.pool.provider import PoolKey  # noqa: E402
from sandbox_client.provisioner import (  # noqa: E402
    APIConfig,
    PodAPI,
    PodSettings,
    ProvisionerSettings,  # noqa: E402
)
from sandbox_client.provisioner.testing import StandInAPI, StandInServer  # noqa: E402

NAMESPACE = "bench"
SESSION_CAPACITY = 64
"""Sessions one simulated executor reports it can hold (``load.session_capacity`` in /health):
the executor's default ``max_sessions``."""
TASK_CAPACITY = 16
"""Gradings one simulated executor runs at once (``load.task_capacity``): the executor's
default of two per CPU, for an 8-vCPU pod."""
PULL_QUANTILES = ((0.0, 4.0), (0.5, 13.4), (0.9, 69.4), (0.99, 85.1), (1.0, 90.0))
"""Table A15, image pulled: pull time quantiles (s); plus the rest below."""
PRESENT_QUANTILES = ((0.0, 0.8), (0.5, 1.2), (0.9, 1.6), (0.99, 2.0), (1.0, 2.4))
"""Table A15/issue 22, image present: about 1.2 s p50 from create to ready."""


def quantile_draw(table: tuple[tuple[float, float], ...], rng: random.Random) -> float:
    """Inverse-CDF draw, linear between the table's quantiles."""
    u = rng.random()
    qs = [q for q, _ in table]
    i = max(1, bisect.bisect_left(qs, u))
    (q0, v0), (q1, v1) = table[i - 1], table[i]
    return v0 + (v1 - v0) * (u - q0) / (q1 - q0)


# -- the trace ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rollout:
    at_s: float
    image: str
    rollout_s: float
    grading_s: float


def make_trace(images: int, minutes: float, seed: int) -> list[Rollout]:
    """Groups of 8-16 rollouts per image, starting together, every 2-6 simulated minutes."""
    rng = random.Random(seed)
    trace: list[Rollout] = []
    for i in range(images):
        image = f"ghcr.io/bench/swe-task:{i:04d}"
        at = rng.uniform(0, 120)
        while at < minutes * 60:
            for _ in range(rng.randint(8, 16)):
                trace.append(Rollout(at + rng.uniform(0, 2), image, rng.uniform(60, 180),
                                     rng.uniform(20, 60)))
            at += rng.uniform(120, 360)
    return sorted(trace, key=lambda r: r.at_s)


# -- simulated pods ----------------------------------------------------------------------------

class _Health(BaseHTTPRequestHandler):
    session_capacity = SESSION_CAPACITY
    task_capacity = TASK_CAPACITY

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet."""

    def do_GET(self) -> None:
        # The /health fields the Pool sizes by (task_executor/service/api/health.py).
        data = json.dumps({"status": "ok", "version": "bench", "protocol": 1, "check_s": 0.0,
                           "capabilities": {}, "load": {
                               "session_capacity": self.session_capacity,
                               "task_capacity": self.task_capacity}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())


class SimulatedRunner:
    """The stand-in's pod runner for the bench: waits the simulated create time, then points the
    pod at the one fake executor."""

    def __init__(self, speed: float, seed: int, health_port: int) -> None:
        self._speed, self._port = speed, health_port
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._present_at: dict[str, float] = {}  # image -> wall time its pull is over
        self._live: set[str] = set()

    def start(self, name: str, body: dict[str, Any]) -> int:
        image = body["spec"]["containers"][0]["image"]
        with self._lock:
            now = time.monotonic()
            delay = quantile_draw(PRESENT_QUANTILES, self._rng)
            present_at = self._present_at.get(image)
            if present_at is None:  # the first pod of an image pulls it
                pull = quantile_draw(PULL_QUANTILES, self._rng)
                self._present_at[image] = now + pull / self._speed
                delay += pull
            else:  # later ones wait for that pull if it is still under way (Table A16)
                delay += max(0.0, (present_at - now) * self._speed)
            self._live.add(name)
        time.sleep(delay / self._speed)
        return self._port

    def stop(self, name: str) -> None:
        with self._lock:
            self._live.discard(name)

    def alive(self, name: str) -> bool:
        with self._lock:
            return name in self._live


# -- accounting --------------------------------------------------------------------------------

@dataclass
class Ledger:
    """Acquires by kind and outcome, pod-seconds by state, in simulated time."""

    speed: float
    t0: float = field(default_factory=time.monotonic)
    acquires: dict[str, list[float]] = field(default_factory=dict)
    kinds: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    busy_s: float = 0.0
    idle_s: float = 0.0
    creates: int = 0
    rollouts: int = 0
    peak: int = 0
    pods_per_16: float = 0.0
    """The worst, over acquires that started a create, of the image's pods then (not being
    deleted) over ceil(its work in flight / 16)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return (time.monotonic() - self.t0) * self.speed

    def acquired(self, kind: str, outcome: str, seconds: float) -> None:
        with self.lock:
            self.acquires.setdefault(outcome, []).append(seconds)
            self.kinds[kind][outcome] += 1

    def density(self, pods: int, in_flight: int) -> None:
        with self.lock:
            self.pods_per_16 = max(self.pods_per_16, pods / max(1, math.ceil(in_flight / 16)))

    def result(self, leaks: int) -> dict[str, Any]:
        every = sorted(s for v in self.acquires.values() for s in v)
        gradings = self.kinds.get(GRADING, Counter())
        hits_all = sum(c["hit"] for c in self.kinds.values())
        by = {k: {"n": len(v), "p50_s": _q(sorted(v), 0.5), "p99_s": _q(sorted(v), 0.99)}
              for k, v in sorted(self.acquires.items())}
        return {"hit_rate": round(gradings["hit"] / max(1, sum(gradings.values())), 4),
                "hit_rate_all": round(hits_all / max(1, len(every)), 4),
                "idle_pod_hours": round(self.idle_s / 3600, 3),
                "busy_pod_hours": round(self.busy_s / 3600, 3),
                "peak_pods": self.peak,
                "pods_per_16_sessions": round(self.pods_per_16, 2),
                "creates_per_rollout": round(self.creates / max(1, self.rollouts), 3),
                "leaks": leaks,
                "acquire_p50_s": _q(every, 0.5), "acquire_p99_s": _q(every, 0.99),
                "by_outcome": by}


def _q(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


ROLLOUT, GRADING = "session", "task"
"""A rollout is a session; its grading a task (the pool's two kinds of work)."""


# -- arms: one pod per sandbox -----------------------------------------------------------------

class PodPerSandbox:
    """One pod per sandbox. On demand (``warm=0``): every rollout and grading pod is created at
    its acquire and deleted at its release. Sandman's per-image pool (``warm=2``, Tables A17-A19
    and Table 1): rollout pods on demand as well (its SWE jobs ran no warm rollout pods); the
    pool serves gradings: once an image is seen (its group's rollouts start, as the trainer's
    ``prewarm``), ``warm`` ready grading pods per image, a used one deleted after its grading
    and the warm set refilled at once, a warm pod idle ``idle_timeout_s`` deleted."""

    def __init__(self, provider: KubernetesProvider, ledger: Ledger, warm: int,
                 idle_timeout_s: float) -> None:
        self.p, self.ledger, self.warm, self.idle_timeout_s = provider, ledger, warm, idle_timeout_s
        self._lock = threading.Condition()
        self._ids = iter(range(10**9))
        self._ready: dict[str, list[tuple[str, float]]] = {}  # image -> (name, idle since)
        self._warming: dict[str, int] = {}
        self._pods: dict[str, str] = {}  # name -> state: warming | idle | busy
        self._since: dict[str, float] = {}
        self._in_flight: Counter[str] = Counter()  # image -> sandboxes in use
        self._image_of: dict[str, str] = {}  # pod -> its image
        self._closing = False

    def _account(self, name: str, state: str | None) -> None:
        """Move pod ``name`` to ``state`` (None: gone), adding its time in the old state."""
        now = self.ledger.now()
        old = self._pods.get(name)
        if old in ("idle", "busy"):
            span = now - self._since[name]
            with self.ledger.lock:
                if old == "busy":
                    self.ledger.busy_s += span
                else:
                    self.ledger.idle_s += span
        if state is None:
            self._pods.pop(name, None)
        else:
            self._pods[name] = state
            self._since[name] = now
        with self.ledger.lock:
            self.ledger.peak = max(self.ledger.peak, len(self._pods))

    def _create(self, image: str, state: str) -> str:
        name = f"pod-{next(self._ids)}"
        with self._lock:
            self._image_of[name] = image
            self._account(name, state)
        with self.ledger.lock:
            self.ledger.creates += 1
        self.p.create(PoolKey(image), name)
        return name

    def _wait_ready(self, name: str) -> bool:
        while True:
            phase = self.p.status(name).phase
            if phase == "ready":
                return True
            if phase in ("failed", "gone", "unschedulable"):
                return False
            time.sleep(0.05)

    def _warm_one(self, image: str) -> None:
        name = self._create(image, "warming")
        ok = self._wait_ready(name)
        with self._lock:
            self._warming[image] -= 1
            if ok and not self._closing:
                self._account(name, "idle")
                self._ready.setdefault(image, []).append((name, self.ledger.now()))
                self._lock.notify_all()
                return
        self._delete(name)

    def _refill(self, image: str) -> None:
        with self._lock:
            if self._closing or not self.warm:
                return
            missing = self.warm - len(self._ready.get(image, [])) - self._warming.get(image, 0)
            self._warming[image] = self._warming.get(image, 0) + max(0, missing)
        for _ in range(max(0, missing)):
            threading.Thread(target=self._warm_one, args=(image,), daemon=True).start()

    def acquire(self, image: str, kind: str) -> tuple[str, str]:
        start = self.ledger.now()
        name, outcome = "", "miss"
        with self._lock:
            self._in_flight[image] += 1
            if kind == GRADING and self.warm:
                ready = self._ready.get(image) or []
                if ready:
                    name, _ = ready.pop()
                    self._account(name, "busy")
                    outcome = "hit"
        self._refill(image)  # rollouts: the image is seen; gradings: a warm pod was taken
        if not name:
            name = self._create(image, "warming")
            if not self._wait_ready(name):
                raise RuntimeError(f"{name} never got ready")
            with self._lock:
                self._account(name, "busy")
        self.ledger.acquired(kind, outcome, self.ledger.now() - start)
        if outcome == "miss":
            with self._lock:
                pods = sum(1 for n in self._pods if self._image_of[n] == image)
                self.ledger.density(pods, self._in_flight[image])
        return name, image

    def release(self, handle: tuple[str, str]) -> None:
        name, image = handle
        with self._lock:
            self._in_flight[image] -= 1
            self._account(name, None)
        self._delete(name)

    def _delete(self, name: str) -> None:
        with self._lock:
            if self._pods.get(name) is not None:
                self._account(name, None)
        self.p.delete(name)

    def reclaim(self) -> None:
        """Delete warm pods idle past the timeout (called periodically)."""
        now = self.ledger.now()
        with self._lock:
            old = [(image, entry) for image, entries in self._ready.items() for entry in entries
                   if now - entry[1] >= self.idle_timeout_s]
            for image, entry in old:
                self._ready[image].remove(entry)
        for _, (name, _) in old:
            self._delete(name)

    def drain(self) -> None:
        with self._lock:
            self._closing = True
            names = [n for entries in self._ready.values() for n, _ in entries]
            self._ready.clear()
        for name in names:
            self._delete(name)
        self.p.close()


# -- arm: Dockyard's pool ----------------------------------------------------------------------

class DockyardArm:
    """``sandbox_client.pool.Pool`` over the same provider, on the bench's simulated clock:
    sizing from the simulated executors' /health, joins, packing, 300 s idle reclaim by its own
    watcher; nothing here decides placement. Busy pod-seconds are booked from its leases (a pod
    is busy while any work is on it); idle pod-seconds, creates and outcomes are the Pool's."""

    def __init__(self, provider: KubernetesProvider, ledger: Ledger, speed: float) -> None:
        self.ledger = ledger
        # Intervals the Pool sleeps on are wall seconds; the ones it compares with its clock
        # are simulated (idle timeout, readiness and acquire budgets, the ready-pod check).
        settings = PoolSettings(job="bench-dockyard", max_pods=2000, idle_timeout_s=300.0,
                                poll_interval_s=min(0.25, 1.0 / speed), check_interval_s=5.0)
        self.pool = Pool(settings, provider, clock=ledger.now)
        self._lock = threading.Lock()
        self._work: Counter[str] = Counter()  # pod -> leases on it
        self._busy_since: dict[str, float] = {}
        self._in_flight: Counter[str] = Counter()  # image -> leases

    def acquire(self, image: str, kind: str) -> Lease:
        start = self.ledger.now()
        lease = self.pool.acquire(image, kind=kind)  # type: ignore[arg-type]
        now = self.ledger.now()
        self.ledger.acquired(kind, lease.outcome, now - start)
        with self._lock:
            self._work[lease.pod] += 1
            self._in_flight[image] += 1
            if self._work[lease.pod] == 1:
                self._busy_since[lease.pod] = now
            in_flight = self._in_flight[image]
        stats = self.pool.stats()
        if lease.outcome == "miss":
            pods = sum(n for state, n in stats["pods"].get(image, {}).items()
                       if state != "deleting")
            self.ledger.density(pods, in_flight)
        with self.ledger.lock:
            self.ledger.peak = max(self.ledger.peak, stats["pods_total"])
        return lease

    def release(self, lease: Lease) -> None:
        lease.release()
        now = self.ledger.now()
        with self._lock:
            self._in_flight[lease.key.image] -= 1
            self._work[lease.pod] -= 1
            if self._work[lease.pod] == 0:
                span = now - self._busy_since.pop(lease.pod)
                with self.ledger.lock:
                    self.ledger.busy_s += span

    def reclaim(self) -> None:
        """The Pool reclaims on its own; this only samples its pod count."""
        total = self.pool.stats()["pods_total"]
        with self.ledger.lock:
            self.ledger.peak = max(self.ledger.peak, total)

    def drain(self) -> None:
        report = self.pool.drain(timeout=120.0)
        if report["left"]:
            print(f"dockyard: drain left {report['left']}", file=sys.stderr)
        stats = self.pool.stats()
        with self.ledger.lock:
            self.ledger.idle_s = stats["idle_pod_seconds"]
            self.ledger.creates = stats["creates"]


# -- running an arm ----------------------------------------------------------------------------

def run_arm(arm: str, trace: list[Rollout], speed: float, seed: int) -> dict[str, Any]:
    health = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=health.serve_forever, daemon=True).start()
    runner = SimulatedRunner(speed, seed, health.server_address[1])
    with StandInServer(StandInAPI(pod_runner=runner)) as server:
        settings = ProvisionerSettings(
            job=f"bench-{arm}", namespace=NAMESPACE,
            api=APIConfig(host=server.url, connect_timeout_s=2.0, read_timeout_s=10.0),
            pod=PodSettings(carrier_image="dockyard-carrier:bench"), max_live=2000, rate=200.0,
            burst=200, jitter_s=0.0, create_workers=64, delete_workers=32, poll_interval_s=0.02,
            backoff_s=(0.01, 0.05), handle_signals=False)
        provider = KubernetesProvider(settings)
        ledger = Ledger(speed)
        pool_arm: Any
        if arm == "dockyard":
            pool_arm = DockyardArm(provider, ledger, speed)
        else:
            pool_arm = PodPerSandbox(provider, ledger, warm=0 if arm == "on_demand" else 2,
                                     idle_timeout_s=300.0)
        threads: list[threading.Thread] = []
        stop = threading.Event()

        def reclaimer() -> None:
            while not stop.wait(5.0 / speed):
                pool_arm.reclaim()

        threading.Thread(target=reclaimer, daemon=True).start()
        ledger.t0 = time.monotonic()
        for rollout in trace:
            wait = rollout.at_s - ledger.now()
            if wait > 0:
                time.sleep(wait / speed)
            thread = threading.Thread(target=_one, args=(pool_arm, ledger, rollout, speed),
                                      daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        stop.set()
        pool_arm.drain()
        with PodAPI(settings.api, NAMESPACE) as api:
            leaks = len(api.list(f"dockyard.io/job={settings.job}"))
    health.shutdown()
    health.server_close()
    return ledger.result(leaks)


def _one(arm: Any, ledger: Ledger, rollout: Rollout, speed: float) -> None:
    with ledger.lock:
        ledger.rollouts += 1
    for kind, hold_s in ((ROLLOUT, rollout.rollout_s), (GRADING, rollout.grading_s)):
        handle = arm.acquire(rollout.image, kind)
        time.sleep(hold_s / speed)
        arm.release(handle)


KEYS = ("hit_rate", "hit_rate_all", "acquire_p50_s", "acquire_p99_s", "peak_pods",
        "pods_per_16_sessions", "busy_pod_hours", "idle_pod_hours", "creates_per_rollout",
        "leaks")
GOALS = "goals: dockyard hit_rate >= 0.98; idle_pod_hours <= 0.5x sandman's; " \
        "pods_per_16_sessions <= 1; leaks 0"


def check_goals(arms: dict[str, Any]) -> list[str]:
    """Each goal of issue 22 this run can judge, met or not."""
    dock, sandman = arms.get("dockyard"), arms.get("sandman")
    if dock is None:
        return []
    lines = [f"hit rate (gradings) {dock['hit_rate']:.4f} >= 0.98: "
             f"{'met' if dock['hit_rate'] >= 0.98 else 'NOT met'}",
             f"pods per 16 concurrent sessions of one image {dock['pods_per_16_sessions']} <= 1: "
             f"{'met' if dock['pods_per_16_sessions'] <= 1 else 'NOT met'}",
             f"leaks {sum(a['leaks'] for a in arms.values())} == 0: "
             f"{'met' if all(a['leaks'] == 0 for a in arms.values()) else 'NOT met'}"]
    if sandman is not None:
        ratio = dock["idle_pod_hours"] / max(1e-9, sandman["idle_pod_hours"])
        lines.append(f"idle pod-hours {ratio:.2f}x Sandman's <= 0.5x: "
                     f"{'met' if ratio <= 0.5 else 'NOT met'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--minutes", type=float, default=20.0, help="simulated trace length")
    parser.add_argument("--speed", type=float, default=20.0, help="simulated s per wall s")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--arms", default="on_demand,sandman,dockyard")
    parser.add_argument("--session-capacity", type=int, default=SESSION_CAPACITY)
    parser.add_argument("--task-capacity", type=int, default=TASK_CAPACITY)
    parser.add_argument("--local-hit", type=int, metavar="N", default=0,
                        help="instead: N acquires that hit on the local provider with a real "
                             "executor (see pool_local_hit.py)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.local_hit:
        from pool_local_hit import run_local_hit

        return run_local_hit(args.local_hit, args.json)
    _Health.session_capacity, _Health.task_capacity = args.session_capacity, args.task_capacity
    trace = make_trace(args.images, args.minutes, args.seed)
    print(f"trace: {len(trace)} rollouts (+ as many gradings) over {args.images} images, "
          f"{args.minutes:g} simulated min at {args.speed:g}x; simulated executors: "
          f"{args.session_capacity} sessions, {args.task_capacity} gradings", flush=True)
    arms = {arm: run_arm(arm, trace, args.speed, args.seed) for arm in args.arms.split(",")}
    print(f"{'arm':<10}" + "".join(f"{k:>22}" for k in KEYS))
    for arm, result in arms.items():
        print(f"{arm:<10}" + "".join(f"{result[k]:>22}" for k in KEYS))
        for outcome, figures in result["by_outcome"].items():
            print(f"    {outcome:<10} n={figures['n']:<6} p50 {figures['p50_s']:.3f} s  "
                  f"p99 {figures['p99_s']:.3f} s")
    print("hit_rate: gradings that found a ready pod with room (Sandman's measure, Table A19); "
          "hit_rate_all: every acquire, rollouts too (joins are not hits)")
    print(GOALS)
    for line in check_goals(arms):
        print("  " + line)
    if args.json:
        print(json.dumps({"arms": {a: {k: r[k] for k in KEYS} | {"by_outcome": r["by_outcome"]}
                                   for a, r in arms.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
