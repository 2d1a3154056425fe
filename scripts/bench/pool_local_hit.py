"""The image pool's hit latency on the local provider, with a real executor (issue 22's goal: an
acquire that hits takes <= 50 ms p50, end to end).

One executor of a tiny image root (the host's /usr hard-linked, as tests/images.py makes) is
started by a first session (the miss); then N acquires that hit are timed two ways:

- ``pool_acquire``: ``Pool.acquire`` + ``release`` alone (the pool's own placement cost);
- ``start_session``: ``SandboxClient(pool=...).start_session`` with the image, end to end: the
  pool's hit plus the executor making the session's workspace at the demo repo's base commit,
  until the session can run its first command (then closed, untimed).

Every timed acquire is checked to be a hit (a miss would be a different measurement).

    python scripts/bench/bench_pool.py --local-hit 50 [--json]
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sandbox_client import SandboxClient  # noqa: E402
from sandbox_client.pool import LocalProvider, Pool, PoolSettings, image_root  # noqa: E402
from sandbox_client.protocol import SessionStartSpec  # noqa: E402
from task_executor.demo import make_demo_task  # noqa: E402
from tests.images import make_image_root  # noqa: E402

IMAGE = "registry.example/dockyard/bench-hit:1"


def _figures(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"n": len(ordered), "p50_ms": round(statistics.median(ordered) * 1000, 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, 3)}


def run_local_hit(n: int, as_json: bool) -> int:
    scratch = Path(tempfile.mkdtemp(prefix="dockyard-hit-", dir="/var/tmp"))
    scratch.chmod(0o755)
    images, work = scratch / "images", scratch / "work"
    images.mkdir()
    work.mkdir(mode=0o711)
    make_image_root(image_root(images, IMAGE))
    demo = make_demo_task(scratch / "demo-repo")
    spec = {"repo": demo.repo, "base_commit": demo.base_commit, "image": IMAGE}
    pool = Pool(PoolSettings(job="hit", poll_interval_s=0.05),
                LocalProvider(images, work, env={"DOCKYARD_TASK_EXECUTOR_THREADS": "8"}))
    timings: dict[str, list[float]] = {"pool_acquire": [], "start_session": []}
    try:
        with SandboxClient(pool=pool, urls=["http://127.0.0.1:9"]) as client:
            client.start_session(spec).close()  # the miss: starts the executor
            key_spec = SessionStartSpec.model_validate(spec)
            for _ in range(n):
                started = time.perf_counter()
                lease = pool.acquire(IMAGE, key_spec)
                timings["pool_acquire"].append(time.perf_counter() - started)
                lease.release()
                if lease.outcome != "hit":
                    raise RuntimeError(f"a timed acquire was a {lease.outcome}, not a hit")
            for _ in range(n):
                started = time.perf_counter()
                session = client.start_session(spec)
                timings["start_session"].append(time.perf_counter() - started)
                session.close()
        stats = pool.stats()
        if stats["acquires"]["hit"] != 2 * n or stats["creates"] != 1:
            raise RuntimeError(f"expected {2 * n} hits on one executor: {stats['acquires']}")
    finally:
        report = pool.drain()
        shutil.rmtree(scratch, ignore_errors=True)
    if report["left"]:
        raise RuntimeError(f"drain left {report['left']}")
    result = {name: _figures(values) for name, values in timings.items()}
    for name, figures in result.items():
        print(f"local hit, {name:<14} n={figures['n']:<5} p50 {figures['p50_ms']:.3f} ms  "
              f"p99 {figures['p99_ms']:.3f} ms")
    goal = result["start_session"]["p50_ms"] <= 50.0
    print(f"goal: an acquire that hits <= 50 ms p50 end to end (start_session): "
          f"{'met' if goal else 'NOT met'}")
    if as_json:
        print(json.dumps({"local_hit": result}))
    return 0


if __name__ == "__main__":
    sys.exit(run_local_hit(int(sys.argv[1]) if len(sys.argv) > 1 else 50, "--json" in sys.argv))
