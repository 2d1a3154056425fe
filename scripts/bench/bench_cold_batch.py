"""Cold-batch benchmark (issue #25): a batch of gradings sent at once by a client that has never
called the executor, with and without learning its capacity first, side by side in one run.

Without learning, the client sends the whole batch; the executor takes its capacity and refuses
the rest with 429 (Retry-After 2 s), and they come back after waiting that out. With learning
(the default since issue #25), the client reads ``/health`` once, sends no more than fits and
keeps the rest waiting in the client until a grading ends. The issue measured 7.95 s against
4.09 s for 16 gradings on a capacity-4 executor.

One executor subprocess (``python -m task_executor serve``, ``DOCKYARD_MAX_TASKS`` = capacity)
grades the demo task (gold and empty patches alternating); its template is built once before
timing. Each round makes a fresh client per mode, the modes in an order that alternates between
rounds; 429s are counted at the executor (its ``/metrics``), wrong verdicts too (must be 0).

    python scripts/bench/bench_cold_batch.py [--tasks 16] [--capacity 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from sandbox_client import SandboxClient  # noqa: E402
from sandbox_client.cli.fleet import start_worker, stop_workers, wait_ready  # noqa: E402
from task_executor.demo import DemoTask, make_demo_task  # noqa: E402

# Graded pytest runs must not load every plugin installed beside the benchmark (slow, noisy).
FAST_PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
MODES = {"before (not learned)": False, "after (learned)": True}


def submits_answered(url: str, status: int) -> int:
    """``POST /task/submit`` answers with ``status`` so far, from the executor's /metrics."""
    import requests

    text = requests.get(f"{url}/metrics", timeout=30).text
    return int(sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "dockyard_http_requests_total"
        and sample.labels.get("route") == "/task/submit"
        and sample.labels.get("status") == str(status)
    ))


def specs(demo: DemoTask, round_: int, count: int) -> list[dict[str, Any]]:
    return [
        {**demo.request(f"r{round_}-{i}", demo.gold_patch if i % 2 == 0 else ""),
         "env": dict(FAST_PYTEST_ENV)}
        for i in range(count)
    ]


def cold_batch(url: str, learn: bool, batch: list[dict[str, Any]]) -> dict[str, Any]:
    """One fresh client grades ``batch`` at once: wall time, 429s met, wrong verdicts."""
    refused = submits_answered(url, 429)
    started = time.monotonic()
    with SandboxClient(url, learn_capacity=learn) as client, \
            ThreadPoolExecutor(len(batch)) as pool:
        results = list(pool.map(client.run_task, batch))
    wall = time.monotonic() - started
    wrong = sum(
        r.status != ("resolved" if i % 2 == 0 else "unresolved") for i, r in enumerate(results)
    )
    return {"wall_s": wall, "429s": submits_answered(url, 429) - refused, "wrong": wrong}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=16, help="gradings per batch (16)")
    parser.add_argument("--capacity", type=int, default=4, help="executor's task slots (4)")
    parser.add_argument("--rounds", type=int, default=3, help="batches per mode (3)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="dockyard-cold-batch-") as tmp:
        base = Path(tmp)
        base.chmod(0o755)  # the sandbox user must reach the demo repository
        demo = make_demo_task(base / "demo-repo")
        os.environ["DOCKYARD_MAX_TASKS"] = str(args.capacity)
        worker = start_worker(0, "127.0.0.1", 0, base / "fleet", None, None)
        try:
            with SandboxClient("http://127.0.0.1:1") as probe:
                dead = wait_ready([worker], probe, 120.0, threading.Event())
            if dead is not None or worker.url is None:
                print(f"executor did not start:\n{worker.log_tail()}", file=sys.stderr)
                return 1
            url = worker.url
            # The template is built once, so both modes time the batch and nothing else.
            with SandboxClient(url) as warm:
                warm.run_task(specs(demo, -1, 1)[0])
            runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
            for round_ in range(args.rounds):
                order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
                for mode in order:
                    batch = specs(demo, round_, args.tasks)
                    runs[mode].append(cold_batch(url, MODES[mode], batch))
        finally:
            stop_workers([worker], grace=10.0)

    print(f"{args.tasks} gradings at once on a capacity-{args.capacity} executor, "
          f"{args.rounds} rounds, a fresh client each")
    print(f"{'mode':22} {'wall p50 s':>10} {'min s':>7} {'max s':>7} {'429s':>6} {'wrong':>6}")
    summary: dict[str, Any] = {"tasks": args.tasks, "capacity": args.capacity}
    for mode, rows in runs.items():
        walls = [row["wall_s"] for row in rows]
        refused = sum(row["429s"] for row in rows)
        wrong = sum(row["wrong"] for row in rows)
        print(f"{mode:22} {statistics.median(walls):10.2f} {min(walls):7.2f} {max(walls):7.2f} "
              f"{refused:6d} {wrong:6d}")
        key = "learned" if MODES[mode] else "not_learned"
        summary[key] = {"wall_p50_s": round(statistics.median(walls), 3),
                        "walls_s": [round(w, 3) for w in walls], "429s": refused, "wrong": wrong}
    ratio = summary["not_learned"]["wall_p50_s"] / summary["learned"]["wall_p50_s"]
    print(f"speedup (before / after, p50): {ratio:.2f}x")
    summary["speedup"] = round(ratio, 2)
    print(json.dumps(summary))
    return 0 if all(summary[k]["wrong"] == 0 for k in ("learned", "not_learned")) else 1


if __name__ == "__main__":
    sys.exit(main())
