"""A fleet of local executors under GRPO groups: round-robin against template affinity, then one
executor killed mid-run.

Each run starts ``--workers`` fresh executors with the code ``dockyard fleet up`` uses
(``sandbox_client.cli.fleet``), and submits ``--tasks`` tasks x ``--rollouts`` rollouts at once
(every GRPO group whole, all groups together) through one ``SandboxClient``. Every task is the
demo repository with a ``setup`` of its own (``--cpu-setup S``, default 2: S seconds of CPU work,
as a ``pip install`` or a build does; or any ``--setup`` command; then a line naming the task), so
it has a template of its own; rollouts alternate the gold patch and the empty one, so every
verdict is known in advance. Printed per run: templates built (the executors' ``/metrics``), 429s
the executors answered and 429s that reached the caller, wall time, p50/p99 submit-to-verdict,
verdicts wrong or missing. The two policies run in the same invocation, in alternating order when
``--rounds`` > 1. The kill run (affinity) SIGKILLs, after ``--kill-after`` verdicts, the executor
with the most gradings in flight, and reports what the client saw of it.

Usage (as root: the executors' sandbox and overlay workspaces need it):
    python scripts/bench/bench_fleet.py [--workers 4] [--tasks 8] [--rollouts 8]
        [--cpu-setup 2 | --setup 'sleep 2'] [--capacity 32] [--rounds 1] [--kill-after 16]

A setup that sleeps costs round-robin nothing it can see here: its 32 builds sleep side by side,
and the 64 test runs keep both CPUs busy either way. The builds cost what a real setup spends
(CPU, the package index, disk), so the default setup spends CPU.

``--capacity`` (each executor's ``DOCKYARD_MAX_TASKS``) defaults to 32: rendezvous hashing of 8
keys over 4 executors can put 4 templates (32 rollouts) on one, and a group that finds its
executor full spills to its next in rank and builds its template there too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sandbox_client import SandboxClient, TaskExecutorError  # noqa: E402
from sandbox_client.cli.fleet import Worker, start_worker, stop_workers, wait_ready  # noqa: E402
from task_executor.demo import DemoTask, make_demo_task  # noqa: E402
from task_executor.service.lifecycle import unmount_under  # noqa: E402

FAST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


@dataclass
class Outcome:
    task_id: str
    seconds: float
    status: str
    expected: str
    error: str | None = None


@dataclass
class Run:
    name: str
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def figures(self) -> dict[str, Any]:
        times = sorted(o.seconds for o in self.outcomes)
        wrong = sum(1 for o in self.outcomes if o.status != o.expected and o.error is None)
        return {
            "run": self.name,
            "verdicts": sum(1 for o in self.outcomes if o.error is None),
            "wrong": wrong,
            "missing": sum(1 for o in self.outcomes if o.error is not None),
            "surfaced_429": sum(1 for o in self.outcomes if o.error and "429" in o.error),
            "errors": dict(Counter(o.error for o in self.outcomes if o.error)),
            "wall_s": round(self.wall_s, 2),
            "p50_s": round(statistics.median(times), 2),
            "p99_s": round(percentile(times, 99), 2),
            **self.metrics,
            **self.notes,
        }


def percentile(ordered: list[float], p: float) -> float:
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def scrape(url: str) -> dict[str, float]:
    """The fleet-wide figures one executor contributes, from its ``/metrics``."""
    text = requests.get(url + "/metrics", timeout=30).text
    found = Counter[str]()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "dockyard_template_builds_total":
                found["templates_built"] += sample.value
            elif sample.name == "dockyard_grading_templates_total":
                found[f"gradings_template_{labels['template']}"] += sample.value
            elif (sample.name == "dockyard_http_requests_total"
                  and labels.get("route") == "/task/submit" and labels.get("status") == "429"):
                found["answered_429"] += sample.value
    return dict(found)


class Fleet:
    """``workers`` executors started as ``dockyard fleet up`` starts them, in ``base``."""

    def __init__(self, base: Path, workers: int, threads: int) -> None:
        self.base = base
        self.workers: list[Worker] = [
            start_worker(i, "127.0.0.1", 0, base, None, threads, workers) for i in range(workers)
        ]
        with SandboxClient("http://127.0.0.1:1", timeout=(1.0, 3.0)) as probe:
            dead = wait_ready(self.workers, probe, 120.0, threading.Event())
        if dead is not None:
            raise RuntimeError(f"executor {dead.index} died:\n{dead.log_tail()}")
        self.urls = [str(w.url) for w in self.workers]

    def metrics(self, skip: frozenset[str] = frozenset()) -> dict[str, int]:
        total = Counter[str]()
        for url in self.urls:
            if url not in skip:
                total.update(scrape(url))
        return {name: int(value) for name, value in sorted(total.items())}

    def stop(self) -> None:
        stop_workers(self.workers, grace=10.0)
        unmount_under(self.base)


def groups(demo: DemoTask, tasks: int, rollouts: int, setup: str, tag: str) -> list[dict]:
    """All rollouts of every task, group after group (each task a template of its own)."""
    specs = []
    for t in range(tasks):
        for r in range(rollouts):
            gold = r % 2 == 0
            specs.append({
                **demo.request(f"{tag}-t{t}-r{r}", demo.gold_patch if gold else ""),
                "setup": [setup, f"echo task-{t} > .bench-task"],
                "env": dict(FAST_ENV),
                "expected": "resolved" if gold else "unresolved",
            })
    return specs


def grade_all(client: SandboxClient, specs: list[dict], on_verdict: Any = None) -> Run:
    run = Run(name="")
    lock = threading.Lock()
    start = threading.Barrier(len(specs))

    def one(spec: dict) -> Outcome:
        expected = spec.pop("expected")
        start.wait()
        began = time.monotonic()
        try:
            result = client.run_task(spec)
            outcome = Outcome(spec["task_id"], time.monotonic() - began, result.status, expected,
                              None if result.status != "execution_error" else
                              f"execution_error:{result.error_code}")
        except TaskExecutorError as exc:
            outcome = Outcome(spec["task_id"], time.monotonic() - began, "none", expected,
                              type(exc).__name__ + (f":{exc.status}" if hasattr(exc, "status")
                                                    else ""))
        with lock:
            run.outcomes.append(outcome)
            if on_verdict is not None:
                on_verdict(len(run.outcomes))
        return outcome

    began = time.monotonic()
    with ThreadPoolExecutor(len(specs)) as pool:
        list(pool.map(one, specs))
    run.wall_s = time.monotonic() - began
    return run


def policy_run(args: argparse.Namespace, demo: DemoTask, work: Path, routing: str, tag: str
               ) -> Run:
    fleet = Fleet(work / tag, args.workers, args.capacity + 8)
    try:
        with SandboxClient(fleet.urls, routing=routing, timeout=(5.0, 60.0)) as client:
            run = grade_all(client, groups(demo, args.tasks, args.rollouts, args.setup, tag))
        run.name = routing
        run.metrics = fleet.metrics()
        return run
    finally:
        fleet.stop()


def kill_run(args: argparse.Namespace, demo: DemoTask, work: Path) -> Run:
    fleet = Fleet(work / "kill", args.workers, args.capacity + 8)
    killed: dict[str, Any] = {}
    try:
        with SandboxClient(fleet.urls, timeout=(5.0, 60.0)) as client:

            def on_verdict(count: int) -> None:
                if count != args.kill_after or killed:
                    return
                status = client.fleet_status()
                url = max(status, key=lambda u: status[u].in_flight)
                worker = next(w for w in fleet.workers if w.url == url)
                os.kill(worker.process.pid, signal.SIGKILL)
                killed.update(url=url, in_flight=status[url].in_flight, at=time.monotonic())

            run = grade_all(client, groups(demo, args.tasks, args.rollouts, args.setup, "kill"),
                            on_verdict)
            seen = client.fleet_status()[killed["url"]]
        run.name = "affinity, one executor killed"
        run.metrics = fleet.metrics(skip=frozenset({killed["url"]}))  # its own died with it
        run.notes.update(
            killed_in_flight=killed["in_flight"],
            killed_connect_failures=seen.connect_failures,
            killed_ejections=seen.ejections,
            killed_healthy_at_end=seen.healthy,
        )
        return run
    finally:
        fleet.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--setup", help="setup command of every task (e.g. 'sleep 2')")
    parser.add_argument("--cpu-setup", type=float, metavar="S", default=2.0,
                        help="without --setup: S seconds of CPU time spent in setup (default 2)")
    parser.add_argument("--capacity", type=int, default=32,
                        help="gradings each executor runs at once (DOCKYARD_MAX_TASKS)")
    parser.add_argument("--rounds", type=int, default=1, help="round-robin/affinity pairs")
    parser.add_argument("--kill-after", type=int, default=16,
                        help="verdicts before the kill run's SIGKILL (0: no kill run)")
    args = parser.parse_args()
    if args.setup is None:
        args.setup = (f'python3 -c "import time; t = time.process_time(); '
                      f'all(iter(lambda: time.process_time() - t < {args.cpu_setup}, False))"')
    os.environ["DOCKYARD_MAX_TASKS"] = str(args.capacity)  # inherited by the executors
    # A SIGTERM unwinds like Ctrl-C: every fleet's ``finally`` stops its executors (none orphaned).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    work = Path(tempfile.mkdtemp(prefix="dockyard-bench-fleet-"))
    work.chmod(0o711)  # the sandbox uid resolves bind sources under it
    runs: list[Run] = []
    try:
        demo = make_demo_task(work / "demo")
        for round_ in range(args.rounds):
            order = ["round_robin", "affinity"] if round_ % 2 == 0 else ["affinity", "round_robin"]
            for routing in order:
                runs.append(policy_run(args, demo, work, routing, f"{routing}-{round_}"))
        if args.kill_after:
            runs.append(kill_run(args, demo, work))
    finally:
        unmount_under(work)
        shutil.rmtree(work, ignore_errors=True)

    print(f"{args.workers} executors x capacity {args.capacity}, {args.tasks} tasks x "
          f"{args.rollouts} rollouts, setup {args.setup!r}, {os.cpu_count()} CPUs")
    print(f"{'run':<32}{'built':>6}{'wall s':>8}{'p50 s':>7}{'p99 s':>7}{'429 exec':>9}"
          f"{'429 seen':>9}{'wrong':>6}{'missing':>8}")
    for run in runs:
        f = run.figures()
        print(f"{f['run']:<32}{f.get('templates_built', 0):>6}{f['wall_s']:>8.2f}"
              f"{f['p50_s']:>7.2f}{f['p99_s']:>7.2f}{f.get('answered_429', 0):>9}"
              f"{f.get('surfaced_429', 0):>9}{f['wrong']:>6}{f['missing']:>8}")
    for run in runs:
        print(json.dumps(run.figures()))
    print_medians(runs)
    return 0


def print_medians(runs: list[Run]) -> None:
    """Each policy's medians over its rounds, and round-robin's over affinity's (side by side:
    the two policies alternate within this one invocation)."""
    by_policy = {name: [r.figures() for r in runs if r.name == name]
                 for name in ("round_robin", "affinity")}
    medians = {name: {key: statistics.median(f[key] for f in figures)
                      for key in ("wall_s", "p50_s", "p99_s")}
               for name, figures in by_policy.items() if figures}
    if len(medians) < 2:
        return
    rr, aff = medians["round_robin"], medians["affinity"]
    rounds = len(by_policy["affinity"])
    print(f"medians over {rounds} round(s): wall {rr['wall_s']:.2f} vs {aff['wall_s']:.2f} s "
          f"({rr['wall_s'] / aff['wall_s']:.2f}x); p50 {rr['p50_s']:.2f} vs {aff['p50_s']:.2f} s; "
          f"p99 {rr['p99_s']:.2f} vs {aff['p99_s']:.2f} s (round-robin vs affinity)")


if __name__ == "__main__":
    sys.exit(main())
