"""What Python's full garbage collection costs the executor, with and without ``gc.freeze()``.

``task-executor serve`` freezes what exists once the app is built (modules, the app, its
services: they live as long as the process), so that no later collection goes through them
again. A full collection stops every thread of the executor, so its length is a tail latency for
every call in flight, and it grows with the sessions.

This runs two child processes one after the other, one that freezes after building the app as
``serve`` does and one that does not. Each builds the app in-process on a fresh base directory
under /var/tmp, starts ``--sessions`` sessions on a tiny repository in ``--steps`` steps, and at
each step times one full ``gc.collect()`` (after one that clears the garbage already there).
Prints both side by side per step, then one JSON line. Needs root (as the executor does).

    PYTHONPATH=$PWD python scripts/bench/bench_gc.py [--sessions 500] [--steps 2]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(sessions: int, steps: int, freeze: bool) -> list[dict[str, float]]:
    from task_executor.config import Settings
    from task_executor.demo import make_demo_task
    from task_executor.service.app import create_app

    work = Path(tempfile.mkdtemp(prefix="bench-gc-", dir="/var/tmp"))
    work.chmod(0o755)
    rows = []
    try:
        task = make_demo_task(work / "repo")
        app = create_app(Settings(base_dir=work / "base", max_sessions=sessions + 10))
        if freeze:
            gc.freeze()  # as serve() does, once the app is built
        client = app.test_client()
        spec = {"repo": task.repo, "base_commit": task.base_commit}
        ids: list[str] = []
        for target in [0, *(sessions * (i + 1) // steps for i in range(steps))]:
            while len(ids) < target:
                answer = client.post("/session/start", json=spec)
                assert answer.status_code == 200, answer.text
                ids.append(answer.get_json()["session_id"])
            gc.collect()
            started = time.perf_counter()
            gc.collect()
            rows.append({"sessions": target, "tracked": len(gc.get_objects()),
                         "full_ms": round((time.perf_counter() - started) * 1000, 2)})
        for session_id in ids:
            client.delete(f"/session/{session_id}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--child", choices=["frozen", "plain"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.sessions, args.steps, args.child == "frozen")))
        return
    runs = {}
    for kind in ("frozen", "plain"):
        done = subprocess.run(
            [sys.executable, __file__, "--sessions", str(args.sessions), "--steps",
             str(args.steps), "--child", kind],
            capture_output=True, text=True, check=True, env=os.environ)
        runs[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    for frozen, plain in zip(runs["frozen"], runs["plain"], strict=True):
        print(f"{plain['sessions']:6d} sessions: full collection {plain['full_ms']:7.2f} ms "
              f"({plain['tracked']} tracked objects), frozen at start-up "
              f"{frozen['full_ms']:7.2f} ms ({frozen['tracked']})")
    print(json.dumps({"bench": "gc", **runs}))


if __name__ == "__main__":
    main()
