"""A cgroup per workspace: process and memory limits that bind root inside the sandbox.

``ulimit -u`` counts processes per uid, and every sandbox runs as one uid outside, so it can
neither bind one workspace nor spare the others; a pids cgroup counts exactly the workspace's
processes, whoever they claim to be. The memory controller caps what the workspace's processes
(and the tmpfs pages they write: the workspace's disk quota lives in memory) may use. A process
enters its group before it becomes the sandbox uid (the launcher's wrapper), and nothing inside can
leave: the hierarchy is read-only in the sandbox and owned by the host's root.

The cpu controller gives every workspace a group of the same weight (v1 ``cpu.shares`` 1024, v2
``cpu.weight`` 100), so the scheduler shares the CPU between workspaces, not between threads: a
session running 128 busy loops gets no more of it than a neighbour's grading running one.

cgroup v1 (one hierarchy per controller, as on this machine) and v2 (one unified hierarchy whose
root delegates ``pids`` and ``memory``) are both handled; where neither can be written (a default
Kubernetes pod), ``available()`` is empty and the limits fall back to rlimits.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
_UNLIMITED = {"pids": "max", "memory": "-1"}  # what cgroup v1 takes for "no limit"
_LIMIT_FILES = {
    ("v1", "pids"): "pids.max", ("v1", "memory"): "memory.limit_in_bytes",
    ("v2", "pids"): "pids.max", ("v2", "memory"): "memory.max",
    ("v1", "cpu"): "cpu.shares", ("v2", "cpu"): "cpu.weight",
}
CONTROLLERS = ("pids", "memory", "cpu")
CPU_WEIGHT = {"v1": 1024, "v2": 100}
"""Every workspace's CPU weight: each controller version's default, the same for all."""
_MAX_CPU_WEIGHT = {"v1": 262144, "v2": 10000}


def _hierarchy(controller: str) -> tuple[str, Path] | None:
    """(version, directory under which this executor may make groups) for ``controller``."""
    v1 = ROOT / controller
    if (v1 / "cgroup.procs").exists():
        return "v1", v1
    unified = ROOT / "cgroup.controllers"
    if unified.exists() and controller in unified.read_text().split():
        return "v2", ROOT
    return None


def _probe(version: str, parent: Path, controller: str) -> bool:
    probe = parent / f"dockyard-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        if version == "v2":
            with contextlib.suppress(OSError):
                (parent / "cgroup.subtree_control").write_text(f"+{controller}")
        return (probe / _LIMIT_FILES[(version, controller)]).exists()
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def available() -> frozenset[str]:
    """The controllers (of ``pids``, ``memory``, ``cpu``) a group can be made and limited in."""
    found = set()
    for controller in CONTROLLERS:
        where = _hierarchy(controller)
        if where is not None and _probe(*where, controller):
            found.add(controller)
    return frozenset(found)


@dataclass
class Group:
    """One workspace's groups, one directory per controller (one in all under v2)."""

    directories: dict[str, Path]
    on_remove: Callable[[], None] | None = None

    @property
    def procs_files(self) -> list[str]:
        return sorted({str(d / "cgroup.procs") for d in self.directories.values()})

    def pids(self) -> set[int]:
        found: set[int] = set()
        for name in self.procs_files:
            with contextlib.suppress(OSError):
                found.update(int(line) for line in Path(name).read_text().split())
        return found

    def kill_all(self, timeout: float = 5.0) -> int:
        """SIGKILL every process in the group until it is empty; how many were signalled."""
        killed = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
            time.sleep(0.01)
        return killed

    def remove(self) -> None:
        """Kill what is left and remove the directories (a group with members cannot go)."""
        self.kill_all()
        for directory in set(self.directories.values()):
            for _ in range(100):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        break
                    time.sleep(0.01)
        on_remove, self.on_remove = self.on_remove, None
        if on_remove is not None:
            on_remove()


