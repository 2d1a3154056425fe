"""Idle shells saved and stopped, and restored by their next command (issue 24, part 4).

A live session costs its shell's processes (three under bubblewrap: bwrap, the sandbox's init,
bash), their memory, and about ten fds in the executor. Most of an agent's sessions sit idle
between its turns, so "N logical environments on Q physical slots": a shell with nothing
running, idle longer than ``DOCKYARD_SESSION_IDLE_STOP`` seconds, is *parked*: its saved state
(variables, exported environment, functions, aliases, ``shopt`` options; the cwd, as ``$PWD`` in
it) -- the snapshot every command already writes for a recovery -- is copied into the
executor's memory, the shell and its processes are stopped, and every fd the runner holds is
closed. The tree stays where it is. The next call that needs the shell opens fresh fds and
starts a shell from that state, as a recovery does: what a recovery loses (``set`` options,
traps, the job table) a parked shell loses too.

A shell with anything else running (a background job, a server the agent started, an orphan
adopted by the sandbox's init) is never parked: stopping it would kill the agent's work.

:class:`Parking` is mixed into :class:`~task_executor.sessions.runner.ShellSession` (one per
shell: a session with several shells parks each on its own); :func:`park_idle` is the sweep the
session manager runs from its reaper thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from task_executor.sandbox import reaper


@dataclass(frozen=True)
class Parked:
    """What a parked shell keeps: its saved state, and where it was."""

    state: bytes
    cwd: str | None
    since: float
    fresh: bool = False
    """Started parked: no shell ran yet (its first starts from ``state``, in ``cwd``)."""


class Parking:
    """Park and unpark one shell runner. The runner provides the attributes below; every
    method is called with the runner's ``_lock`` held, except :meth:`park`, which takes it."""

    _lock: threading.Lock
    _closed: bool
    _sids: set[int]
    _snap_fds: tuple[int, ...]
    _parked: Parked | None

    # -- provided by the runner
    def _open_fds(self) -> None:
        raise NotImplementedError

    def _close_fds(self) -> None:
        raise NotImplementedError

    def _latest_state(self) -> bytes:
        raise NotImplementedError

    def _ping(self, within: float) -> bool:
        """Whether the shell answers a ping in time (after its last snapshot is written)."""
        raise NotImplementedError

    def _shell_cwd(self) -> str | None:
        raise NotImplementedError

    def _shell_pids(self) -> set[int]:
        """The shell's own processes (see :func:`shell_chain`); empty without a live shell."""
        raise NotImplementedError

    def _session_pids(self) -> set[int]:
        """Every live process of the session, the shell's included."""
        raise NotImplementedError

    def _kill_everything(self) -> None:
        raise NotImplementedError

    def _release_spare(self) -> None:
        """Let a spare subshell waiting for the next call go (it is the shell's, not the
        agent's)."""
        raise NotImplementedError

    @property
    def parked(self) -> bool:
        """Whether the shell is saved and stopped (its next command restarts it)."""
        return self._parked is not None

    @property
    def never_started(self) -> bool:
        """Parked from its creation, its first start still to come (see ``warmup``)."""
        return self._parked is not None and self._parked.fresh

    def park(self) -> bool:
        """Save and stop the shell if nothing but the shell runs; whether it is parked now.
        A runner busy with a command is left alone (the lock is not waited for)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._closed or self._parked is not None:
                return self._parked is not None
            self._release_spare()
            shell = self._shell_pids()
            if not shell or self._session_pids() - shell:
                return False  # no shell to save, or the agent left something running
            # The shell writes a command's snapshot after answering it: a ping is answered only
            # once that is done (parked at once after a command, the state before it was kept).
            if not self._ping(within=2.0):
                return False
            cwd = self._shell_cwd()
            state = self._latest_state()
            self._kill_everything()
            self._close_fds()
            self._sids.clear()  # their leaders are gone; the pids may be reused
            self._parked = Parked(state=state, cwd=cwd, since=time.monotonic())
            return True
        finally:
            self._lock.release()

    def _unpark(self) -> None:
        """Fresh fds holding the saved state; the next command starts a shell from it (the
        runner's recovery path: no live shell)."""
        parked = self._parked
        if parked is None:
            return
        self._open_fds()
        for fd in self._snap_fds:
            os.pwrite(fd, parked.state, 0)
        self._parked = None

    def _parked_state(self) -> bytes | None:
        return None if self._parked is None else self._parked.state

    def _parked_cwd(self) -> str | None:
        return None if self._parked is None else self._parked.cwd


def shell_chain(pid: int, depth: int = 4) -> set[int]:
    """The shell's own processes: the launched one and, under bubblewrap, down from bwrap
    through its only child each time (the sandbox's init, then bash); a child of bash is the
    agent's."""
    chain = {pid}
    for _ in range(depth):
        try:
            with open(f"/proc/{pid}/comm", "rb") as f:
                if f.read().strip() != b"bwrap":
                    break
        except OSError:
            break
        children = reaper.children(pid)
        if len(children) != 1:
            break
        pid = children[0]
        chain.add(pid)
    return chain


def park_idle(
    runners: Iterable[tuple[Parking, float]], idle_for: float,
    now: Callable[[], float] = time.monotonic,
) -> int:
    """Park every runner whose session has been idle longer than ``idle_for`` seconds (each
    runner with the time of its session's last call); how many were parked by this call."""
    parked = 0
    for runner, last_used in runners:
        if now() - last_used > idle_for and not runner.parked and runner.park():
            parked += 1
    return parked
