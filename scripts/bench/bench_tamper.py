"""Benchmark what the tampering checks cost a test run (issue 23 part 1): pytest over N trivial
tests with the reporter of a baseline checkout and with this checkout's, in the same
interpreter, alternating. Both are told to check the test file's code (``DOCKYARD_CODE_FILES``,
as the executor does; a reporter without the code record ignores it), so the difference is
what this checkout's reporter adds: the integrity record at every test's call report against a
baseline without it, or the code record (the file compiled at load, a profile window around
each test's call) against a baseline that has the integrity record already.
The canaries themselves (a few more tests, clones of FAIL_TO_PASS tests) are not measured here.

Usage: python scripts/bench/bench_tamper.py [--tests 2000] [--repeat 5] [--baseline /work/main]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
REPORTER = Path("task_executor/grading/reporter")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(reporter: Path, directory: Path) -> tuple[float, float]:
    """(wall clock, CPU) seconds of one pytest run; CPU time is what a loaded machine
    disturbs least."""
    digest = hashlib.sha256((directory / "test_many.py").read_bytes()).hexdigest()
    env = {**os.environ, "PYTHONPATH": str(reporter), "PYTEST_PLUGINS": "dockyard_report",
           "DOCKYARD_REPORT_MODE": "pytest", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "DOCKYARD_REPORT_FILE": str(directory / "report.jsonl"),
           "DOCKYARD_CODE_FILES": json.dumps({"root": str(directory),
                                              "files": {"test_many.py": digest}})}
    started, cpu = time.perf_counter(), _children_cpu()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "test_many.py"], cwd=directory, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - started, _children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline", type=Path, default=Path("/work/main"),
                        help="the checkout to compare with (its reporter)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "test_many.py").write_text(
            "".join(f"def test_{i}():\n    pass\n\n" for i in range(args.tests)))
        times: dict[str, list[tuple[float, float]]] = {"baseline": [], "guarded": []}
        for _ in range(args.repeat):
            times["baseline"].append(run(args.baseline / REPORTER, directory))
            times["guarded"].append(run(HERE / REPORTER, directory))
    wall = {name: statistics.median(v[0] for v in values) for name, values in times.items()}
    cpu = {name: statistics.median(v[1] for v in values) for name, values in times.items()}
    per_test_ms = (wall["guarded"] - wall["baseline"]) / args.tests * 1000
    cpu_per_test_ms = (cpu["guarded"] - cpu["baseline"]) / args.tests * 1000
    print(f"{'reporter':10} {'median s':>9} {'CPU s':>9}  ({args.tests} tests, "
          f"{args.repeat} runs each)")
    for name in wall:
        print(f"{name:10} {wall[name]:9.3f} {cpu[name]:9.3f}")
    print(f"this checkout's reporter adds {per_test_ms:.3f} ms per test "
          f"({cpu_per_test_ms:.3f} ms of CPU)")
    print(json.dumps({"tests": args.tests, "repeat": args.repeat, "wall": wall, "cpu": cpu,
                      "per_test_ms": round(per_test_ms, 4),
                      "cpu_per_test_ms": round(cpu_per_test_ms, 4)}))


if __name__ == "__main__":
    main()
