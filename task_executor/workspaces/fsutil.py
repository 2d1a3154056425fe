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
import stat
import subprocess
import time
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
    for attempt in range(5):
        removed, said = _rm_saying(path)
        if removed:
            return
        if "not empty" not in said:
            break
        # A process of the tree's that the kill has not reaped yet may still be writing in it
        # (a loaded machine left one workspace behind, "Directory not empty"): try again.
        time.sleep(0.1 * (attempt + 1))
    log.warning("could not remove %s entirely: %s", path, said.strip())


def remove_small_tree(path: Path, most: int = 64) -> bool:
    """Remove ``path`` in this process if it holds at most ``most`` entries (a workspace holder
    once its mounts are gone: a few directories and bubblewrap's option files; what code under
    test wrote was in the mounts), and say whether it did. A bigger tree is left to
    :func:`remove_tree`: an ``rm -rf`` process for a few entries cost a DELETE about 17 ms at
    10,000 live sessions (issue 24). Nothing is followed: a symlink is unlinked, as rm does."""
    if path.is_symlink():
        return False
    directories, others = [os.fspath(path)], []
    try:
        for directory in directories:  # grows while it is walked: breadth first
            with os.scandir(directory) as entries:
                for entry in entries:
                    if len(directories) + len(others) >= most:
                        return False
                    kind = directories if entry.is_dir(follow_symlinks=False) else others
                    kind.append(entry.path)
        for other in others:
            os.unlink(other)
        for directory in reversed(directories):
            os.rmdir(directory)
    except OSError:
        return False
    return True


def remove_trees(paths: list[Path], batch: int = 500) -> None:
    """Remove many trees, with one ``rm -rf`` per ``batch`` of those that are not small (at
    shutdown, 10,000 session trees were 10,000 processes); any tree still there
    afterwards goes through :func:`remove_tree`, which opens up what code under test locked."""
    rest = [path for path in paths if not remove_small_tree(path)]
    for start in range(0, len(rest), batch):
        subprocess.run(["rm", "-rf", "--", *map(str, rest[start:start + batch])],
                       stdin=subprocess.DEVNULL, capture_output=True, env=_TOOLS_ENV,
                       check=False)
    for path in rest:
        if os.path.lexists(path):
            remove_tree(path)


def _rm(path: Path) -> bool:
    """``rm -rf``: whether nothing is left."""
    return _rm_saying(path)[0]


def _rm_saying(path: Path) -> tuple[bool, str]:
    """``rm -rf``: whether nothing is left, and what rm said."""
    proc = subprocess.run(["rm", "-rf", "--", str(path)], stdin=subprocess.DEVNULL,
                          capture_output=True, env=_TOOLS_ENV, check=False)
    said = proc.stderr.decode("utf-8", "replace")[-500:] if proc.returncode != 0 else ""
    if said:
        log.debug("rm -rf %s: %s", path, said)
    return not os.path.lexists(path), said


def copy_tree(source: Path, target: Path, reflink: bool) -> None:
    """A full copy keeping modes, owners, links, device files (overlay whiteouts) and xattrs."""
    mode = "--reflink=always" if reflink else "--reflink=auto"
    _cp([mode, "--", str(source), str(target)])


def copy_over(source: Path, target: Path) -> None:
    """An overlay upper directory (``source``) merged onto a copy of the layer below it
    (``target``), as the overlay showed them: what the upper replaces goes first (see
    ``_clear_replaced``), then its contents are copied on top; whiteouts replace what they
    hide and stay, hiding it in the layers below ``target`` too."""
    _clear_replaced(source, target)
    _cp(["--remove-destination", f"{source}/.", str(target)])


_OPAQUE = "trusted.overlay.opaque"
"""overlayfs's mark on an upper directory that replaced the lower one (emptied, made again)."""


def _clear_replaced(source: Path, target: Path) -> None:
    """Remove from ``target`` what an entry of ``source`` replaces rather than merges into: a
    directory where ``source`` has anything else (cp will not put a file over a directory), the
    other way round, and all of a directory ``source`` marks opaque.

    find lists parents before children, so a symlink in ``target`` where ``source`` has a
    directory is gone before any path below it is looked at: no path here passes a link.
    """
    listing = subprocess.run(["find", str(source), "-mindepth", "1", "-printf", "%y %P\\0"],
                             stdin=subprocess.DEVNULL, capture_output=True, env=_TOOLS_ENV,
                             check=False)
    if listing.returncode != 0:
        raise CopyFailed(_reason(listing.stderr, listing.returncode))
    source_root, target_root = os.fsencode(source), os.fsencode(target)
    for record in listing.stdout.split(b"\0"):
        if not record:
            continue
        kind, relative = record[:1], record[2:]
        there = os.path.join(target_root, relative)
        try:
            held = os.lstat(there)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise CopyFailed(exc.strerror or "lstat failed") from None
        directory_there = stat.S_ISDIR(held.st_mode)
        if kind == b"d":
            if directory_there and not _opaque(os.path.join(source_root, relative)):
                continue  # merged into
        elif not directory_there:
            continue  # cp --remove-destination replaces a non-directory itself
        if directory_there:
            remove_tree(Path(os.fsdecode(there)))
        else:
            os.unlink(there)


def _opaque(path: bytes) -> bool:
    try:
        return os.getxattr(path, _OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _reason(stderr: bytes, status: int) -> str:
    """The tool's error without the paths it names (host paths): strerror's text, which GNU
    tools print last, after a colon; else a plain word of what failed (the log has it all)."""
    text = stderr.decode("utf-8", "replace").strip()
    last = (text.splitlines() or [""])[-1].rsplit(": ", 1)[-1]
    if last and "/" not in last and "'" not in last:
        return last
    log.warning("copy failed (exit %s): %s", status, text[-1000:])
    return f"the copy failed (exit status {status})"


def _cp(arguments: list[str]) -> None:
    proc = subprocess.run(["cp", "-a", *arguments], stdin=subprocess.DEVNULL,
                          capture_output=True, env=_TOOLS_ENV, check=False)
    if proc.returncode != 0:
        # "cp: cannot stat '<path>': File name too long": the reason is after the last colon.
        raise CopyFailed(_reason(proc.stderr, proc.returncode))


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
