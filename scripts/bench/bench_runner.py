"""Benchmark the persistent shell directly (no HTTP): round trip of a trivial command, memory
under an output flood, and the refusal time of unterminated input (Sandman tables A26, A27).

Usage: python scripts/bench/bench_runner.py [--runs 500] [--flood-mib 1024]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from task_executor.runner import ShellSession  # noqa: E402


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500, help="echo round trips to time")
    parser.add_argument("--flood-mib", type=int, default=1024, help="size of the output flood")
    args = parser.parse_args()

    env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C.UTF-8"}
    with tempfile.TemporaryDirectory() as cwd, ShellSession(cwd, env) as shell:
        for _ in range(20):  # warm up: page cache, the shell's first forks
            shell.run("echo hi")
        samples = []
        for _ in range(args.runs):
            started = time.perf_counter()
            result = shell.run("echo hi")
            samples.append((time.perf_counter() - started) * 1000)
            assert result.exit_code == 0 and result.output == "hi\n", result
        print(
            f"echo hi, {args.runs} runs: p50 {statistics.median(samples):.2f} ms, "
            f"p90 {percentile(samples, 90):.2f} ms, p99 {percentile(samples, 99):.2f} ms"
        )

        refusals = []
        for command in ("cat > f <<EOF\nabc", "echo 'abc", 'python3 -c "\nprint(1)'):
            started = time.perf_counter()
            result = shell.run(command)
            refusals.append((time.perf_counter() - started) * 1000)
            assert result.exit_code == 2, result
        print("unterminated input refused in " + ", ".join(f"{ms:.2f}" for ms in refusals) + " ms")

        before = rss_mib()
        started = time.perf_counter()
        result = shell.run(f"head -c {args.flood_mib}M /dev/zero", timeout=600)
        elapsed = time.perf_counter() - started
        assert result.exit_code == 0 and result.output_bytes == args.flood_mib << 20, result
        print(
            f"{args.flood_mib} MiB flood: {elapsed:.2f} s, RSS {before:.1f} -> {rss_mib():.1f} MiB "
            f"(growth {rss_mib() - before:+.1f} MiB), output kept {len(result.output)} chars"
        )


if __name__ == "__main__":
    main()
