"""What the control run and the conditions probe cost a grading.

Starts ``python -m task_executor serve`` on 127.0.0.1 and, for ``--rounds`` fresh demo tasks
(each its own repository, so its own template and control), grades in this order:

1. the gold patch: a consistent run (the control is never needed; the template is built and
   probed for conditions here);
2. the gold patch again: a consistent run on a ready, probed template;
3. a patch whose module calls ``os._exit(1)`` in the code under test: the run crashes, the control
   runs (``phases.control`` is its cost, ``control_run`` true);
4. another such patch of the same task: the control is kept (``control_run`` false).

Prints the medians of ``duration_s``, ``phases.tests`` and ``phases.control`` per kind, and the
probe's own time from the executor's log (once per template).

Usage: python scripts/bench/bench_control.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from task_executor.demo import BASE_FILES, diff_of, make_demo_task  # noqa: E402
from task_executor.service.lifecycle import unmount_under  # noqa: E402

KINDS = ("gold, first on its template", "gold, template ready", "crash, control run",
         "crash, control kept")
CRASH = BASE_FILES["calc/__init__.py"].replace("return a - b", "import os\n    os._exit(1)")


def submit(url: str, body: dict) -> dict:
    request = urllib.request.Request(f"{url}/task/submit", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as reply:
        return dict(json.loads(reply.read()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dockyard-bench-control-"))
    work.chmod(0o755)
    log = work / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port", "0",
         "--base-dir", str(work / "base")],
        cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"listening on (http://127\.0\.0\.1:\d+)", log.read_text())):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the executor did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.05)
        url = found.group(1)
        seen: dict[str, list[dict]] = {kind: [] for kind in KINDS}
        for round_ in range(args.rounds):
            task = make_demo_task(work / f"repo-{round_}")
            repo = Path(task.repo)
            env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
            patches = [task.gold_patch, task.gold_patch,
                       diff_of(repo, {"calc/__init__.py": "# one\n" + CRASH}),
                       diff_of(repo, {"calc/__init__.py": "# two\n" + CRASH})]
            for n, (kind, patch) in enumerate(zip(KINDS, patches, strict=True)):
                result = submit(url, {**task.request(f"r{round_}-{n}", patch), "env": env})
                expected = "resolved" if n < 2 else "unresolved"
                if result["status"] != expected or (n >= 2) != (result["control_run"] is not None):
                    raise RuntimeError(f"{kind}: {result['status']} {result.get('error')}")
                seen[kind].append(result)
        print(f"{args.rounds} rounds; medians in seconds")
        print(f"{'grading':30} {'duration_s':>10} {'tests':>8} {'control':>8}  control_run")
        for kind, results in seen.items():
            median = {key: statistics.median(r["phases"][key] for r in results)
                      for key in ("tests", "control")}
            print(f"{kind:30} {statistics.median(r['duration_s'] for r in results):10.3f} "
                  f"{median['tests']:8.3f} {median['control']:8.3f}  "
                  f"{sorted({str(r['control_run']) for r in results})}")
        probes = [float(s) for s in re.findall(r"conditions probed in ([\d.]+)s",
                                               (work / "base" / "task_executor.log").read_text())]
        print(f"conditions probe: {len(probes)} runs (one per template), median "
              f"{statistics.median(probes):.3f}s")
        for kind, results in seen.items():
            print(json.dumps({"grading": kind, **{
                f"{key}_p50_s": round(statistics.median(r["phases"][key] for r in results), 4)
                for key in ("tests", "control")},
                "duration_p50_s": round(statistics.median(r["duration_s"] for r in results), 4)}))
        print(json.dumps({"conditions_probes": len(probes),
                          "probe_p50_s": round(statistics.median(probes), 4)}))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        unmount_under(work)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
