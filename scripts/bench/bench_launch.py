"""What a sandbox's start costs, by checkout, side by side (issue 24: start p50 <= 30 ms).

For each checkout given (this one by default; another commit's as a git worktree), a child
process with that checkout first on ``sys.path`` builds the executor's services in-process (no
HTTP) on a fresh base directory, in a private copy of the machine's mount table, and measures:

- ``mounts``: the mount table a sandbox sees (``/proc/self/mountinfo`` inside one), which
  bubblewrap reads back after each of its mounts and the kernel copies and tears down;
- ``launch``: the launcher alone, ``bash -c true`` through it (cgroup attach, privilege drop,
  limits, bubblewrap);
- ``start``: ``SessionManager.start`` (workspace, shell, first answer), ``--starts`` of them with
  all earlier ones still live, and the machine's busy CPU time per start over them (every
  process: the executor, bubblewrap, the shells).

The base directory sits in a directory of its own with ``--siblings`` other entries beside it,
as a base directory under ``/var/lib`` has (``/var/tmp`` here holds the benchmarks' own). Rounds
alternate the checkouts, so that a machine whose speed drifts (this one does, by 30% within
minutes) weighs on each alike; the table gives the median of the rounds' p50s. Needs root.

    PYTHONPATH=$PWD python scripts/bench/bench_launch.py [--checkout /work/wt/base] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def busy_ticks() -> int:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # all but idle and iowait


def child(starts: int, launches: int, siblings: int) -> dict[str, float]:
    # Nothing of this checkout is imported here (bench_sandbox's helpers would put it first on
    # sys.path): the child runs the checkout it was started for, in a mount namespace of its own
    # (run_child starts it under unshare).
    import task_executor
    from sandbox_client.protocol import SessionStartSpec
    from task_executor.config import Settings
    from task_executor.demo import make_demo_task
    from task_executor.service.lifecycle import release_mounts, unmount_under
    from task_executor.service.services import Services

    assert Path(task_executor.__file__).is_relative_to(Path.cwd()), task_executor.__file__
    parent = Path(tempfile.mkdtemp(prefix="bench-launch-", dir="/var/tmp"))
    parent.chmod(0o755)
    for index in range(siblings):
        (parent / f"sibling-{index}").mkdir()
    services = None
    try:
        task = make_demo_task(parent / "repo")
        services = Services.build(Settings(base_dir=parent / "base", max_sessions=starts + 10))
        sessions = services.sessions
        workspace = sessions.workspaces.create(task.repo, task.base_commit, [], {})
        launcher = workspace.launcher(deny_network=False)
        options = {"cwd": str(workspace.path), "env": {"PATH": "/usr/bin:/bin"},
                   "stdout": subprocess.PIPE}
        seen = launcher.popen(["cat", "/proc/self/mountinfo"], **options).communicate()[0]
        times = []
        for _ in range(launches):
            began = time.perf_counter()
            proc = launcher.popen(["bash", "--noprofile", "--norc", "-c", "true"], **options)
            proc.communicate()
            times.append(time.perf_counter() - began)
            assert proc.returncode == 0, proc.returncode
        workspace.destroy()
        spec = SessionStartSpec(repo=task.repo, base_commit=task.base_commit)
        start_times = []
        ticks, wall = busy_ticks(), time.perf_counter()
        for _ in range(starts):
            began = time.perf_counter()
            sessions.start(spec)
            start_times.append(time.perf_counter() - began)
        cpu_ms = (busy_ticks() - ticks) / os.sysconf("SC_CLK_TCK") / starts * 1000
        return {"mounts": len(seen.splitlines()),
                "launch_ms": round(statistics.median(times) * 1000, 2),
                "start_ms": round(statistics.median(start_times) * 1000, 2),
                "cpu_ms_per_start": round(cpu_ms, 2),
                "wall_ms_per_start": round((time.perf_counter() - wall) / starts * 1000, 2)}
    finally:
        if services is not None:
            services.sessions.close_all()
            release_mounts(services)
        unmount_under(parent)
        shutil.rmtree(parent, ignore_errors=True)


def run_child(checkout: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private",
         sys.executable, str(Path(__file__).resolve()), "--child", "--starts", str(args.starts),
         "--launches", str(args.launches), "--siblings", str(args.siblings)],
        cwd=checkout, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{checkout}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", action="append", type=Path, default=[],
                        help="another checkout to compare (repeatable); this one always runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--starts", type=int, default=100)
    parser.add_argument("--launches", type=int, default=40)
    parser.add_argument("--siblings", type=int, default=20)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.starts, args.launches, args.siblings)))
        return 0
    checkouts = [*args.checkout, ROOT]
    rows: dict[str, list[dict[str, float]]] = {str(c): [] for c in checkouts}
    for number in range(args.rounds):
        for checkout in checkouts:
            row = run_child(checkout, args)
            rows[str(checkout)].append(row)
            print(f"round {number + 1} {checkout}: {row}", flush=True)
    summary = {}
    print(f"\nmedians of {args.rounds} rounds ({args.starts} starts, {args.launches} launches, "
          f"{args.siblings} siblings of the base dir each):")
    print(f"{'checkout':40s} {'mounts':>7s} {'launch ms':>10s} {'start ms':>9s} {'CPU ms':>7s}")
    for checkout, runs in rows.items():
        summary[checkout] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        figures = summary[checkout]
        print(f"{checkout:40s} {figures['mounts']:7.0f} {figures['launch_ms']:10.2f} "
              f"{figures['start_ms']:9.2f} {figures['cpu_ms_per_start']:7.2f}")
    print(json.dumps({"rounds": rows, "medians": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