class Groups:
    """Makes per-workspace groups under ``dockyard-<executor id>`` in each hierarchy."""

    def __init__(self, controllers: frozenset[str], executor_id: str,
                 pids_max: int | None, memory_bytes: int | None,
                 all_pids: int | None = None, all_memory_bytes: int | None = None) -> None:
        self.limits: dict[str, int | None] = {"pids": pids_max, "memory": memory_bytes}
        self._cpu_groups = 0
        self._cpu_lock = threading.Lock()
        # The parent's own limit binds all its workspaces together (see ``host_budget``).
        self.totals = {"pids": all_pids, "memory": all_memory_bytes}
        self.parents: dict[str, tuple[str, Path]] = {}
        for controller in controllers:
            where = _hierarchy(controller)
            if where is None:
                continue
            version, root = where
            if controller == "cpu":
                self.limits["cpu"] = CPU_WEIGHT[version]  # always: fairness needs no setting
            elif self.limits[controller] is None and self.totals[controller] is None:
                continue
            parent = root / f"dockyard-{executor_id}"
            parent.mkdir(exist_ok=True)
            if version == "v2":
                with contextlib.suppress(OSError):
                    (parent / "cgroup.subtree_control").write_text(f"+{controller}")
            if controller != "cpu":  # the parent keeps the default weight among its siblings
                total = self.totals[controller]
                (parent / _LIMIT_FILES[(version, controller)]).write_text(
                    "max" if total is None and version == "v2"
                    else str(total if total is not None else _UNLIMITED[controller]))
            self.parents[controller] = (version, parent)

    @property
    def controllers(self) -> frozenset[str]:
        return frozenset(self.parents)

    @property
    def cpu_weight(self) -> int | None:
        """Every workspace's CPU weight, or None without a cpu group per workspace."""
        return self.limits.get("cpu") if "cpu" in self.parents else None

    def create(self, name: str) -> Group | None:
        if not self.parents:
            return None
        directories: dict[str, Path] = {}
        for controller, (version, parent) in self.parents.items():
            directory = parent / name
            directory.mkdir(parents=True, exist_ok=True)
            limit = self.limits[controller]
            if limit is not None:
                (directory / _LIMIT_FILES[(version, controller)]).write_text(str(limit))
            directories[controller] = directory
        if "cpu" not in self.parents:
            return Group(directories)
        self._reweigh(+1)
        return Group(directories, on_remove=lambda: self._reweigh(-1))

    def _reweigh(self, change: int) -> None:
        """The parent weighs as much as its workspaces together: a workspace then gets the share
        of one process of the machine, as a neighbour outside gets, not a slice of one share
        (a grading beside a busy workspace ran at half speed against other load: 1.87x)."""
        version, parent = self.parents["cpu"]
        with self._cpu_lock:
            self._cpu_groups = max(0, self._cpu_groups + change)
            weight = min(_MAX_CPU_WEIGHT[version], CPU_WEIGHT[version] * max(1, self._cpu_groups))
            with contextlib.suppress(OSError):
                (parent / _LIMIT_FILES[(version, "cpu")]).write_text(str(weight))

    def remove_all(self) -> None:
        """Remove every group this executor (or a crashed predecessor) left, then the parents."""
        for _, parent in self.parents.values():
            if not parent.is_dir():
                continue
            for child in parent.iterdir():
                if child.is_dir():
                    Group({"any": child}).remove()
            with contextlib.suppress(OSError):
                parent.rmdir()


def remove_executor_groups(executor_id: str) -> int:
    """Remove every group an executor with ``executor_id`` left in any hierarchy (it was killed
    before it could); how many parents were found. Its processes are killed first."""
    found = 0
    for controller in CONTROLLERS:
        where = _hierarchy(controller)
        if where is None:
            continue
        parent = where[1] / f"dockyard-{executor_id}"
        if not parent.is_dir():
            continue
        found += 1
        for child in parent.iterdir():
            if child.is_dir():
                Group({controller: child}).remove()
        with contextlib.suppress(OSError):
            parent.rmdir()
    return found
