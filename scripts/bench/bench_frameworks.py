"""Benchmark the framework adapters side by side with the frameworks' own backends, in one run.

``echo hi`` over ``--calls`` calls each (after 20 warm-ups), pairs interleaved in ``--blocks``
blocks so machine noise hits both alike:

- mini-swe-agent: ``DockyardEnvironment.execute`` against mini's ``LocalEnvironment.execute`` (a
  subprocess per call). Goal: the adapter within 1 ms of it at p50.
- SWE-ReX: ``run_in_session`` through ``DockyardRuntime`` against SWE-ReX's ``RemoteRuntime``
  talking to its own server (``swerex-remote`` on 127.0.0.1, from this interpreter's venv).
  Goal: Dockyard at least 30x faster at p50.

Run it in a virtualenv with the frameworks (``pip install -e '.[minisweagent,swerex]'``, as
scripts/ci/frameworks.sh makes). The executor is a subprocess on 127.0.0.1 (port 0), as in
bench_sessions.py, whose server helpers this reuses. Prints p50/p90 per system, the mini p50
difference and the SWE-ReX p50 ratio, then the figures as one JSON line. Nothing is asserted.

    python scripts/bench/bench_frameworks.py [--calls 200] [--blocks 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts" / "bench")]
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

from bench_sessions import Dockyard, SweRex, interleaved, pct, stop  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from swerex.runtime.abstract import BashAction, CreateBashSessionRequest  # noqa: E402
from swerex.runtime.remote import RemoteRuntime  # noqa: E402

from sandbox_client import SandboxClient  # noqa: E402
from sandbox_client.integrations.minisweagent import DockyardEnvironment  # noqa: E402
from sandbox_client.integrations.swerex import DockyardRuntime  # noqa: E402
from task_executor.demo import make_demo_task  # noqa: E402

ECHO = "echo hi"


def measure(runs: dict[str, Callable[[], str]], calls: int, blocks: int) -> dict[str, Any]:
    """p50/p90 (ms) per run; a call whose output is not ``hi`` counts as an error."""
    figures = {}
    for name, timings in interleaved(runs, calls, blocks).items():
        s = [took for took, _ in timings]
        figures[name] = {"calls": len(s), "errors": sum(out.strip() != "hi" for _, out in timings),
                         "mean_ms": statistics.fmean(s) * 1e3, "p50_ms": pct(s, 50) * 1e3,
                         "p90_ms": pct(s, 90) * 1e3}
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--skip-swerex", action="store_true",
                        help="mini-swe-agent only (SWE-ReX needs named shells on the executor)")
    args = parser.parse_args()
    servers: list[Any] = []
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory(prefix="bench-frameworks-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        try:
            task = make_demo_task(work / "repo")
            dockyard = Dockyard(work, max_sessions=8, servers=servers)
            client = SandboxClient(dockyard.url)
            spec = {"repo": task.repo, "base_commit": task.base_commit}

            mini = DockyardEnvironment(client=client, task=spec)
            local = LocalEnvironment()
            action = {"command": ECHO}
            mini_runs = {"mini DockyardEnvironment": lambda: mini.execute(action)["output"],
                         "mini LocalEnvironment": lambda: local.execute(action)["output"]}

            figures = measure(mini_runs, args.calls, args.blocks)
            mini_gap = (figures["mini DockyardEnvironment"]["p50_ms"]
                        - figures["mini LocalEnvironment"]["p50_ms"])
            summary: dict[str, Any] = {"calls": args.calls, "mini_p50_gap_ms": mini_gap}
            if not args.skip_swerex:
                summary["swerex_p50_ratio"] = bench_swerex(client, spec, work, servers, loop,
                                                           args, figures)
            for name, row in figures.items():
                print(f"{name:28s} p50 {row['p50_ms']:8.2f} ms  p90 {row['p90_ms']:8.2f} ms  "
                      f"errors {row['errors']}")
            print(f"mini: adapter - LocalEnvironment at p50 = {mini_gap:+.2f} ms (goal <= 1 ms)")
            if "swerex_p50_ratio" in summary:
                print(f"SWE-ReX: swerex-remote / DockyardRuntime at p50 = "
                      f"{summary['swerex_p50_ratio']:.1f}x (goal >= 30x)")
            print(json.dumps({**summary, "figures": figures}))
            mini.session.close()
            client.close()
        finally:
            for proc in servers:
                stop(proc)
            loop.close()
    return 0


def bench_swerex(client: SandboxClient, spec: dict[str, Any], work: Path, servers: list[Any],
                 loop: asyncio.AbstractEventLoop, args: argparse.Namespace,
                 figures: dict[str, Any]) -> float:
    """``run_in_session`` through DockyardRuntime and through swerex-remote; adds their rows
    to ``figures`` and returns swerex-remote's p50 over DockyardRuntime's."""
    swerex = SweRex(Path(sys.executable).parent.parent, work, servers)
    rex_session = client.start_session(spec)
    ours = DockyardRuntime(session=rex_session, on_close=rex_session.close)
    theirs = RemoteRuntime(port=int(swerex.url.rsplit(":", 1)[1]),
                           auth_token=swerex.http.headers["X-API-Key"])
    create = CreateBashSessionRequest(startup_timeout=10)
    loop.run_until_complete(ours.create_session(create))
    loop.run_until_complete(theirs.create_session(create))
    bash = BashAction(command=ECHO, check="silent", timeout=60)

    def in_session(runtime: Any) -> Callable[[], str]:
        return lambda: loop.run_until_complete(runtime.run_in_session(bash)).output

    rex_runs = {"SWE-ReX DockyardRuntime": in_session(ours),
                "SWE-ReX swerex-remote": in_session(theirs)}
    figures |= measure(rex_runs, args.calls, args.blocks)
    loop.run_until_complete(theirs.close())
    loop.run_until_complete(ours.close())
    return float(figures["SWE-ReX swerex-remote"]["p50_ms"]
                 / figures["SWE-ReX DockyardRuntime"]["p50_ms"])


if __name__ == "__main__":
    sys.exit(main())
