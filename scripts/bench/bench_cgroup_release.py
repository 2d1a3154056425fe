"""What a workspace's cgroups cost when it is done: removed, or its memory group handed on.

Removing a memory cgroup (an ``rmdir``, quick in itself) leaves the kernel work to do after it:
every filesystem's caches charged to the group move to the parent, so the CPU it costs grows with
the filesystems mounted on the host, and a dense executor mounts several per workspace. That work
ran beside the requests and made DELETE's slow tail at 10,000 sessions (issue 24). This measures
the machine's CPU per group, beyond its idle rate, for ``Group.remove`` and ``Groups.release`` (the
memory group reclaimed and kept; pids and cpu groups removed), with ``--mounts`` tmpfs mounted
beside them in a private mount table. Each group first holds a process that read a file (its page
cache charged to the group), as a workspace's does.

    python scripts/bench/bench_cgroup_release.py --groups 300 --mounts 0,5000
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sandbox import private_mount_table  # noqa: E402

from task_executor.sandbox import cgroups  # noqa: E402
from task_executor.sandbox.cgroups import Group, Groups  # noqa: E402

SETTLE_S = 2.0
"""Time after the calls for the kernel's deferred work (workqueues, RCU) to be counted."""


def machine_cpu_s() -> float:
    """CPU seconds the whole machine spent so far (user, nice, system, irq, softirq, steal)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields[:3] + fields[5:8]) / os.sysconf("SC_CLK_TCK")


def idle_rate(seconds: float = 3.0) -> float:
    start = machine_cpu_s()
    time.sleep(seconds)
    return (machine_cpu_s() - start) / seconds


def filled_groups(groups: Groups, count: int, readable: Path) -> list[Group]:
    made = []
    for index in range(count):
        group = groups.create(f"bench-{index}")
        assert group is not None
        joins = "; ".join(f"echo $$ > {name}" for name in group.procs_files)
        subprocess.run(["sh", "-c", f"{joins}; cat {readable} > /dev/null"], check=True)
        made.append(group)
    return made


def cost(label: str, groups: list[Group], done) -> dict:
    """(CPU ms per group beyond the idle rate, call p50 ms) for ``done(group)`` on each."""
    rate = idle_rate()
    calls = []
    start_cpu, start = machine_cpu_s(), time.monotonic()
    for group in groups:
        began = time.perf_counter()
        done(group)
        calls.append((time.perf_counter() - began) * 1e3)
    time.sleep(SETTLE_S)
    spent = machine_cpu_s() - start_cpu - rate * (time.monotonic() - start)
    calls.sort()
    figures = {"cpu_ms_per_group": round(spent / len(groups) * 1e3, 2),
               "call_p50_ms": round(calls[len(calls) // 2], 3), "idle_cpus": round(rate, 2)}
    print(f"  {label}: {figures}", flush=True)
    return figures


def mount_tmpfs_many(root: Path, count: int) -> None:
    if count:
        subprocess.run(["sh", "-c", f'i=0; while [ $i -lt {count} ]; do mkdir -p {root}/$i; '
                        f'mount -t tmpfs -o size=1m bench {root}/$i; i=$((i+1)); done'],
                       check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--groups", type=int, default=300, help="groups per way and mount count")
    parser.add_argument("--mounts", default="0,5000", help="tmpfs mounted beside, comma-separated")
    args = parser.parse_args()
    if not {"pids", "memory"} <= cgroups.available():
        print("no writable pids and memory cgroups here")
        return 1
    print(f"mount table: {private_mount_table()}")
    scratch = Path(tempfile.mkdtemp(prefix="bench-cgroup-", dir="/var/tmp"))
    readable = scratch / "readable"
    readable.write_bytes(os.urandom(1 << 20))
    results = {}
    groups = Groups(cgroups.available(), f"bench-{uuid.uuid4().hex[:12]}", pids_max=4096,
                    memory_bytes=1 << 30)
    try:
        for count in (int(v) for v in args.mounts.split(",")):
            mount_tmpfs_many(scratch / f"mounts-{count}", count)
            print(f"{count} tmpfs mounted beside, {args.groups} groups each way:")
            removed = cost("removed (Group.remove)", filled_groups(groups, args.groups, readable),
                           Group.remove)
            released = cost("memory group handed on (Groups.release)",
                            filled_groups(groups, args.groups, readable), groups.release)
            results[count] = {"removed": removed, "released": released}
            subprocess.run(["umount", "-R", "-l", str(scratch / f"mounts-{count}")],
                           capture_output=True)
    finally:
        groups.remove_all()
        subprocess.run(["sh", "-c", f"grep -q ' {scratch}/' /proc/self/mountinfo && "
                        f"umount -R -l {scratch}/mounts-*"], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    print(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
