"""Mounts the executor makes on the host for workspaces: overlay trees, tmpfs quotas, idmapped
binds, and their removal.

Everything goes through the system calls directly (ctypes): mount(8) costs ~5 ms a call, the
system call 0.1 ms, and a workspace makes two or three of them. Idmapped binds (made once per
runtime directory at start, not per workspace) need a user namespace carrying the mapping.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import platform
import re
import subprocess
import time
from pathlib import Path

from .programs import host_program

log = logging.getLogger(__name__)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

MS_NOSUID, MS_NODEV = 0x2, 0x4
MS_BIND, MS_REC, MS_PRIVATE, MS_SLAVE, MS_SHARED = 0x1000, 0x4000, 1 << 18, 1 << 19, 1 << 20
MNT_DETACH = 0x2


def _mount(source: str, target: Path, fstype: str, flags: int, data: str) -> None:
    if _libc.mount(source.encode(), os.fsencode(target), fstype.encode(), flags,
                   data.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount -t {fstype} on {target}: {os.strerror(code)}")


_volatile_supported = True


def mount_overlay(lower: list[Path], upper: Path, work: Path, merged: Path) -> None:
    """Mount an overlay; ``volatile`` (Linux >= 5.10) where the kernel takes it.

    Workspaces are thrown away, never recovered after a crash, so skipping the syncs that make an
    upper directory crash-safe costs nothing and keeps unmount from flushing the whole disk.
    """
    global _volatile_supported
    options = f"lowerdir={':'.join(str(p) for p in lower)},upperdir={upper},workdir={work}"
    if _volatile_supported:
        try:
            _mount("overlay", merged, "overlay", MS_NOSUID | MS_NODEV, options + ",volatile")
            return
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            _volatile_supported = False
    _mount("overlay", merged, "overlay", MS_NOSUID | MS_NODEV, options)


BYTES_PER_INODE = 2048
"""A quota'd tmpfs holds one inode per this many bytes of its size. Empty files cost no blocks,
so the size alone never stopped them, and their inodes are kernel memory charged to the
workspace: the kernel's default (half of the RAM in pages, millions) let 3 million empty files
fill a workspace's memory past its quota."""


def mount_tmpfs(target: Path, size_bytes: int | None, mode: int = 0o711) -> None:
    """A tmpfs of at most ``size_bytes`` at ``target`` and one inode per
    :data:`BYTES_PER_INODE` of it: a quota nothing inside can pass (None: the kernel's
    defaults, half of the RAM)."""
    size = (f"size={max(size_bytes, 4096)},nr_inodes={max(size_bytes // BYTES_PER_INODE, 1024)},"
            if size_bytes is not None else "")
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"{size}mode={mode:o}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


