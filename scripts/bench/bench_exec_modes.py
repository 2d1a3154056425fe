"""Per-call cost of exec's modes in the session shell (issue 25): ``echo hi`` in the shell
itself, in a stateless subshell, with a cwd and env of its own, and with stderr apart.

Runs :class:`~task_executor.sessions.runner.ShellSession` directly (no HTTP, no sandbox: the
shell protocol's own cost, which the modes change), ``--calls`` calls per mode after 20 warm-ups.
The modes take turns in blocks of ``--block`` calls in a row (an agent's calls are mostly of one
mode), with ``--pause-ms`` between calls, as a client's turn-around between an answer and its
next call: a subshell call's spare is forked then (framing.py, "Spares"), so ``--block 1
--pause-ms 0`` shows the worst case, every subshell call paying its fork. Prints p50/p90 per mode
in ms, then one JSON line. Against a tree without the modes (an older checkout on PYTHONPATH) only
the plain mode is measured, for a before/after figure. Nothing is asserted.

    PYTHONPATH=. python scripts/bench/bench_exec_modes.py [--calls 300] [--block 20] [--pause-ms 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

from sandbox_client.protocol import ExecResult
from task_executor.sessions.runner import ShellSession


def _modes(shell: ShellSession) -> dict[str, Callable[[], ExecResult]]:
    modes: dict[str, Callable[[], ExecResult]] = {"plain": lambda: shell.run("echo hi")}
    try:
        from task_executor.sessions.modes import CallMode
    except ImportError:  # a checkout from before the modes
        return modes
    stateless = CallMode(subshell=True)
    with_cwd_env = CallMode(subshell=True, cwd="/tmp", env={"A": "1"})
    separate = CallMode(separate_stderr=True)
    modes["stateless"] = lambda: shell.run("echo hi", mode=stateless)
    modes["cwd+env"] = lambda: shell.run("echo hi", mode=with_cwd_env)
    modes["stderr-separate"] = lambda: shell.run("echo hi", mode=separate)
    return modes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--block", type=int, default=20, help="calls of one mode in a row")
    parser.add_argument("--pause-ms", type=float, default=1.0, help="between two calls")
    args = parser.parse_args()
    with ShellSession(cwd="/tmp", env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}) as shell:
        modes = _modes(shell)
        for run in modes.values():
            for _ in range(20):
                run()
        times: dict[str, list[float]] = {name: [] for name in modes}
        block = max(1, args.block)
        for _ in range(-(-args.calls // block)):
            for name, run in modes.items():
                for _ in range(block):
                    _pause(args.pause_ms / 1000)
                    started = time.perf_counter()
                    result = run()
                    times[name].append((time.perf_counter() - started) * 1000)
                    assert result.output == "hi\n", result
    figures = {}
    for name, samples in times.items():
        cuts = statistics.quantiles(samples, n=10)
        figures[name] = {"p50_ms": round(statistics.median(samples), 3),
                         "p90_ms": round(cuts[8], 3)}
        p50, p90 = figures[name]["p50_ms"], figures[name]["p90_ms"]
        print(f"{name:16} p50 {p50:7.3f} ms  p90 {p90:7.3f} ms")
    print(json.dumps({"bench": "exec_modes", "calls": args.calls, **figures}))


def _pause(seconds: float) -> None:
    """Busy-wait (a sleep this short oversleeps by more than it lasts)."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


if __name__ == "__main__":
    main()
