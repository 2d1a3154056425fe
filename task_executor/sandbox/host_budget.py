"""How much of the host all workspaces together may use: the default budgets of their parent
cgroups.

Each workspace's own limits (4,096 processes, 8 GiB of memory with its tmpfs disk in it) bind one
workspace, and there may be a thousand: 64 sessions at their memory limit ask for 512 GiB of a
24 GiB host, and eight fork bombs at their process limit fill a 32,768-pid table. Either takes
the host down, the executor with it, for every tenant at once. So the parent group of all of an
executor's workspaces has a limit too, by default a share of what the host (or the executor's own
container) has: past it the kernel refuses forks, or reclaims and OOM-kills inside the
workspaces, never outside them.

The executor's own cgroup (``own_cgroup``, ``own_memory_limit``) is read here, once for both
uses: the budget, and the run conditions a grading reports (``grading.conditions``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

_NO_LIMIT = 1 << 60
"""A cgroup v1 memory limit at or above this is "no limit" (the kernel prints ~2^63)."""

SHARE = 0.8
"""Of the host's (or the executor's container's) memory and process table, by default (N
executors on one host, as ``dockyard fleet up`` starts them, take 0.8 / N each)."""


def _meminfo_total() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return None


def own_cgroup(controller: str) -> Path | None:
    """The directory of this process's cgroup for ``controller`` (v1), else the unified one."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    unified = None
    for line in lines:
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return Path("/sys/fs/cgroup", names, path.lstrip("/"))
        if names == "":
            unified = Path("/sys/fs/cgroup", path.lstrip("/"))
    return unified


def read_value(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def own_memory_limit() -> int | None:
    """This executor's cgroup memory limit (None: none)."""
    group = own_cgroup("memory")
    if group is None:
        return None
    raw = read_value(group / "memory.max") or read_value(group / "memory.limit_in_bytes")
    if raw is None or raw == "max" or int(raw) >= _NO_LIMIT:
        return None
    return int(raw)


def _int_file(path: str) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(Path(path).read_text().split()[0])
    return None


def default_memory_bytes(share: float = SHARE) -> int | None:
    """``share`` of the host's memory, or of the executor's container limit when lower."""
    known = [v for v in (_meminfo_total(), own_memory_limit()) if v is not None]
    return int(min(known) * share) if known else None


def default_pids(share: float = SHARE) -> int | None:
    """``share`` of the host's process table (pid_max, or threads-max when that is lower)."""
    known = [v for v in (_int_file("/proc/sys/kernel/pid_max"),
                         _int_file("/proc/sys/kernel/threads-max")) if v is not None]
    return int(min(known) * share) if known else None


def resolve(setting: int | str | None, default: Callable[[float], int | None],
            share: float) -> int | None:
    """A configured budget: ``auto`` is ``default(share)``, None no limit, a number itself."""
    return default(share) if setting == "auto" else setting  # type: ignore[return-value]
