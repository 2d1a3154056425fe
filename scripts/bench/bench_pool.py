"""Replay a GRPO campaign on the stand-in Kubernetes API: on-demand pods, Sandman's per-image
pool, and Dockyard's pool (many sessions per pod), on one trace in one run.

The trace (seeded) has many images; each image gets groups of 8-16 rollouts that start together,
each rollout followed at once by its grading, so an image is asked for again within seconds
(Sandman Table A9). Every pod is made by the real :class:`KubernetesProvider` over the paced
Provisioner and the stand-in API, and becomes ready after a simulated create time drawn per
Sandman Table A15: image already on the node about 1.2 s p50; image pulled 13.4 / 69.4 / 85.1 s
(p50 / p90 / p99) plus that rest. The first pod of an image pulls it; later ones find it present.

The simulated pods do not run real executors: they answer ``/health`` from one small fake
executor (with a session capacity), because the bench measures the pool's placement and pod
accounting, not the executor (tests/pool covers pods that are real executors). Simulated time
runs ``--speed`` times faster than the wall clock; every figure is in simulated time.

Arms:
- ``on_demand``: one pod per sandbox, created at acquire, deleted at release;
- ``sandman``: one pod per sandbox, at least 2 warm per image once seen, a used pod deleted and
  the warm set refilled, warm pods deleted after 300 s idle;
- ``dockyard``: ``sandbox_client.pool.Pool`` over the same provider (many sessions per pod).

Prints a table; with ``--json`` the last line is ``{"arms": {"on_demand": {...}, ...}}`` with
``hit_rate``, ``idle_pod_hours``, ``busy_pod_hours``, ``peak_pods``, ``creates_per_rollout``,
``leaks``, ``acquire_p50_s`` and ``acquire_p99_s`` per arm.

    python scripts/bench/bench_pool.py [--images 12] [--minutes 20] [--speed 20] [--json]
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sandbox_client.pool.kubernetes import KubernetesProvider  # noqa: E402
from sandbox_client.pool.provider import PoolKey  # noqa: E402
from sandbox_client.provisioner import (  # noqa: E402
    APIConfig,
    PodAPI,
    PodSettings,
    ProvisionerSettings,  # noqa: E402
)
from sandbox_client.provisioner.testing import StandInAPI, StandInServer  # noqa: E402

NAMESPACE = "bench"
CAPACITY = 64
"""Sessions one fake executor reports it can hold (``load.sessions_allowed`` in /health)."""
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
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet."""

    def do_GET(self) -> None:
        data = json.dumps({"status": "ok", "version": "bench", "protocol": 1, "check_s": 0.0,
                           "capabilities": {}, "load": {"sessions_live": 0.0,
                                                        "sessions_allowed": float(CAPACITY)}})
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
        self._present: set[str] = set()
        self._live: set[str] = set()

    def start(self, name: str, body: dict[str, Any]) -> int:
        image = body["spec"]["containers"][0]["image"]
        with self._lock:
            pulled = image not in self._present
            self._present.add(image)
            delay = quantile_draw(PRESENT_QUANTILES, self._rng)
            if pulled:
                delay += quantile_draw(PULL_QUANTILES, self._rng)
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
    """Acquires by outcome and pod-seconds by state, in simulated time."""

    speed: float
    t0: float = field(default_factory=time.monotonic)
    acquires: dict[str, list[float]] = field(default_factory=dict)
    busy_s: float = 0.0
    idle_s: float = 0.0
    creates: int = 0
    rollouts: int = 0
    peak: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return (time.monotonic() - self.t0) * self.speed

    def acquired(self, outcome: str, seconds: float) -> None:
        with self.lock:
            self.acquires.setdefault(outcome, []).append(seconds)

    def result(self, leaks: int) -> dict[str, Any]:
        every = sorted(s for v in self.acquires.values() for s in v)
        hits = len(self.acquires.get("hit", [])) + len(self.acquires.get("join_ready", []))
        by = {k: {"n": len(v), "p50_s": _q(sorted(v), 0.5), "p99_s": _q(sorted(v), 0.99)}
              for k, v in sorted(self.acquires.items())}
        return {"hit_rate": round(hits / len(every), 4) if every else 0.0,
                "idle_pod_hours": round(self.idle_s / 3600, 3),
                "busy_pod_hours": round(self.busy_s / 3600, 3),
                "peak_pods": self.peak,
                "creates_per_rollout": round(self.creates / max(1, self.rollouts), 3),
                "leaks": leaks,
                "acquire_p50_s": _q(every, 0.5), "acquire_p99_s": _q(every, 0.99),
                "by_outcome": by}


