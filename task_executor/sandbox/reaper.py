"""Finding and killing every process a shell or a test run started, however it tried to leave.

Killing a process group is not enough (Sandman table A22): children that ``setsid`` or
double-fork leave the group, and children that ignore SIGTERM outlive a polite signal. So every
process the executor starts gets a marker in its environment (:data:`MARKER_VAR`, inherited by all
descendants that do not scrub their environment), and a sweep finds processes by that marker, by
session id (which survives a double fork and a scrubbed environment, but not ``setsid``) or by
process group, optionally only those started after a given moment; then SIGTERM, a short grace,
and SIGKILL repeated until a scan finds nothing.

What escapes: a process that both scrubs its environment and calls ``setsid`` (or rewrites its
environ block, as ``setproctitle`` may). Only a cgroup would catch those.

A session or group id named by a caller is only trusted while its leader is gone or carries the
marker, so a leader pid reused by an unrelated process does not hand its session to the sweep.

Only ``/proc`` and signals are used (no psutil); Linux only. The caller's own process, session
and group are never signalled.
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass

MARKER_VAR = "DOCKYARD_MARKER"
"""Environment variable whose value marks every process of one session or run."""

DEFAULT_GRACE_S = 0.5
_POLL_S = 0.01
_KILL_ROUNDS_S = 5.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcInfo:
    """What a sweep needs to know about one process, from ``/proc/<pid>/stat``."""

    pid: int
    pgid: int
    sid: int
    start_ticks: int
    """Start time in clock ticks since boot."""


Finder = Callable[[], Iterable[int]]
"""Where a sweep looks (see ``Target.within``)."""


@dataclass(frozen=True)
class Target:
    """Which processes a sweep kills: those matching any criterion, started at/after a moment."""

    marker: str | None = None
    sids: Collection[int] = ()
    pgids: Collection[int] = ()
    started_at_or_after: int | None = None
    """Clock ticks since boot (see :func:`boot_ticks`); None means any age."""
    environment: Collection[str] = ()
    """``NAME=value`` entries: a process whose initial environment holds any of them matches
    (how a restarted executor finds what its predecessor left, by its owner variable)."""
    within: Finder | None = None
    """Where to look, asked before every scan: pids among which every process the target can
    match is (see :func:`tree_of`); None: every process of the machine. A scan of all of
    ``/proc`` reads thousands of files at a thousand live sessions, and a DELETE scans several
    times (issue 24)."""


@dataclass(frozen=True)
class KillTotals:
    """What :func:`kill` has killed in this process so far (exported as metrics)."""

    processes: int
    groups: int
    """Distinct process groups among those processes."""


_totals_lock = threading.Lock()
_totals = KillTotals(processes=0, groups=0)


def new_marker() -> str:
    """A fresh random marker value."""
    return secrets.token_hex(16)


def boot_ticks() -> int:
    """Now, in the clock the kernel stamps process start times with (ticks since boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * CLOCK_TICKS)


def read_proc(pid: int) -> ProcInfo | None:
    """The process's ids and start time, or None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return ProcInfo(pid=pid, pgid=int(fields[2]), sid=int(fields[3]), start_ticks=int(fields[19]))


def has_marker(pid: int, marker: str) -> bool:
    """Whether the process's initial environment holds ``MARKER_VAR=marker``."""
    return has_environ_entry(pid, (f"{MARKER_VAR}={marker}",))


def has_environ_entry(pid: int, entries: Collection[str]) -> bool:
    """Whether the process's initial environment holds any of the ``NAME=value`` entries."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = b"\0" + f.read()
    except OSError:
        return False
    return any(b"\0" + entry.encode() + b"\0" in environ for entry in entries)


def killed_totals() -> KillTotals:
    """Processes (and their groups) that :func:`kill` found and killed in this process."""
    return _totals


def _pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def children(pid: int) -> list[int]:
    """The process's children (of all its threads); empty once it is gone."""
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                found.extend(int(child) for child in f.read().split())
    except OSError:  # gone meanwhile
        pass
    return found


