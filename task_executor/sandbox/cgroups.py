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

A workspace's memory group (cgroup v1) is handed to the next workspace when it is done, not
removed (``Groups.release``): removing a memory group costs kernel CPU, after the rmdir, that
grows with every filesystem mounted on the host (each one's cache lists move to the parent: 0.8
ms of CPU with none beside, 2.1 ms beside 5,000 tmpfs, ``scripts/bench/bench_cgroup_release.py``),
and at density those removals, beside the requests, made DELETE's slow tail (p99 15.9 against
3.3 ms with the groups handed on, 10,000 sessions, ``scripts/bench/bench_density.py``).
It goes back empty of processes, its memory reclaimed, and only if what stays charged to it is at
most ``REUSE_SLACK_BYTES``: the reclaim gets the page cache back, not the kernel's own objects
(inodes, dentries: about 0.7 MB after reading 3,000 of the host's files), nor what another live
process still pins. (A red-team run pinned 5.8 GB of inodes through directory fds passed to a
live session, and the next workspace was OOM-killed at 6 of its 8 GiB, when only anon pages were
counted.) What stays would tell the next workspace something of the last one, and its counters
(``memory.stat``, ``memory.oom_control``, the peak) cannot be reset: so a sandbox sees its memory
group's limit only (``SANDBOX_MEMORY_FILES``), and what it could still learn, by filling its
memory to the limit, is a shift of at most ``REUSE_SLACK_BYTES``. The pids and cpu groups, whose
removal costs nothing measurable, are made and removed per workspace.

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
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
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
SANDBOX_MEMORY_FILES = ("memory.limit_in_bytes",)
"""What a sandbox sees of its v1 memory group: its limit; not its use, whose start is what the last
workspace left (see the module)."""
REUSE_SLACK_BYTES = 4 << 20
"""What a released memory group may still have charged and be handed on (after its reclaim). A
workspace leaves 0.1-1.5 MB of the kernel's objects after ordinary work; past this the group is
removed instead."""
_EMPTYING_TRIES = 5
_EMPTYING_PAUSE_S = 0.02
_RESETS = ("memory.max_usage_in_bytes", "memory.failcnt")
"""A released v1 memory group's peak (then its use: next to nothing) and failure count, for
whoever reads them on the host."""
_REMOVE_WORKERS = 8


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

    def kill_all(self, timeout: float = 5.0, poll: float = 0.01) -> None:
        """SIGKILL every process in the group until it is empty (looking every ``poll`` s)."""
        kill_groups([self], timeout, poll)

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


def kill_groups(groups: Iterable[Group], timeout: float = 10.0, poll: float = 0.01) -> None:
    """SIGKILL every process in ``groups`` until they are empty, all groups in each pass (one
    by one, each waiting for its own group to empty, 10,000 live sessions waited 10,000 times).
    One hierarchy's member list is read per group: every process of a workspace is in all."""
    deadline = time.monotonic() + timeout
    files = [group.procs_files[0] for group in groups if group.directories]
    while time.monotonic() < deadline:
        pids: set[int] = set()
        for name in files:
            with contextlib.suppress(OSError):
                with open(name) as members:
                    pids.update(int(line) for line in members)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(poll)


def remove_emptied(groups: list[Group]) -> None:
    """Remove groups just emptied (``kill_groups``), a few at a time: an rmdir waits for the
    kernel, not for the CPU. Nothing more for a group whose directories went: ``Group.remove``
    would read every member list once more and lower the parent's CPU weight by one (a cgroup
    write each, 10,000 of them: most of a 30 s shutdown). A group that could not go is left to
    ``Group.remove``, which kills and retries."""
    with ThreadPoolExecutor(_REMOVE_WORKERS, thread_name_prefix="cgroup-removal") as pool:
        list(pool.map(_remove_emptied, groups))


def _remove_emptied(group: Group) -> None:
    removed = True
    for directory in set(group.directories.values()):
        try:
            directory.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            removed = False
    if removed:
        group.on_remove = None
    else:
        group.remove()


class Groups:
    """Makes per-workspace groups under ``dockyard-<executor id>`` in each hierarchy."""

    def __init__(self, controllers: frozenset[str], executor_id: str,
                 pids_max: int | None, memory_bytes: int | None,
                 all_pids: int | None = None, all_memory_bytes: int | None = None) -> None:
        self.limits: dict[str, int | None] = {"pids": pids_max, "memory": memory_bytes}
        self._cpu_groups = 0
        self._cpu_lock = threading.Lock()
        self._free: list[Path] = []
        """Released memory groups (v1), emptied, waiting for the next ``create``."""
        self._free_lock = threading.Lock()
        self._closed = False
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

    @property
    def free(self) -> int:
        """Released memory groups waiting to be handed out again."""
        return len(self._free)

    @property
    def reuses_memory(self) -> bool:
        """Memory groups are handed on (v1 only: under v2 one directory holds every
        controller, all of whose counters a sandbox would see)."""
        return self.parents.get("memory", ("",))[0] == "v1"

    def create(self, name: str) -> Group | None:
        """A workspace's groups, named ``name``; its memory group is a released one if there is
        one (that directory keeps the name it was made with)."""
        if not self.parents:
            return None
        directories: dict[str, Path] = {}
        for controller, (version, parent) in self.parents.items():
            if controller == "memory" and self.reuses_memory:
                with self._free_lock:
                    reused = self._free.pop() if self._free else None
                if reused is not None:
                    directories[controller] = reused
                    continue
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

    def release(self, group: Group) -> None:
        """A workspace is done with ``group``: its memory group is kept for the next ``create``
        once its processes are gone and nothing unreclaimable stays charged to it (release it
        after the workspace's tmpfs went: its pages are charged there); the rest is removed."""
        group.kill_all()
        memory = group.directories.get("memory")
        if memory is None or not self.reuses_memory or group.pids() or not self._emptied(memory):
            group.remove()
            return
        rest = Group({c: d for c, d in group.directories.items() if c != "memory"},
                     on_remove=group.on_remove)
        group.on_remove = None
        rest.remove()
        with self._free_lock:
            if not self._closed:
                self._free.append(memory)
                return
        Group({"memory": memory}).remove()

    def _emptied(self, directory: Path) -> bool:
        """Reclaim what is charged to the memory group ``directory`` (the last workspace's page
        cache), forget its peak and failures, and say whether what stays is at most
        ``REUSE_SLACK_BYTES``. The reclaim is a limit of 0, put back at once (no process is there
        to need it): the kernel reclaims until nothing more goes, and stops at the first pass that
        frees nothing (a release costs 1.0 ms of CPU in all), where ``force_empty`` tries 16 such
        passes (5.5 ms, more than a removal) and gets no more back."""
        limit = str(-1 if self.limits["memory"] is None else self.limits["memory"])
        usage = None
        for _ in range(_EMPTYING_TRIES):
            with contextlib.suppress(OSError):  # EBUSY: what stays could not be reclaimed
                (directory / "memory.limit_in_bytes").write_text("0")
            try:
                (directory / "memory.limit_in_bytes").write_text(limit)
                # All that is charged: pages, and the kernel's objects (inodes, dentries, pipes).
                usage = int((directory / "memory.usage_in_bytes").read_text())
            except (OSError, ValueError):
                return False  # (removed then: never handed on without its limit)
            if usage <= REUSE_SLACK_BYTES:
                break
            # What processes just killed held goes after an RCU grace period: 2-3.7 MB right
            # after a fork loop's kill, 0.3-0.7 MB 10 ms later.
            time.sleep(_EMPTYING_PAUSE_S)
        for name in _RESETS:
            with contextlib.suppress(OSError):
                (directory / name).write_text("0")
        return usage is not None and usage <= REUSE_SLACK_BYTES

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
        """Remove every group this executor (or a crashed predecessor) left, the released ones
        too, then the parents; a group released afterwards is removed at once."""
        with self._free_lock:
            self._closed = True
            self._free.clear()
        for _, parent in self.parents.values():
            if parent.is_dir():
                _remove_children(parent)


def _remove_children(parent: Path) -> None:
    """Kill and remove every group below ``parent``, and ``parent``."""
    children = [Group({"any": child}) for child in parent.iterdir() if child.is_dir()]
    kill_groups(children)
    remove_emptied(children)
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
        _remove_children(parent)
    return found
