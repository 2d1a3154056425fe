"""Filesystem chores shared by workspaces and templates: remove, copy, mount, unmount."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


class MountFailed(Exception):
    """mount(8) refused; the message carries its error."""


def remove_tree(path: Path) -> None:
    """Remove a directory even when the code under test made parts of it read-only."""

    def make_writable_and_retry(function, failed_path, _exc_info):  # type: ignore[no-untyped-def]
        try:
            os.chmod(os.path.dirname(failed_path), 0o700)
            os.chmod(failed_path, 0o700)
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


_volatile_supported = True


def mount_overlay(lower: list[Path], upper: Path, work: Path, merged: Path) -> None:
    """Mount an overlay; ``volatile`` (Linux >= 5.10) where the kernel takes it.

    Workspaces are thrown away, never recovered after a crash, so skipping the syncs that make an
    upper directory crash-safe costs nothing and keeps unmount from flushing the whole disk.
    """
    global _volatile_supported
    options = f"lowerdir={':'.join(str(p) for p in lower)},upperdir={upper},workdir={work}"
    attempts = [options + ",volatile", options] if _volatile_supported else [options]
    error = ""
    for attempt in attempts:
        proc = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", attempt, str(merged)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
        )
        if proc.returncode == 0:
            return
        error = proc.stderr.strip() or f"mount exited {proc.returncode}"
        if attempt.endswith(",volatile"):
            _volatile_supported = False
    raise MountFailed(error)


def unmount(path: Path) -> None:
    """Unmount ``path``; lazily when something still holds it, so removal can go on."""
    for argv in (["umount", str(path)], ["umount", "-l", str(path)]):
        if subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True).returncode == 0:
            return


def disk_usage(path: Path) -> int:
    """Bytes under ``path`` (du -sb); 0 when it cannot be measured."""
    proc = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=False)
    try:
        return int(proc.stdout.split()[0])
    except (IndexError, ValueError):
        return 0

