"""Filesystem chores shared by workspaces and templates: remove, copy, measure (mounts live in
``task_executor.sandbox.mounts``)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path


def remove_tree(path: Path) -> None:
    """Remove a directory even when the code under test made parts of it read-only."""

    root = os.fspath(path)

    def make_writable_and_retry(function, failed_path, _exc_info):  # type: ignore[no-untyped-def]
        # chmod follows symlinks: only real directories and files of the tree are touched (the
        # tree's processes are dead by now; a link swapped in must still lead nowhere). The
        # root's parent is not the tree's: made 0700 when the root could not go (EBUSY, a mount
        # on it), BASE/work shut every later sandbox out (bwrap resolves binds as its uid).
        parent = [] if os.fspath(failed_path) == root else [os.path.dirname(failed_path)]
        for target in (*parent, failed_path):
            try:
                if not stat.S_ISLNK(os.lstat(target).st_mode):
                    os.chmod(target, 0o700)
            except OSError:
                pass
        try:
            function(failed_path)
        except OSError:
            pass

    if path.is_symlink():
        path.unlink()
        return
    if path.exists():
        shutil.rmtree(path, onerror=make_writable_and_retry)
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)


def copy_tree(source: Path, target: Path, reflink: bool) -> None:
    """A full copy keeping modes, owners, links, device files (overlay whiteouts) and xattrs."""
    mode = "--reflink=always" if reflink else "--reflink=auto"
    subprocess.run(["cp", "-a", mode, "--", str(source), str(target)], check=True,
                   stdin=subprocess.DEVNULL, capture_output=True)


def disk_usage(path: Path) -> int:
    """Bytes under ``path`` (du -sb); 0 when it cannot be measured."""
    proc = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=False)
    try:
        return int(proc.stdout.split()[0])
    except (IndexError, ValueError):
        return 0