def _q(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


# -- arms: one pod per sandbox -----------------------------------------------------------------

class PodPerSandbox:
    """On demand (warm=0) or Sandman's per-image pool (warm=2, idle timeout): one sandbox a pod."""

    def __init__(self, provider: KubernetesProvider, ledger: Ledger, warm: int,
                 idle_timeout_s: float) -> None:
        self.p, self.ledger, self.warm, self.idle_timeout_s = provider, ledger, warm, idle_timeout_s
        self._lock = threading.Condition()
        self._ids = iter(range(10**9))
        self._ready: dict[str, list[tuple[str, float]]] = {}  # image -> (name, idle since)
        self._warming: dict[str, int] = {}
        self._pods: dict[str, str] = {}  # name -> state: warming | idle | busy
        self._since: dict[str, float] = {}
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
            if self._closing:
                return
            missing = self.warm - len(self._ready.get(image, [])) - self._warming.get(image, 0)
            self._warming[image] = self._warming.get(image, 0) + max(0, missing)
        for _ in range(max(0, missing)):
            threading.Thread(target=self._warm_one, args=(image,), daemon=True).start()

    def acquire(self, image: str) -> str:
        start = self.ledger.now()
        with self._lock:
            ready = self._ready.get(image) or []
            if ready:
                name, _ = ready.pop()
                self._account(name, "busy")
                outcome = "hit"
            else:
                name, outcome = "", "miss"
        self._refill(image)
        if not name:
            name = self._create(image, "warming")
            if not self._wait_ready(name):
                raise RuntimeError(f"{name} never got ready")
            with self._lock:
                self._account(name, "busy")
        self.ledger.acquired(outcome, self.ledger.now() - start)
        return name

    def release(self, name: str) -> None:
        with self._lock:
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
        if arm == "dockyard":
            try:
                pool_arm: Any = dockyard_arm(provider, ledger)
            except ArmUnavailable:
                provider.close()
                raise
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
    for hold_s in (rollout.rollout_s, rollout.grading_s):  # the rollout, then its grading
        name = arm.acquire(rollout.image)
        time.sleep(hold_s / speed)
        arm.release(name)


def dockyard_arm(provider: KubernetesProvider, ledger: Ledger) -> Any:
    """Dockyard's pool over the same provider. Needs ``sandbox_client.pool.Pool`` (issue 22,
    branch pool-client); until it lands this arm cannot run."""
    try:
        from sandbox_client.pool.pool import Pool  # noqa: F401
    except ImportError as exc:
        raise ArmUnavailable(f"sandbox_client.pool.Pool is not on this branch ({exc})") from exc
    raise ArmUnavailable("the dockyard arm is not wired to the Pool yet")


class ArmUnavailable(RuntimeError):
    """An arm that cannot run in this build (its result is reported as missing, not faked)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--minutes", type=float, default=20.0, help="simulated trace length")
    parser.add_argument("--speed", type=float, default=20.0, help="simulated s per wall s")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--arms", default="on_demand,sandman,dockyard")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    trace = make_trace(args.images, args.minutes, args.seed)
    print(f"trace: {len(trace)} rollouts (+ as many gradings) over {args.images} images, "
          f"{args.minutes:g} simulated min at {args.speed:g}x", flush=True)
    arms: dict[str, Any] = {}
    missing: dict[str, str] = {}
    for arm in args.arms.split(","):
        try:
            arms[arm] = run_arm(arm, trace, args.speed, args.seed)
        except ArmUnavailable as exc:
            missing[arm] = str(exc)
    keys = ("hit_rate", "acquire_p50_s", "acquire_p99_s", "peak_pods", "busy_pod_hours",
            "idle_pod_hours", "creates_per_rollout", "leaks")
    print(f"{'arm':<10}" + "".join(f"{k:>20}" for k in keys))
    for arm, result in arms.items():
        print(f"{arm:<10}" + "".join(f"{result[k]:>20}" for k in keys))
        for outcome, figures in result["by_outcome"].items():
            print(f"    {outcome:<10} n={figures['n']:<6} p50 {figures['p50_s']:.3f} s  "
                  f"p99 {figures['p99_s']:.3f} s")
    for arm, why in missing.items():
        print(f"{arm:<10} NOT RUN: {why}")
    if args.json:
        print(json.dumps({"arms": {a: {k: r[k] for k in keys} for a, r in arms.items()}}))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
