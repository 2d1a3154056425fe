"""CPU fairness between tenants: one session's busy loops against another tenant's grading.

Two executors from this checkout run side by side, one with a CPU cgroup per workspace (the
default) and one with ``DOCKYARD_CPU_FAIR_SHARE=0`` (workspaces share the executor's group, thread
against thread, as before issue 23). On each, in rounds that alternate which executor goes first:

1. the demo task's gold grading alone (``quiet``);
2. the same grading while a session of the same executor runs ``--loops`` busy loops
   (``loaded``), started just before and killed just after.

Each executor runs in a CPU cgroup of its own (cgroup v1 ``cpu``), as it does in a Kubernetes pod:
outside the root group the kernel's autogroup (one group per session, ``sched_autogroup``) does
not apply, so without a group per workspace every process of every tenant competes thread
against thread. (In the root group, on a desktop kernel, autogroup already splits by session.)

A grading's test phase (``phases.tests``) is what a neighbour slows; the table gives its median
quiet and loaded on each executor and the ratio, loaded / quiet. Nothing is asserted: the figures
depend on the machine (2 CPUs here), and fairness means the ratio stays near the share a group
gets among the busy ones, not one. Needs root (cgroups). Prints a table, then one JSON line.

    python scripts/bench/bench_fairness.py [--rounds 5] [--loops 128]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from task_executor.demo import make_demo_task  # noqa: E402

FAST = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


CPU_ROOT = Path("/sys/fs/cgroup/cpu")


def pod_group(arm: str) -> Path:
    """A CPU cgroup standing for the executor's pod."""
    group = CPU_ROOT / f"dockyard-bench-{arm}-{os.getpid()}"
    group.mkdir(exist_ok=True)
    return group


def start(base: Path, fair: bool, group: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "DOCKYARD_CPU_FAIR_SHARE": "1" if fair else "0",
           "DOCKYARD_TASK_EXECUTOR_THREADS": "8", "PYTHONPATH": str(ROOT)}
    env.pop("API_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port", "0",
         "--base-dir", str(base)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
        preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        raise SystemExit(f"executor did not start: {line!r}")
    return proc, line.strip().rsplit(" ", 1)[1]


def grade(url: str, demo, task_id: str) -> float:
    result = requests.post(url + "/task/submit", timeout=600, json={
        **demo.request(task_id, demo.gold_patch), "env": FAST}).json()
    if result["status"] != "resolved":
        raise SystemExit(f"grading {task_id}: {result['status']} {result.get('error')}")
    return float(result["phases"]["tests"])


def loaded_grade(url: str, demo, task_id: str, loops: int) -> float:
    session = requests.post(url + "/session/start", timeout=120, json={
        "repo": demo.repo, "base_commit": demo.base_commit}).json()["session_id"]
    burn = f"for i in $(seq {loops}); do (while :; do :; done) & done; wait"
    runner = threading.Thread(target=lambda: requests.post(
        f"{url}/session/{session}/exec", timeout=3600, json={"command": burn, "timeout": 3600}),
        daemon=True)
    runner.start()
    # Let the loops start: the session's processes are in its cgroups by now.
    threading.Event().wait(2.0)
    try:
        return grade(url, demo, task_id)
    finally:
        requests.delete(f"{url}/session/{session}", timeout=120)
        runner.join(timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loops", type=int, default=128)
    args = parser.parse_args()
    if os.geteuid() != 0 or not (CPU_ROOT / "cgroup.procs").exists():
        raise SystemExit("needs root and a cgroup v1 cpu hierarchy")
    work = Path(tempfile.mkdtemp(prefix="dockyard-fairness-", dir="/var/tmp"))
    work.chmod(0o711)
    demo = make_demo_task(work / "demo-repo")
    executors = {}
    groups = {arm: pod_group(arm) for arm in ("fair", "shared")}
    figures: dict[str, dict[str, list[float]]] = {
        arm: {"quiet": [], "loaded": []} for arm in ("fair", "shared")}
    try:
        for arm in figures:
            executors[arm] = start(work / arm, fair=arm == "fair", group=groups[arm])
        for arm, (_, url) in executors.items():
            grade(url, demo, f"warm-{arm}")  # the template, built once
        for round_ in range(args.rounds):
            order = list(executors) if round_ % 2 == 0 else list(reversed(executors))
            for arm in order:
                url = executors[arm][1]
                figures[arm]["quiet"].append(grade(url, demo, f"q-{arm}-{round_}"))
                figures[arm]["loaded"].append(
                    loaded_grade(url, demo, f"l-{arm}-{round_}", args.loops))
                print(f"round {round_ + 1}/{args.rounds} {arm}: quiet "
                      f"{figures[arm]['quiet'][-1]:.3f}s loaded {figures[arm]['loaded'][-1]:.3f}s",
                      file=sys.stderr, flush=True)
    finally:
        for proc, _ in executors.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in executors.values():
            proc.wait(timeout=300)
            if proc.stdout is not None:
                proc.stdout.close()
        shutil.rmtree(work, ignore_errors=True)
        for group in groups.values():
            with contextlib.suppress(OSError):
                group.rmdir()
    summary = {}
    print(f"\n{sys.executable} {' '.join(sys.argv)}")
    print(f"{'executor':28} {'quiet p50':>10} {'loaded p50':>11} {'loaded/quiet':>13}")
    for arm, label in (("fair", "CPU group per workspace"), ("shared", "one group (before)")):
        quiet = statistics.median(figures[arm]["quiet"])
        loaded = statistics.median(figures[arm]["loaded"])
        summary[arm] = {"quiet_p50_s": round(quiet, 4), "loaded_p50_s": round(loaded, 4),
                        "ratio": round(loaded / quiet, 2), "quiet": figures[arm]["quiet"],
                        "loaded": figures[arm]["loaded"]}
        print(f"{label:28} {quiet:>9.3f}s {loaded:>10.3f}s {loaded / quiet:>12.2f}x")
    print(json.dumps({"loops": args.loops, "rounds": args.rounds, "arms": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
