"""Resource limits of code under test, and how each is enforced in the active mode.

    processes  a pids cgroup per workspace; else RLIMIT_NPROC, which counts per uid (every
               sandbox runs as one uid outside, so then the limit is shared by all of them)
    memory     a memory cgroup per workspace (tmpfs pages the workspace writes count too)
    together   the parent groups of all workspaces: processes and memory of all of them (a share
               of the host's by default, see ``host_budget``)
    disk       a size-limited tmpfs holding everything the workspace writes (its overlay upper,
               its /tmp and home, its copy-on-write runtime layers): ENOSPC past it, root or not
    file size  RLIMIT_FSIZE, inherited by every process
    /dev/shm   a private tmpfs of its own size per sandbox
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .programs import host_program


@functools.cache
def _prlimit() -> str | None:
    """Looked up once (every grading and session start builds a launcher), by absolute path."""
    return host_program("prlimit")


@dataclass(frozen=True)
class Limits:
    """Limits per workspace (None leaves one off)."""

    pids: int | None = 4096
    memory_bytes: int | None = 8 * 1024**3
    disk_bytes: int | None = 4 * 1024**3
    fsize_bytes: int | None = 8 * 1024**3
    shm_bytes: int = 64 * 1024**2
    all_pids: int | None = None
    """Processes of all the executor's workspaces together (their parent pids cgroup)."""
    all_memory_bytes: int | None = None
    """Memory of all the executor's workspaces together (their parent memory cgroup)."""

    def prlimit_argv(self, nproc: bool, fsize: bool = True) -> list[str]:
        """argv prefix setting the rlimits (RLIMIT_NPROC only when no pids cgroup binds;
        RLIMIT_FSIZE unless the caller sets it itself, see :attr:`fsize_blocks`)."""
        prlimit = _prlimit()
        if prlimit is None:
            return []
        pairs = [("--nproc", self.pids if nproc else None),
                 ("--fsize", self.fsize_bytes if fsize else None)]
        options = [f"{flag}={value}" for flag, value in pairs if value is not None]
        return [prlimit, *options, "--"] if options else []

    @property
    def fsize_blocks(self) -> int | None:
        """RLIMIT_FSIZE as POSIX ``ulimit -f`` takes it: in 512-byte blocks (dash, busybox and
        bash as ``sh`` alike), rounded down."""
        return None if self.fsize_bytes is None else self.fsize_bytes // 512