def tree_of(roots: Iterable[int]) -> Finder:
    """A ``Target.within`` for processes that cannot leave the trees under ``roots``: those
    in a PID namespace whose init is among them (an orphan there is adopted by that init, or
    by a subreaper below it). Every pid it has seen stays a root for later scans: a parent
    killed in one round leaves its children to an adopter outside the tree, and the next scan
    must still find them. (A seen pid reused by another process is only a candidate: it
    must still match the target.)"""
    seen = set(roots)

    def scan() -> list[int]:
        todo = [pid for pid in seen if os.path.exists(f"/proc/{pid}")]
        live = set(todo)
        while todo:
            for child in children(todo.pop()):
                if child not in live:
                    live.add(child)
                    todo.append(child)
        seen.update(live)
        return sorted(live)

    return scan


def find(target: Target) -> list[ProcInfo]:
    """Live processes that the target designates (never the calling process)."""
    me = os.getpid()
    # Never our own session or group, even if a caller names it.
    sids = _still_ours(set(target.sids) - {os.getsid(0)}, target.marker)
    pgids = _still_ours(set(target.pgids) - {os.getpgrp()}, target.marker)
    found = []
    for pid in target.within() if target.within is not None else _pids():
        if pid == me:
            continue
        info = read_proc(pid)
        if info is None:
            continue
        if target.started_at_or_after is not None and info.start_ticks < target.started_at_or_after:
            continue
        if (
            info.sid in sids
            or info.pgid in pgids
            or (target.marker is not None and has_marker(pid, target.marker))
            or (target.environment and has_environ_entry(pid, target.environment))
        ):
            found.append(info)
    return found


def _still_ours(leaders: set[int], marker: str | None) -> set[int]:
    """Drop session or group ids whose leader's pid now belongs to someone else.

    A session or group outlives its leader, and once the leader is gone its pid can be reused
    by an unrelated process that becomes the leader of a session of its own: a live leader
    without the marker means the id is no longer the one the caller meant.
    """
    if marker is None:
        return leaders
    return {pid for pid in leaders if read_proc(pid) is None or has_marker(pid, marker)}


def _signal_all(procs: list[ProcInfo], signum: int) -> None:
    me = os.getpgrp()
    for proc in procs:
        try:
            # A group whose leader is itself a target is wholly ours: signal every member,
            # including any that scrubbed its environment.
            if proc.pgid == proc.pid and proc.pgid != me:
                os.killpg(proc.pgid, signum)
            os.kill(proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def kill(target: Target, grace: float = DEFAULT_GRACE_S) -> int:
    """SIGTERM the target's processes, wait up to ``grace`` s, then SIGKILL until none is left.

    Returns how many distinct processes were found. Stopped processes are continued so they can
    act on SIGTERM. Fork loops are outrun by rescanning until a scan comes back empty.
    """
    seen: set[int] = set()
    groups: set[int] = set()
    procs = find(target)
    if grace > 0 and procs:
        seen.update(p.pid for p in procs)
        groups.update(p.pgid for p in procs)
        _signal_all(procs, signal.SIGTERM)
        _signal_all(procs, signal.SIGCONT)
        deadline = time.monotonic() + grace
        while procs and time.monotonic() < deadline:
            time.sleep(_POLL_S)
            procs = find(target)
    deadline = time.monotonic() + _KILL_ROUNDS_S
    while procs:
        seen.update(p.pid for p in procs)
        groups.update(p.pgid for p in procs)
        # Freeze first so nothing forks between the scan and the kill.
        _signal_all(procs, signal.SIGSTOP)
        _signal_all(procs, signal.SIGKILL)
        if time.monotonic() > deadline:
            break
        time.sleep(_POLL_S / 10)
        procs = find(target)
    if seen:
        global _totals
        with _totals_lock:
            _totals = KillTotals(_totals.processes + len(seen), _totals.groups + len(groups))
    return len(seen)
