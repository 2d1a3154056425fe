"""A/B of exec latency: executors from several checkouts of this repository, side by side.

Each ``NAME=CHECKOUT`` starts ``python -m task_executor serve`` from that directory (a git
worktree of another commit, say) on 127.0.0.1; all of them serve the same demo repository. One
session each runs ``echo hi`` ``--calls`` times through one kept-alive ``http.client``
connection, in blocks that alternate between the executors and flip order every block, so the
machine's drift hits all alike. Prints p50/p90/p99 per executor and its own ``duration_s`` p50.

Usage:
    git worktree add /tmp/before <commit>
    python scripts/bench/bench_ab.py before=/tmp/before after=. [--calls 2000] [--blocks 20]
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from task_executor.service.lifecycle import unmount_under  # noqa: E402

BODY = json.dumps({"command": "echo hi", "timeout": 60})
HEADERS = {"Content-Type": "application/json"}


def post(connection: http.client.HTTPConnection, path: str, body: str) -> dict:
    connection.request("POST", path, body, HEADERS)
    reply = connection.getresponse()
    data = reply.read()
    if reply.status != 200:
        raise RuntimeError(f"{path}: {reply.status} {data[:500]!r}")
    return dict(json.loads(data))


class Executor:
    def __init__(self, name: str, checkout: Path, workdir: Path, repo: dict[str, str]) -> None:
        self.name = name
        log = workdir / f"{name}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port", "0",
             "--base-dir", str(workdir / name)],
            cwd=checkout, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not (found := re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.05)
        self.connection = http.client.HTTPConnection("127.0.0.1", int(found.group(1)), timeout=120)
        session = post(self.connection, "/session/start", json.dumps(repo))["session_id"]
        self.path = f"/session/{session}/exec"

    def exec(self) -> tuple[float, float]:
        """Seconds for one ``echo hi`` round trip, and the executor's own ``duration_s``."""
        started = time.perf_counter()
        answer = post(self.connection, self.path, BODY)
        took = time.perf_counter() - started
        if answer["exit_code"] != 0 or answer["output"] != "hi\n":
            raise RuntimeError(f"{self.name}: {answer}")
        return took, answer["duration_s"]

    def stop(self) -> None:
        self.connection.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("executors", nargs="+", metavar="NAME=CHECKOUT")
    parser.add_argument("--calls", type=int, default=2000, help="measured calls per executor")
    parser.add_argument("--blocks", type=int, default=20)
    args = parser.parse_args()
    named = [spec.split("=", 1) for spec in args.executors]
    if any(len(pair) != 2 or not Path(pair[1], "task_executor").is_dir() for pair in named):
        parser.error("each executor is NAME=CHECKOUT, a directory holding task_executor/")

    workdir = Path(tempfile.mkdtemp(prefix="dockyard-ab-"))
    executors: list[Executor] = []
    try:
        subprocess.run([sys.executable, "-m", "task_executor.demo", "--image-python",
                        str(workdir / "demo")],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        gold = json.loads((workdir / "demo" / "gold.json").read_text())
        repo = {"repo": gold["repo"], "base_commit": gold["base_commit"]}
        for name, checkout in named:
            executors.append(Executor(name, Path(checkout).resolve(), workdir, repo))
        for executor in executors:
            for _ in range(100):  # warm up
                executor.exec()
        samples: dict[str, list[tuple[float, float]]] = {e.name: [] for e in executors}
        for block in range(args.blocks):
            for executor in executors if block % 2 == 0 else executors[::-1]:
                for _ in range(args.calls // args.blocks):
                    samples[executor.name].append(executor.exec())
        for name, pairs in samples.items():
            took = [t * 1000 for t, _ in pairs]
            inside = statistics.median(d for _, d in pairs) * 1000
            print(f"{name:<12} p50 {statistics.median(took):.3f}  p90 {percentile(took, 90):.3f}"
                  f"  p99 {percentile(took, 99):.3f} ms   duration_s p50 {inside:.3f} ms")
        return 0
    finally:
        for executor in executors:
            executor.stop()
        unmount_under(workdir)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
