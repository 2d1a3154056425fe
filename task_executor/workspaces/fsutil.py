"""Filesystem chores shared by workspaces and templates: remove, copy, measure (mounts live in
``task_executor.sandbox.mounts``).

Trees here belong to code under test, which may nest directories thousands deep (past Python's
recursion limit, past PATH_MAX) and take permissions away: every walk is done by coreutils
(fts: any depth, symlinks never followed), never by a recursive walk in Python.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

# Only the host's tools (find -execdir refuses to run with a relative PATH entry).
_TOOLS_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


class CopyFailed(Exception):
    """cp could not copy a tree. ``reason`` is its error without the path (a host path), as
    ``strerror`` gives it: "File name too long", "No space left on device"."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    @property
    def out_of_space(self) -> bool:
        """The target's disk (the executor's), not the tree, was the cause."""
        return self.reason in (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


def remove_tree(path: Path) -> None:
    """Remove a tree however deep, even when the code under test made parts of it unreadable or
    read-only. Nothing outside ``path`` is ever changed: when the root itself cannot go (a mount
    point, a parent the executor may not write), its parent keeps its mode."""
    if path.is_symlink():
        path.unlink()
        return
    if not os.path.lexists(path) or _rm(path):
        return
    # Modes stop only an executor that is not root: open up the tree's own directories for
    # their owner, top down (find visits a directory before it reads it, and -execdir names
    # it relative to its parent, so no path grows past PATH_MAX), then remove again.
    subprocess.run(["find", str(path), "-type", "d", "!", "-perm", "-u=rwx",
                    "-execdir", "chmod", "u+rwx", "--", "{}", ";"],
                   stdin=subprocess.DEVNULL, capture_output=True, env=_TOOLS_ENV, check=False)
    if not _rm(path):
        log.warning("could not remove %s entirely", path)


def _rm(path: Path) -> bool:
    """``rm -rf``: whether nothing is left."""
    proc = subprocess.run(["rm", "-rf", "--", str(path)], stdin=subprocess.DEVNULL,
                          capture_output=True, env=_TOOLS_ENV, check=False)
    if proc.returncode != 0:
        log.debug("rm -rf %s: %s", path, proc.stderr.decode("utf-8", "replace")[-500:])
    return not os.path.lexists(path)


def copy_tree(source: Path, target: Path, reflink: bool) -> None:
    """A full copy keeping modes, owners, links, device files (overlay whiteouts) and xattrs."""
    mode = "--reflink=always" if reflink else "--reflink=auto"
    _cp([mode, "--", str(source), str(target)])


def copy_over(source: Path, target: Path) -> None:
    """``source``'s contents copied onto the tree at ``target``, replacing what is in the way
    (an overlay upper directory over a copy of its lower layer: whiteouts replace what they
    hide, which is what a lower layer needs)."""
    _cp(["--remove-destination", f"{source}/.", str(target)])


def _cp(arguments: list[str]) -> None:
    proc = subprocess.run(["cp", "-a", *arguments], stdin=subprocess.DEVNULL,
                          capture_output=True, env=_TOOLS_ENV, check=False)
    if proc.returncode != 0:
        # "cp: cannot stat '<path>': File name too long": the reason is after the last colon.
        last = (proc.stderr.decode("utf-8", "replace").strip().splitlines() or [""])[-1]
        raise CopyFailed(last.rsplit(": ", 1)[-1] or f"cp exited {proc.returncode}")


def tree_bytes(path: Path) -> int:
    """Bytes under ``path`` as ``du -sb`` counts them: apparent sizes of files, directories and
    links (never followed), hard links once. OSError when it cannot be measured."""
    proc = _du(path)
    if proc.returncode != 0:
        raise OSError(f"du exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return _total(proc.stdout)


def disk_usage(path: Path) -> int:
    """Bytes under ``path`` (du -sb); what could be measured, 0 when nothing could."""
    try:
        return _total(_du(path).stdout)
    except ValueError:
        return 0


def _du(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["du", "-sb", "--", str(path)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=_TOOLS_ENV, check=False)


def _total(du_output: str) -> int:
    fields = du_output.split()
    if not fields:
        raise ValueError("du printed nothing")
    return int(fields[0])
