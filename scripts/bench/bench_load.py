"""Load benchmark: a burst of single-shot gradings, then many sessions, against one executor.

What a GRPO step looks like to one executor: ``--tasks`` gradings of the demo task (half its gold
fix, half an empty patch) submitted all at once, then ``--sessions`` sessions started at once,
each running ``--commands`` short commands and closing. Everything goes through
``sandbox_client.SandboxClient``, which waits out 429 (Retry-After) and retries; the executor is a
``python -m task_executor serve`` subprocess on 127.0.0.1 with its own temporary base directory.

Reported: throughput and p50/p99 client latency of each phase; errors (must be 0: explicit 429s
are counted apart, as retries the client made); wrong verdicts (must be 0); executor RSS before
and after; the slowest ``/health`` seen by a prober polling every 0.25 s throughout (must stay
under 2 s); and, after a SIGTERM, the executor's exit status and anything it left behind
(processes carrying its owner variable, working trees). Exits 1 if any of the musts failed.

    python scripts/bench/bench_load.py [--tasks 200] [--sessions 100] [--commands 30]

Bounded: ``--deadline`` seconds (default 900) for the whole run, then the executor is killed.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sandbox_client import SandboxClient  # noqa: E402
from sandbox_client.config import ClientConfig  # noqa: E402
from sandbox_client.errors import TaskExecutorError  # noqa: E402
from task_executor import reaper  # noqa: E402
from task_executor.service.lifecycle import owner_entries  # noqa: E402

# Graded pytest runs must not load every plugin installed beside the benchmark (slow, noisy).
FAST_PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
COMMANDS = ["echo step {i}", "ls", "cat calc/__init__.py", "git status --short", "pwd"]
HEALTH_LIMIT_S = 2.0


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class RetryCounter(logging.Handler):
    """Counts the client's busy retries by error code (it logs one line per retry)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.codes: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying in" in record.getMessage() and len(record.args or ()) >= 3:
            self.codes[str(record.args[2])] += 1  # type: ignore[index]


class HealthProbe:
    """Polls /health every 0.25 s from a process of its own (so the benchmark's 300 client
    threads cannot delay it and be blamed on the executor); a failed probe counts as inf."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, float]] = []
        """(sent at, latency); CLOCK_MONOTONIC is system-wide, so phases can be told apart."""
        self.failures = 0
        self.check_s = 0.0
        """The slowest trivial command /health reported running (its own ``check_s``)."""
        self._proc: subprocess.Popen[str] | None = None
        self._reader = threading.Thread(target=self._read, name="health-probe", daemon=True)

    def __enter__(self) -> HealthProbe:
        self._proc = subprocess.Popen(
            [sys.executable, __file__, "--probe", self.url], stdout=subprocess.PIPE, text=True
        )
        self._reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        self._proc.terminate()
        self._proc.wait()
        self._reader.join()

    @property
    def latencies(self) -> list[float]:
        return [seconds for _, seconds in self.samples]

    def max_between(self, start: float, end: float) -> float:
        window = [seconds for at, seconds in list(self.samples) if start <= at <= end]
        return round(max(window, default=0.0), 3)

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            started, seconds, check = (float(x) for x in line.split())
            self.samples.append((started, seconds))
            self.failures += math.isinf(seconds)
            self.check_s = max(self.check_s, check)


def probe_forever(url: str) -> None:
    """The probing process: one line ``sent_at latency check_s`` per probe."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with requests.Session() as http:
        http.trust_env = False
        while True:
            time.sleep(0.25)
            started, check = time.monotonic(), 0.0
            try:
                answer = http.get(url + "/health", timeout=10)
                ok = answer.status_code == 200
                check = answer.json().get("check_s", 0.0) if ok else 0.0
            except requests.RequestException:
                ok = False
            seconds = time.monotonic() - started if ok else math.inf
            print(started, seconds, check, flush=True)


