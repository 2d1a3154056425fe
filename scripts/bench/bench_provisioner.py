"""Benchmark the provisioner against the stand-in API on loopback: pacing, create-to-Ready, drain,
and the same run with faults injected into a share of creates and deletes.

Usage: python scripts/bench/bench_provisioner.py [--pods 500] [--rate 50] [--burst 10]
                                                 [--ready-after 0.05] [--fault-share 0.1]

Everything runs on 127.0.0.1; nothing reaches a cluster. Reports the create rate the stand-in saw,
create-to-Ready p50/p99 as the caller sees it, the live-pod high-water mark against the cap, how
long the drain took, and the pods left afterwards (must be 0).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sandbox_client.provisioner import APIConfig, Provisioner, ProvisionerSettings  # noqa: E402
from sandbox_client.provisioner.testing import Fault, StandInAPI, StandInServer  # noqa: E402

FAULTS = [Fault("create", status=500), Fault("create", drop=True),
          Fault("create", status=500, store=False), Fault("create", status=429, store=False,
                                                          retry_after=0.05),
          Fault("delete", drop=True), Fault("delete", status=500, store=False)]


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def run(pods: int, rate: float, burst: int, ready_after: float, fault_share: float,
        seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    with StandInServer(StandInAPI(ready_after=ready_after)) as server:
        api = server.api
        for _ in range(int(pods * fault_share)):
            api.inject(rng.choice(FAULTS))
        settings = ProvisionerSettings(
            job=f"bench-{seed}", namespace="bench", api=APIConfig(host=server.url),
            max_live=pods, rate=rate, burst=burst, jitter_s=0.2 / rate, poll_interval_s=0.02,
            backoff_s=(0.01, 0.05, 0.1), settle_s=0.1, handle_signals=False)
        prov = Provisioner(settings)
        start = time.monotonic()
        tickets = [prov.submit() for _ in range(pods)]
        ready_at: dict[str, float] = {}
        while len(ready_at) < pods and time.monotonic() - start < 120:
            prov.refresh()  # the poll provision() runs, sampled here per pod
            now = time.monotonic()
            for record in prov.pods():
                if record.state == "ready" and record.name not in ready_at:
                    ready_at[record.name] = now - start
            time.sleep(0.01)
        created = api.times("create")
        drain_start = time.monotonic()
        left = prov.drain()
        drain_s = time.monotonic() - drain_start
        latencies = sorted(ready_at.values())
        return {
            "pods": pods,
            "creates_sent": len(created),
            "tickets_created": sum(t.state == "created" for t in tickets),
            "rate_seen": (len(created) - burst) / max(1e-9, max(created) - sorted(created)[burst]),
            "to_ready_p50_s": percentile(latencies, 50) if latencies else float("nan"),
            "to_ready_p99_s": percentile(latencies, 99) if latencies else float("nan"),
            "high_water": api.high_water,
            "drain_s": drain_s,
            "left_after_drain": left + len(api.live("bench")),
            "faults_unused": api.pending_faults(),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--ready-after", type=float, default=0.05)
    parser.add_argument("--fault-share", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    for share in (0.0, args.fault_share):
        result = run(args.pods, args.rate, args.burst, args.ready_after, share, args.seed)
        print(f"fault share {share:.0%}: " + ", ".join(
            f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}"
            for key, value in result.items()))
        if result["left_after_drain"]:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