_SYS = {"x86_64": (428, 429, 442), "aarch64": (428, 429, 442)}  # open_tree, move_mount, setattr
_OPEN_TREE_CLONE, _AT_EMPTY_PATH, _AT_FDCWD, _AT_RECURSIVE = 1, 0x1000, -100, 0x8000
_MOVE_MOUNT_F_EMPTY_PATH, _MOUNT_ATTR_RDONLY, _MOUNT_ATTR_IDMAP = 4, 0x1, 0x100000
_MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x2, 0x4


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def _user_namespace(uid: int) -> int:
    """An fd of a user namespace mapping 0 to ``uid`` (held by a short-lived ``sleep``)."""
    holder = subprocess.Popen([host_program("unshare") or "/usr/bin/unshare", "--user",
                               host_program("sleep") or "/bin/sleep", "30"],
                              stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        own = os.readlink("/proc/self/ns/user")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{holder.pid}/ns/user") == own:
            if time.monotonic() > deadline or holder.poll() is not None:
                raise OSError(errno.EPERM, "unshare --user did not start")
            time.sleep(0.001)
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{holder.pid}/{name}", "w") as handle:
                handle.write(f"0 {uid} 1\n")
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        holder.kill()
        holder.wait()


def bind_idmapped(source: Path, target: Path, uid: int) -> None:
    """Show ``source`` read-only at ``target`` with its root-owned files owned by ``uid``, so
    root inside a sandbox (``uid`` outside) owns them in an overlay built on ``target``.

    open_tree + mount_setattr(MOUNT_ATTR_IDMAP) + move_mount: util-linux 2.38's
    ``X-mount.idmap`` is accepted and silently ignored.
    """
    open_tree, move_mount, mount_setattr = _syscalls()
    userns = _user_namespace(uid)
    tree = -1
    try:
        tree = _check(_libc.syscall(open_tree, _AT_FDCWD, os.fsencode(source),
                                    _OPEN_TREE_CLONE | os.O_CLOEXEC), "open_tree")
        attr = _MountAttr(_MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY, 0, 0, userns)
        _check(_libc.syscall(mount_setattr, tree, b"", _AT_EMPTY_PATH, ctypes.byref(attr),
                             ctypes.sizeof(attr)), "mount_setattr")
        _check(_libc.syscall(move_mount, tree, b"", _AT_FDCWD, os.fsencode(target),
                             _MOVE_MOUNT_F_EMPTY_PATH), "move_mount")
    finally:
        os.close(userns)
        if tree >= 0:
            os.close(tree)


def _syscalls() -> tuple[int, int, int]:
    numbers = _SYS.get(platform.machine())
    if numbers is None:
        raise OSError(errno.ENOSYS, f"the new mount API is not wired for {platform.machine()}")
    return numbers


def bind(source: Path, target: Path) -> None:
    """Bind ``source`` and every mount below it at ``target``."""
    _mount(str(source), target, "", MS_BIND | MS_REC, "")


def bind_alone(source: Path, target: Path) -> None:
    """Bind ``source`` at ``target`` without the mounts below it (what is on its own
    filesystem only)."""
    _mount(str(source), target, "", MS_BIND, "")


def set_propagation(target: Path, kind: int, recursive: bool = False) -> None:
    """Make the mount at ``target`` (and below, with ``recursive``) MS_PRIVATE, MS_SLAVE or
    MS_SHARED."""
    if _libc.mount(None, os.fsencode(target), None, kind | (MS_REC if recursive else 0),
                   None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"propagation of {target}: {os.strerror(code)}")


def make_read_only(target: Path, recursive: bool) -> None:
    """Read-only, nosuid and nodev at ``target`` (and every mount below it: one mount_setattr,
    where a remount would have to visit them one by one)."""
    mount_setattr = _syscalls()[2]
    attr = _MountAttr(_MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, 0, 0, 0)
    _check(_libc.syscall(mount_setattr, _AT_FDCWD, os.fsencode(target),
                         _AT_RECURSIVE if recursive else 0, ctypes.byref(attr),
                         ctypes.sizeof(attr)), f"mount_setattr {target}")


def clone_mount(source: Path, recursive: bool = False) -> int:
    """A detached copy of the mount at ``source`` (and, with ``recursive``, of every mount below
    it), an fd for :func:`attach_mount`; it stays a peer of the original, so mounts made below
    either appear below both."""
    open_tree = _syscalls()[0]
    flags = _OPEN_TREE_CLONE | os.O_CLOEXEC | (_AT_RECURSIVE if recursive else 0)
    return _check(_libc.syscall(open_tree, _AT_FDCWD, os.fsencode(source), flags),
                  f"open_tree {source}")


def attach_mount(tree: int, target: Path) -> None:
    """Attach a detached mount at ``target`` in the calling thread's mount namespace."""
    move_mount = _syscalls()[1]
    _check(_libc.syscall(move_mount, tree, b"", _AT_FDCWD, os.fsencode(target),
                         _MOVE_MOUNT_F_EMPTY_PATH), f"move_mount to {target}")


def unmount(path: Path) -> None:
    """Unmount ``path``; lazily when something still holds it, so removal can go on."""
    target = os.fsencode(path)
    if _libc.umount2(target, 0) == 0:
        return
    _libc.umount2(target, MNT_DETACH)


def mounts_under(root: Path, pid: int | None = None) -> list[str]:
    """Mount points strictly below ``root`` in this mount namespace (or in process ``pid``'s:
    an executor serving as its own process keeps its mounts in a namespace of its own), in
    mount order."""
    prefix = str(root.resolve()).rstrip("/") + "/"
    with open(f"/proc/{pid or 'self'}/mountinfo", "rb") as f:
        lines = f.read().splitlines()
    points = []
    for line in lines:
        # Field 5 is the mount point, with space, tab, newline and backslash escaped in octal.
        raw = line.split(b" ")[4]
        point = os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), raw))
        if point.startswith(prefix):
            points.append(point)
    return points


def unmount_under(root: Path) -> int:
    """Unmount everything mounted below ``root`` (deepest first, lazily when busy); return how
    many mounts went."""
    before = len(mounts_under(root))
    # Mounts can be stacked on one point, and a lazy unmount takes its children along: rescan
    # until nothing is left (bounded, in case something mounts as fast as we unmount).
    for _ in range(20):
        points = mounts_under(root)
        if not points:
            break
        for point in sorted(points, key=lambda p: p.count("/"), reverse=True):
            unmount(Path(point))
    left = mounts_under(root)
    for point in left:
        log.error("cannot unmount %s", point)
    return before - len(left)