def timed(function: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result), or (seconds, the TaskExecutorError it raised)."""
    started = time.monotonic()
    try:
        result = function()
    except TaskExecutorError as exc:
        result = exc
    return time.monotonic() - started, result


def phase_summary(name: str, wall: float, latencies: list[float], count: int) -> dict[str, Any]:
    return {
        "phase": name,
        "count": count,
        "wall_s": round(wall, 2),
        "per_s": round(count / wall, 2) if wall else 0.0,
        "p50_s": round(pct(latencies, 50), 3),
        "p99_s": round(pct(latencies, 99), 3),
    }


def run_tasks(client: SandboxClient, bodies: dict[str, dict], n: int) -> dict[str, Any]:
    """Submit ``n`` gradings at once; check every verdict against the patch it graded."""
    jobs = []
    for i in range(n):
        kind = "gold" if i % 2 == 0 else "empty"
        jobs.append((kind, {**bodies[kind], "task_id": f"load-{kind}-{i}", "env": FAST_PYTEST_ENV}))
    expected = {"gold": "resolved", "empty": "unresolved"}

    def grade(job: tuple[str, dict]) -> tuple[str, float, Any]:
        kind, body = job
        seconds, got = timed(lambda: client.run_task(body))
        return kind, seconds, got

    started = time.monotonic()
    with ThreadPoolExecutor(n) as pool:
        outcomes = list(pool.map(grade, jobs))
    wall = time.monotonic() - started
    errors = [repr(got) for _, _, got in outcomes if isinstance(got, Exception)]
    no_verdict = [
        got.error
        for _, _, got in outcomes
        if not isinstance(got, Exception) and got.status == "execution_error"
    ]
    wrong = [
        (kind, got.status)
        for kind, _, got in outcomes
        if not isinstance(got, Exception) and got.status not in (expected[kind], "execution_error")
    ]
    summary = phase_summary("tasks", wall, [s for _, s, _ in outcomes], n)
    summary.update(
        errors=len(errors) + len(no_verdict),
        wrong_verdicts=len(wrong),
        error_samples=(errors + [str(e) for e in no_verdict])[:3],
    )
    return summary


def run_sessions(client: SandboxClient, body: dict, n: int, commands: int) -> dict[str, Any]:
    """``n`` sessions at once, each ``commands`` commands, then closed."""
    command_latencies: list[float] = []
    start_latencies: list[float] = []
    lock = threading.Lock()

    def one(index: int) -> str | None:
        try:
            start_s, session = timed(lambda: client.start_session({**body, "task_id": f"s{index}"}))
            if isinstance(session, Exception):
                return repr(session)
            with session:
                mine = []
                for i in range(commands):
                    seconds, result = timed(
                        lambda i=i: session.exec(COMMANDS[i % len(COMMANDS)].format(i=i))
                    )
                    if isinstance(result, Exception):
                        return repr(result)
                    if result.exit_code != 0:
                        return f"exit {result.exit_code}: {result.output[-200:]}"
                    mine.append(seconds)
            with lock:
                start_latencies.append(start_s)
                command_latencies.extend(mine)
            return None
        except TaskExecutorError as exc:
            return repr(exc)

    started = time.monotonic()
    with ThreadPoolExecutor(n) as pool:
        failures = [f for f in pool.map(one, range(n)) if f is not None]
    wall = time.monotonic() - started
    summary = phase_summary("session commands", wall, command_latencies, len(command_latencies))
    summary.update(
        sessions=n,
        start_p50_s=round(pct(start_latencies, 50), 3),
        start_p99_s=round(pct(start_latencies, 99), 3),
        start_slowest_s=[round(x, 2) for x in sorted(start_latencies)[-5:]],
        errors=len(failures),
        error_samples=failures[:3],
    )
    return summary


def start_executor(base: Path, threads: int, max_sessions: int) -> tuple[subprocess.Popen, str]:
    env = {
        **os.environ,
        "DOCKYARD_TASK_EXECUTOR_THREADS": str(threads),
        "DOCKYARD_MAX_SESSIONS": str(max_sessions),
    }
    env.pop("API_TOKEN", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "task_executor",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--base-dir",
            str(base / "executor"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise SystemExit(f"executor did not start: {line!r}")
    return proc, line.strip().rsplit(" ", 1)[1]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--probe"]:
        probe_forever(argv[1])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--commands", type=int, default=30)
    parser.add_argument("--threads", type=int, default=32, help="executor waitress threads")
    parser.add_argument("--max-sessions", type=int, default=128, help="executor session cap")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds for everything")
    args = parser.parse_args(argv)

    retries = RetryCounter()
    logging.getLogger("sandbox_client").addHandler(retries)
    logging.getLogger("sandbox_client").setLevel(logging.INFO)

    with tempfile.TemporaryDirectory(prefix="dockyard-load-") as tmp:
        base = Path(tmp)
        subprocess.run(
            [sys.executable, "-m", "task_executor.demo", "--image-python", str(base / "demo")],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        bodies = {
            kind: json.loads((base / "demo" / f"{kind}.json").read_text())
            for kind in ("gold", "empty")
        }
        proc, url = start_executor(base, args.threads, args.max_sessions)
        # Past the deadline the executor goes, and with it every call still waiting on it.
        watchdog = threading.Timer(args.deadline, proc.kill)
        watchdog.daemon = True
        watchdog.start()
        config = ClientConfig(
            urls=(url,),
            busy_budget_s=args.deadline,
            busy_retries=100,
            backoff_max_s=10.0,
            pool_maxsize=max(args.tasks, args.sessions),
        )
        report: dict[str, Any] = {"executor": url, "threads": args.threads}
        try:
            with SandboxClient(config=config) as client, HealthProbe(url) as probe:
                time.sleep(1.0)  # a few idle probes, and a settled RSS to start from
                report["rss_before_mib"] = round(rss_mib(proc.pid), 1)

                def phase(name: str, run: Callable[[], dict[str, Any]]) -> None:
                    retried, started = Counter(retries.codes), time.monotonic()
                    report[name] = run()
                    report[name]["busy_retries"] = dict(retries.codes - retried)
                    report[name]["health_max_s"] = probe.max_between(started, time.monotonic())

                if args.tasks:
                    phase("tasks", lambda: run_tasks(client, bodies, args.tasks))
                session_body = {
                    "repo": bodies["gold"]["repo"],
                    "base_commit": bodies["gold"]["base_commit"],
                }
                if args.sessions:
                    phase(
                        "sessions",
                        lambda: run_sessions(client, session_body, args.sessions, args.commands),
                    )
                report["rss_after_mib"] = round(rss_mib(proc.pid), 1)
                report["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
            report["health_probes"] = len(probe.latencies)
            report["health_max_s"] = round(max(probe.latencies, default=0.0), 3)
            report["health_p99_s"] = round(pct(probe.latencies, 99), 3)
            report["health_failures"] = probe.failures
            report["health_check_max_s"] = probe.check_s
            report["busy_retries"] = dict(retries.codes)
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                report["exit_status"] = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                report["exit_status"] = proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
            executor_base = base / "executor"
            left = reaper.find(reaper.Target(environment=owner_entries(executor_base)))
            report["left_processes"] = len(left)
            report["left_trees"] = len(list((executor_base / "work").glob("*")))
            reaper.kill(reaper.Target(environment=owner_entries(executor_base)), grace=0)

    phases = [report[key] for key in ("tasks", "sessions") if key in report]
    failed = {
        "errors": any(phase["errors"] for phase in phases),
        "wrong verdicts": report.get("tasks", {}).get("wrong_verdicts", 0) > 0,
        "slow /health": report.get("health_max_s", math.inf) >= HEALTH_LIMIT_S
        or report.get("health_failures", 1) > 0,
        "unclean exit": report.get("exit_status") != 0,
        "leftovers": report.get("left_processes", 1) + report.get("left_trees", 1) > 0,
    }
    print_report(report, failed)
    return 1 if any(failed.values()) else 0


def print_report(report: dict[str, Any], failed: dict[str, bool]) -> None:
    for key in ("tasks", "sessions"):
        phase = report.get(key)
        if phase:
            print(
                f"{phase['phase']:>17}: {phase['count']} in {phase['wall_s']}s = "
                f"{phase['per_s']}/s, p50 {phase['p50_s']}s, p99 {phase['p99_s']}s, "
                f"errors {phase['errors']}"
                + (f", wrong verdicts {phase['wrong_verdicts']}" if key == "tasks" else "")
                + (
                    f" ({phase['sessions']} sessions, start p50 {phase['start_p50_s']}s "
                    f"p99 {phase['start_p99_s']}s)"
                    if key == "sessions"
                    else ""
                )
            )
            print(
                f"{'':>19}busy retries {phase['busy_retries']}, "
                f"slowest /health {phase['health_max_s']}s"
            )
            for sample in phase.get("error_samples", []):
                print(f"{'':>19}error: {sample}")
    print(f"{'busy retries':>17}: {report.get('busy_retries')} (explicit 429/503, then retried)")
    print(
        f"{'load average':>17}: {report.get('loadavg_1m_after')} "
        f"(1 min, after; {os.cpu_count()} CPUs, shared)"
    )
    print(
        f"{'executor RSS':>17}: {report.get('rss_before_mib')} MiB before, "
        f"{report.get('rss_after_mib')} MiB after"
    )
    print(
        f"{'/health':>17}: max {report.get('health_max_s')}s, p99 {report.get('health_p99_s')}s "
        f"over {report.get('health_probes')} probes, {report.get('health_failures')} failed; "
        f"its own trivial command took at most {report.get('health_check_max_s')}s"
    )
    print(
        f"{'shutdown':>17}: exit {report.get('exit_status')}, left "
        f"{report.get('left_processes')} processes and {report.get('left_trees')} trees"
    )
    verdict = [name for name, bad in failed.items() if bad]
    print("FAIL: " + ", ".join(verdict) if verdict else "OK")
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
