"""Benchmark the persistent shell directly (no HTTP): round trip of a trivial command, the
shell's CPU time per command, the floor of any shell behind pipes (a bare ping-pong on one CPU
and on two), memory under an output flood, and the refusal time of unterminated input (Sandman
tables A26, A27).

Usage: python scripts/bench/bench_runner.py [--runs 500] [--flood-mib 1024]
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from task_executor.sessions.runner import ShellSession  # noqa: E402


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class PipePingPong:
    """The floor for any shell driven through pipes on this machine: a bash loop that answers
    each line with one line on another pipe, and does nothing else. What it costs is the two
    wake-ups of a round trip, timed with both processes pinned to one CPU and to two (on a VM,
    waking an idle vCPU is most of the second)."""

    def __init__(self) -> None:
        self.answers, answer_w = os.pipe()
        loop = f'while IFS= read -r line; do builtin printf "x\\n" >&{answer_w}; done'
        self.proc = subprocess.Popen(["bash", "--norc", "-c", loop], stdin=subprocess.PIPE,
                                     pass_fds=(answer_w,))
        os.close(answer_w)
        assert self.proc.stdin is not None
        self.ask = self.proc.stdin.fileno()
        self.placement: tuple[int, int] | None = None

    def round_trip(self) -> None:
        os.write(self.ask, b"hi\n")
        select.select([self.answers], [], [])
        assert os.read(self.answers, 64) == b"x\n"

    def pinned(self, own_cpu: int, bash_cpu: int) -> Callable[[], None]:
        """A round trip with this process on ``own_cpu`` and the bash loop on ``bash_cpu``."""

        def call() -> None:
            if self.placement != (own_cpu, bash_cpu):
                os.sched_setaffinity(0, {own_cpu})
                os.sched_setaffinity(self.proc.pid, {bash_cpu})
                self.placement = (own_cpu, bash_cpu)
            self.round_trip()

        return call

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        os.close(self.answers)


def interleaved(calls: dict[str, Callable[[], object]], runs: int,
                blocks: int = 10) -> dict[str, list[float]]:
    """Milliseconds per call, ``runs`` calls each, in blocks alternating between the calls."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for block in range(blocks):
        for name in list(calls) if block % 2 == 0 else list(reversed(calls)):
            for _ in range(runs // blocks):
                started = time.perf_counter()
                calls[name]()
                samples[name].append((time.perf_counter() - started) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500, help="echo round trips to time")
    parser.add_argument("--flood-mib", type=int, default=1024, help="size of the output flood")
    args = parser.parse_args()

    env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C.UTF-8"}
    with tempfile.TemporaryDirectory() as cwd, ShellSession(cwd, env) as shell:
        def echo() -> None:
            result = shell.run("echo hi")
            assert result.exit_code == 0 and result.output == "hi\n", result

        for _ in range(20):  # warm up: page cache, the shell's first forks
            echo()
        shell_pid = shell.pid
        assert shell_pid is not None
        cpu_before = cpu_seconds(shell_pid)
        samples = interleaved({"echo hi": echo}, args.runs)
        shell_cpu_us = (cpu_seconds(shell_pid) - cpu_before) / len(samples["echo hi"]) * 1e6

        floor, own_cpus = PipePingPong(), os.sched_getaffinity(0)
        first, *others = sorted(own_cpus)
        placements = {"pipe ping-pong, one CPU": floor.pinned(first, first)}
        if others:
            placements["pipe ping-pong, two CPUs"] = floor.pinned(first, others[0])
        try:
            samples |= interleaved(placements, args.runs)
        finally:
            os.sched_setaffinity(0, own_cpus)
            floor.close()
        for name, ms in samples.items():
            print(f"{name}, {len(ms)} runs: p50 {statistics.median(ms):.3f} ms, "
                  f"p90 {percentile(ms, 90):.3f} ms, p99 {percentile(ms, 99):.3f} ms")
        print(f"the session's bash: {shell_cpu_us:.0f} us of CPU per echo hi "
              "(check, run, frame, state snapshot)")

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
