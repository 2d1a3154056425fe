"""The executor's own mount namespace: private, so that what it mounts is in no one else's table.

An executor run in the host's mount namespace kept everything it mounts there: the host view, the
runtime binds, every workspace's tmpfs and overlay, and the workspace holders it makes shared for
the launch namespaces. A second executor on the same host (``dockyard fleet up --workers 4``)
builds its host view with recursive binds of the host's top-level directories, so it copied the
first one's live workspaces: code in its sandboxes found another agent's tree in
``/proc/self/mountinfo`` and read it, and the owner's rmdir of the workspace holder then failed
(EBUSY: the copy was mounted on the same dentry). Path checks cannot close that; the kernel can.

So ``task-executor serve``, as the process's own entry point, leaves the host's mount namespace
before it mounts anything: ``unshare(CLONE_NEWNS)``, then ``/`` made recursively MS_SLAVE. The
host's mounts, later ones included, still show here; nothing mounted here propagates out. What
the executor mounts is then invisible to the host and to every other executor, and goes with the
namespace when the executor's processes are gone: a SIGKILL leaks no mount.

A mount namespace belongs to a thread, not to the process: unshared with other threads running,
only the calling one would move, and the executor would mount in two tables at once. So this
happens while the process is single-threaded (it refuses otherwise), and an app built inside
another process (the tests' in-process executors) never tries. A process its launcher already
put in one (``unshare --mount --propagation slave``, before its first thread: how the test
suite's pytest-xdist workers start) has it recognised by :func:`recognise_inherited`. Either way
:func:`current` says which namespace is in force, and why, for ``/health``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass
from pathlib import Path

from .mounts import MS_SLAVE, set_propagation

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_CLONE_NEWNS = 0x20000


@dataclass(frozen=True)
class ExecutorNamespace:
    """The mount namespace the executor's own mounts live in."""

    private: bool
    reason: str = ""
    """Why it is the host's (empty when private)."""

    @property
    def kind(self) -> str:
        return "private" if self.private else "host"


IN_PROCESS = ExecutorNamespace(
    private=False,
    reason="not entered: the executor was built inside another process (not `task-executor "
    "serve` as its entry point), whose mount namespace it shares",
)

_current = IN_PROCESS


def current() -> ExecutorNamespace:
    """The namespace in force for this process's executor."""
    return _current


def enter_private() -> ExecutorNamespace:
    """Move this (single-threaded) process into a private mount namespace (see the module);
    on refusal it stays in the one it was in, and the reason is kept."""
    global _current
    _current = _enter()
    return _current


def recognise_inherited() -> ExecutorNamespace:
    """Private when the launcher made this process's mount namespace (it is not its parent's) and
    nothing mounted here propagates out (no mount is in a shared peer group); otherwise it is
    the host's, and why is kept. Nothing is entered: for a process that has threads already."""
    global _current
    _current = _inherited()
    return _current


def _inherited() -> ExecutorNamespace:
    own = os.readlink("/proc/self/ns/mnt")
    if own == os.readlink(f"/proc/{os.getppid()}/ns/mnt"):
        return ExecutorNamespace(False, "not entered: the parent process's mount namespace")
    with open("/proc/self/mountinfo") as table:
        shared = [line.split()[4] for line in table if " shared:" in line.split(" - ")[0]]
    if shared:
        return ExecutorNamespace(False, f"inherited, but {shared[0]} propagates to the host's")
    return ExecutorNamespace(True)


def _enter() -> ExecutorNamespace:
    threads = len(os.listdir("/proc/self/task"))  # the kernel's count: C threads too
    if threads > 1:
        return ExecutorNamespace(False, f"not entered: {threads} threads already run, and "
                                 "unshare would move only the calling one")
    home = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.unshare(_CLONE_NEWNS) != 0:
            code = ctypes.get_errno()
            return ExecutorNamespace(False, f"unshare(CLONE_NEWNS) refused: {os.strerror(code)}")
        try:
            set_propagation(Path("/"), MS_SLAVE, recursive=True)
        except OSError as exc:
            # The new namespace's mounts are still peers of the host's (where / is shared), so
            # it would leak both ways: better the host's own table, said as such.
            if _libc.setns(home, _CLONE_NEWNS) != 0:
                code = ctypes.get_errno()
                raise OSError(code, "cannot return to the host's mount namespace after "
                              f"{exc}: {os.strerror(code)}") from exc
            return ExecutorNamespace(False, f"/ could not be made a slave of the host's ({exc})")
    finally:
        os.close(home)
    return ExecutorNamespace(True)
