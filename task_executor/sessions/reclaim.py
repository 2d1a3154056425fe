"""Closed sessions' workspaces removed after their DELETE has answered (issue 24: DELETE flat).

Once a session's processes are dead, what is left of it is kernel bookkeeping: its cgroups to
remove (an rmdir waits for the memory controller to let go of the group: 20-30 ms at times), its
holder to detach (an unmount may wait out an RCU grace period), its tree to delete. None of it
is the caller's business, and at 10,000 sessions it made DELETE's slow tail (p99 105 ms against a
p50 of 3 ms). So DELETE kills, answers, and leaves the rest to one thread here.

At most ``limit`` workspaces wait: past that, a DELETE removes its own workspace, as it used to,
so that a burst of deletes never holds more than ``limit`` dead workspaces' mounts and disk. At
shutdown the ones still waiting go with the live sessions' workspaces, in one pass.
"""

from __future__ import annotations

import logging
from typing import Protocol

from .worker import QueueWorker

log = logging.getLogger(__name__)

NICE = 10
"""The reclaimer thread's nice value: its work (unmounts, a memory group's reclaim, rmdirs, much
of it in the kernel, on this thread) yields the CPU to the requests, which wait for none of it.
Past ``LIMIT`` waiting, the DELETEs do their own removals, at the executor's priority."""

LIMIT = 1024
"""Workspaces waiting for removal at most (past it, DELETE removes its own). Each waiting one
holds its tree's disk and five mounts. With 64, 100 DELETEs back to back at 10,000 sessions gave
p99 82 ms: they come faster than removals, so the later ones found it full."""


class Removable(Protocol):
    def destroy(self) -> None: ...


class Reclaimer(QueueWorker[Removable]):
    """One thread removing the workspaces handed to :meth:`submit`, in order."""

    thread_name = "reclaimer"
    nice = NICE

    def __init__(self, limit: int = LIMIT) -> None:
        super().__init__(limit)
        self.failures = 0

    def submit(self, workspace: Removable) -> bool:
        """Take ``workspace`` for removal; False when full or closed (remove it yourself)."""
        return self.put(workspace)

    def handle(self, workspace: Removable) -> None:
        try:
            workspace.destroy()
        except Exception:  # logged, never fatal: the next start sweeps what is left
            self.failures += 1
            log.exception("removing a closed session's workspace failed")
