"""Kernel-confined file access inside a directory tree that code under test controls.

The executor runs as root and reads or writes files in trees where hostile code (root in its own
sandbox) can plant a symlink, a FIFO or a device node at any moment. A path check before an open
(``realpath``, compare, ``open``) loses that race, follows a symlink planted as a predictable temp
name, or blocks forever on a FIFO. So nothing here checks a path and then opens it: every name is
resolved by the kernel from a directory fd of the tree's root, and what was opened is checked
through its fd.

- Directories are resolved with ``openat2(2)`` and ``RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS |
  RESOLVE_NO_XDEV``: symlinks inside the path are followed as if the tree were ``/``, so an
  absolute or ``..`` link cannot leave it (``RESOLVE_NO_SYMLINKS`` too when a caller asks).
  Where ``openat2`` is missing (an old kernel: ENOSYS; a seccomp filter in a pod: EPERM), the
  path is walked one component at a time with ``O_NOFOLLOW | O_DIRECTORY``: symlinks are then
  refused anywhere in it. :data:`MODE` says which one is active.
- The final component is never followed: it is opened ``O_PATH | O_NOFOLLOW`` (which opens no
  FIFO and no device: no driver is called, nothing blocks), fstat'ed, and only a regular file is
  then reopened for reading through ``/proc/self/fd`` (the very inode, no second lookup).
- Writes go to a temporary file with an unpredictable name, created ``O_EXCL | O_NOFOLLOW`` in
  the parent's fd, then renamed over the final name: a hard link or a swapped name never makes
  the executor write into anything but its own new inode.

Refusals are :class:`Refusal` errors from the executor's error tree; their messages name the path
as the caller gave it (:meth:`Refusal.as_requested` renames it), never a host path.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import platform
import posixpath
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from task_executor.errors import Conflict, InvalidRequest, NotFound

log = logging.getLogger(__name__)

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
NEW_FILE_MODE = 0o644
NEW_DIR_MODE = 0o755

# ---------------------------------------------------------------------------------- refusals


def _shown(path: str) -> str:
    return repr(path) if len(path) <= 100 else repr(path[:100]) + "..."


class Refusal(Exception):
    """Mixin of every refusal below: keeps the message template so it can be re-told with the
    path as the client wrote it (an absolute ``/testbed/x`` the caller mapped to ``x``)."""

    code: str  # from the executor error each refusal also is

    def __init__(self, template: str, path: str, *, code: str | None = None) -> None:
        super().__init__(template.format(path=_shown(path)), code=code)  # type: ignore[call-arg]
        self.template = template
        self.path = path

    def as_requested(self, requested: str) -> Refusal:
        return type(self)(self.template, requested, code=self.code)


class PathOutsideTree(Refusal, InvalidRequest):
    code = "path_outside_workspace"
    http_status = 403


class SymlinkRefused(Refusal, InvalidRequest):
    """A symlink where none is followed (the fallback walk, ``no_symlinks``, a link loop)."""

    code = "symlink_refused"
    http_status = 403


class BadPath(Refusal, InvalidRequest):
    code = "invalid_path"


class NotARegularFile(Refusal, InvalidRequest):
    code = "not_a_regular_file"


class IsADirectory(Refusal, InvalidRequest):
    code = "is_a_directory"


class NotADirectory(Refusal, InvalidRequest):
    code = "not_a_directory"


class TooLarge(Refusal, InvalidRequest):
    code = "too_large"


class FileMissing(Refusal, NotFound):
    code = "file_not_found"


class PathBusy(Refusal, Conflict):
    """The tree changed under a lookup too often, or a lease holds the file: retry later."""

    code = "path_busy"

    def __init__(self, template: str, path: str, *, code: str | None = None) -> None:
        super().__init__(template, path, code=code)
        self.retry_after = 1


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _not_regular(mode: int, path: str) -> Refusal:
    if stat.S_ISDIR(mode):
        return IsADirectory("{path} is a directory", path)
    return NotARegularFile(
        "{path} is " + _kind(mode) + "; only regular files are read or replaced", path
    )


# ---------------------------------------------------------------------------------- openat2

RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_IN_ROOT = 0x10
_RESOLVE = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV

_OPENAT2_NUMBERS = {"x86_64": 437, "amd64": 437, "aarch64": 437, "arm64": 437}
_EAGAIN_RETRIES = 32  # openat2 says EAGAIN when a rename raced a lookup in IN_ROOT mode


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p,
                     ctypes.c_size_t]


def openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    """``openat2(dirfd, path, {flags, 0, resolve})``; OSError on failure (EAGAIN retried)."""
    number = _OPENAT2_NUMBERS.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, "openat2 syscall number unknown on " + platform.machine())
    how = _OpenHow(flags, 0, resolve)
    encoded = os.fsencode(path)
    for _ in range(_EAGAIN_RETRIES):
        fd = _syscall(number, dirfd, encoded, ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return fd
        code = ctypes.get_errno()
        if code != errno.EAGAIN:
            break
    raise OSError(code, os.strerror(code), path)


def _detect_mode() -> tuple[str, str | None]:
    """("openat2", None) when the syscall works here, else ("nofollow-walk", why not)."""
    try:
        root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:  # pragma: no cover - no root directory
        return "nofollow-walk", str(exc)
    try:
        os.close(openat2(root, ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, _RESOLVE))
        return "openat2", None
    except OSError as exc:
        # ENOSYS: kernel before 5.6; EPERM/ENOSYS: a seccomp filter; EINVAL: flags unknown.
        return "nofollow-walk", f"openat2 unavailable ({errno.errorcode.get(exc.errno or 0)})"
    finally:
        os.close(root)


MODE, FALLBACK_REASON = _detect_mode()
"""Which resolution is active: "openat2" or "nofollow-walk" (for ``/health``)."""
if FALLBACK_REASON:
    log.warning("confined file access: %s; symlinks in paths are refused", FALLBACK_REASON)

# ---------------------------------------------------------------------------------- paths


def split_path(path: str) -> tuple[str, ...]:
    """The components of a relative POSIX path (``()`` for the root); refused when empty,
    absolute, climbing out with ``..``, over-long or holding a NUL byte."""
    if not path:
        raise BadPath("a path is required", path, code="missing_path")
    if "\0" in path:
        raise BadPath("{path} contains a NUL byte", path)
    try:
        encoded = os.fsencode(path)
    except UnicodeEncodeError:
        raise BadPath("{path} is not a valid file name", path) from None
    if len(encoded) >= MAX_PATH_BYTES:
        raise BadPath("{path} is too long", path, code="path_too_long")
    if path.startswith("/"):
        raise PathOutsideTree("{path} is outside the workspace", path)
    normal = posixpath.normpath(path)
    if normal == ".." or normal.startswith("../"):
        raise PathOutsideTree("{path} is outside the workspace", path)
    parts = () if normal == "." else tuple(normal.split("/"))
    if any(len(os.fsencode(part)) > MAX_NAME_BYTES for part in parts):
        raise BadPath("{path} has a component over 255 bytes", path, code="path_too_long")
    return parts


_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC


class ConfinedTree:
    """File operations confined to the tree under ``root`` (see the module docstring).

    Holds an ``O_PATH`` fd of the root for its lifetime; use it as a context manager. Paths are
    relative POSIX paths; a refused one raises a :class:`Refusal`, never touching anything.
    """

    def __init__(self, root: Path | str, *, no_symlinks: bool = False) -> None:
        self.mode = MODE
        self._resolve = _RESOLVE | (RESOLVE_NO_SYMLINKS if no_symlinks else 0)
        self._fd = os.open(root, _DIR_FLAGS | os.O_NOFOLLOW)
        self._dev = os.fstat(self._fd).st_dev

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ConfinedTree:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ reading

    def read_bytes(self, path: str, max_bytes: int) -> bytes:
        """The bytes of the regular file at ``path`` (at most ``max_bytes``, else TooLarge)."""
        with self._parent(path) as (parent, name):
            fd = self._open_regular(parent, name, path)
        try:
            if os.fstat(fd).st_size > max_bytes:
                raise TooLarge("{path} is over " + str(max_bytes) + " bytes", path)
            chunks: list[bytes] = []
            total = 0
            while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - total)):
                chunks.append(chunk)
                total += len(chunk)
                if total > max_bytes:  # it grew since the fstat
                    raise TooLarge("{path} is over " + str(max_bytes) + " bytes", path)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _open_regular(self, parent: int, name: str, path: str) -> int:
        """An O_RDONLY fd of ``name`` in ``parent`` if (and only if) it is a regular file."""
        try:
            handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except FileNotFoundError:
            raise FileMissing("no file {path} in the workspace", path) from None
        try:
            mode = os.fstat(handle).st_mode
            if not stat.S_ISREG(mode):
                raise _not_regular(mode, path)
            try:
                # The same inode reopened: no lookup of the name again, so no swap in between.
                # O_NONBLOCK: a lease holder makes this EWOULDBLOCK instead of a 45 s wait.
                return os.open(f"/proc/self/fd/{handle}",
                               os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except BlockingIOError:
                raise PathBusy("{path} is leased by another process; retry", path) from None
            except FileNotFoundError:
                return self._open_regular_without_proc(parent, name, path, handle)
        finally:
            os.close(handle)

    @staticmethod
    def _open_regular_without_proc(parent: int, name: str, path: str, handle: int) -> int:
        """No /proc: open the name again (never blocking, never following) and check it is
        still the inode ``handle`` holds."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=parent)
        except OSError as exc:
            raise PathBusy("{path} changed while it was opened; retry", path) from exc
        before, after = os.fstat(handle), os.fstat(fd)
        if (before.st_dev, before.st_ino) != (after.st_dev, after.st_ino):
            os.close(fd)
            raise PathBusy("{path} changed while it was opened; retry", path)
        return fd

    def lstat(self, path: str) -> os.stat_result:
        """The status of ``path`` itself (a symlink is not followed)."""
        with self._parent(path, allow_root=True) as (parent, name):
            if not name:
                return os.fstat(parent)
            try:
                return os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                raise FileMissing("no file {path} in the workspace", path) from None

    def exists(self, path: str) -> bool:
        """Whether something (a dangling symlink included) is at ``path``."""
        try:
            self.lstat(path)
        except FileMissing:
            return False
        return True

    # ------------------------------------------------------------------ writing

    def write_bytes(
        self, path: str, data: bytes, owner: tuple[int, int] | None = None
    ) -> None:
        """Replace (or create) the regular file at ``path`` with ``data``, atomically.

        Missing parents are created (and given to ``owner``); an existing file keeps its
        permission bits (not set-id bits: the executor is root), a new one gets 0644; the new
        file is given to ``owner`` when one is named. Anything but a regular file at ``path``
        is refused before a byte is written.
        """
        with self._parent(path, create=True, owner=owner) as (parent, name):
            try:
                existing = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                existing = None
            if existing is not None and not stat.S_ISREG(existing.st_mode):
                raise _not_regular(existing.st_mode, path)
            # Set-id bits are dropped as the kernel drops them on a write by anyone but root:
            # the executor must not mint a set-id file with content the client chose.
            mode = stat.S_IMODE(existing.st_mode) & ~0o6000 if existing else NEW_FILE_MODE
            temporary, fd = self._create_temporary(parent)
            try:
                with open(fd, "wb", closefd=True) as handle:
                    if owner is not None:
                        os.fchown(handle.fileno(), *owner)
                    os.fchmod(handle.fileno(), mode)
                    handle.write(data)
                try:
                    # rename replaces the name itself: a symlink or FIFO swapped in since the
                    # stat above is replaced, never followed or opened.
                    os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
                except IsADirectoryError:
                    raise IsADirectory("{path} is a directory", path) from None
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=parent)
                raise

    @staticmethod
    def _create_temporary(parent: int) -> tuple[str, int]:
        for _ in range(8):
            name = f".dockyard-{secrets.token_hex(12)}.tmp"
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                return name, os.open(name, flags, 0o600, dir_fd=parent)
            except FileExistsError:
                continue
        raise FileExistsError(errno.EEXIST, "no free temporary name")  # pragma: no cover

    def unlink(self, path: str) -> None:
        """Remove the file (or the symlink itself) at ``path``; a directory is refused."""
        with self._parent(path) as (parent, name):
            try:
                os.unlink(name, dir_fd=parent)
            except FileNotFoundError:
                raise FileMissing("no file {path} in the workspace", path) from None
            except IsADirectoryError:
                raise IsADirectory("{path} is a directory", path) from None

    def remove(self, path: str) -> None:
        """Remove whatever is at ``path``: a file, a symlink itself, or a whole directory tree
        (fd-based, never following a symlink inside it)."""
        with self._parent(path) as (parent, name):
            try:
                _remove(parent, name)
            except FileNotFoundError:
                raise FileMissing("no file {path} in the workspace", path) from None

    # ------------------------------------------------------------------ resolution

    @contextlib.contextmanager
    def _parent(
        self, path: str, *, create: bool = False, owner: tuple[int, int] | None = None,
        allow_root: bool = False,
    ) -> Iterator[tuple[int, str]]:
        """(fd of the directory holding ``path``'s last component, that component); the fd is
        closed after. The root itself is ("", root fd) only when ``allow_root``."""
        parts = split_path(path)
        if not parts and not allow_root:
            raise IsADirectory("{path} is a directory", path)
        parent = self._directory(parts[:-1], path, create, owner) if parts else os.dup(self._fd)
        try:
            yield parent, parts[-1] if parts else ""
        finally:
            os.close(parent)

    def _directory(
        self, parts: tuple[str, ...], path: str, create: bool, owner: tuple[int, int] | None
    ) -> int:
        """An fd of the directory at ``parts``, resolved confined (created when ``create``).
        A file in the way is "no such file" when nothing is to be created."""
        try:
            return self._resolve_directory(parts, path, create, owner)
        except NotADirectory:
            if create:
                raise
            raise FileMissing("no file {path} in the workspace", path) from None

    def _resolve_directory(
        self, parts: tuple[str, ...], path: str, create: bool, owner: tuple[int, int] | None
    ) -> int:
        if not parts:
            return os.dup(self._fd)
        if self.mode == "openat2":
            try:
                return self._openat2(parts, path)
            except FileMissing:
                if not create:
                    raise
        fd = os.dup(self._fd)
        try:
            for depth in range(1, len(parts) + 1):
                child = self._step(fd, parts[:depth], path, create, owner)
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _step(
        self, fd: int, prefix: tuple[str, ...], path: str, create: bool,
        owner: tuple[int, int] | None,
    ) -> int:
        """The directory ``prefix`` (whose parent is ``fd``), made if missing and ``create``."""
        name = prefix[-1]
        for _ in range(3):  # a concurrent mkdir or rmdir by code under test: look again
            try:
                return self._openat2(prefix, path) if self.mode == "openat2" else (
                    self._walk_one(fd, name, path))
            except FileMissing:
                if not create:
                    raise
            try:
                os.mkdir(name, NEW_DIR_MODE, dir_fd=fd)
            except FileExistsError:
                continue
            try:
                # Opened by its single name from the fd that made it, never following: what is
                # chowned is the directory just made (or the call fails if it was swapped).
                made = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                               dir_fd=fd)
            except OSError:
                raise PathBusy("{path} changed while its parents were made; retry", path) from None
            try:
                if owner is not None:
                    os.fchown(made, *owner)
            except BaseException:
                os.close(made)
                raise
            return made
        # Something is there that never resolves to a directory inside the tree: in openat2 mode
        # a symlink leading out of it (or nowhere).
        raise PathOutsideTree("a parent directory of {path} is a symbolic link that leads "
                              "nowhere inside the workspace", path)

    def _openat2(self, parts: tuple[str, ...], path: str) -> int:
        try:
            return openat2(self._fd, "/".join(parts), _DIR_FLAGS, self._resolve)
        except OSError as exc:
            raise self._lookup_failure(exc, path) from None

    def _walk_one(self, fd: int, name: str, path: str) -> int:
        try:
            child = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                with contextlib.suppress(OSError):
                    if stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                        exc = OSError(errno.ELOOP, "symlink")
            raise self._lookup_failure(exc, path) from None
        if os.fstat(child).st_dev != self._dev:  # RESOLVE_NO_XDEV, by hand
            os.close(child)
            raise PathOutsideTree("{path} crosses a mount point", path)
        return child

    @staticmethod
    def _lookup_failure(exc: OSError, path: str) -> Exception:
        if exc.errno == errno.ENOENT:
            return FileMissing("no file {path} in the workspace", path)
        if exc.errno == errno.ENOTDIR:
            return NotADirectory("a parent of {path} is not a directory", path)
        if exc.errno == errno.ELOOP:
            return SymlinkRefused("{path} goes through a symbolic link that is not followed "
                                  "here (or a loop of them)", path)
        if exc.errno == errno.EXDEV:
            return PathOutsideTree("{path} crosses a mount point", path)
        if exc.errno == errno.EAGAIN:
            return PathBusy("{path} kept changing while it was looked up; retry", path)
        if exc.errno == errno.ENAMETOOLONG:
            return BadPath("{path} is too long", path, code="path_too_long")
        return exc


def _remove(parent: int, name: str) -> None:
    """Remove ``name`` in ``parent``, recursively if it is a directory. Not ``shutil.rmtree``:
    its ``dir_fd`` walk opens entries with a bare O_RDONLY, so a FIFO swapped in for a
    directory would block it; here every directory is opened O_DIRECTORY | O_NOFOLLOW (a FIFO,
    device or symlink in its place fails at once and is unlinked as the name it is)."""
    try:
        os.unlink(name, dir_fd=parent)
        return
    except IsADirectoryError:
        pass
    except PermissionError:  # unlink(2) of a directory is EISDIR on Linux, EPERM elsewhere
        pass
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=parent)
    except NotADirectoryError:  # swapped for a non-directory since the unlink: try again
        os.unlink(name, dir_fd=parent)
        return
    try:
        with os.scandir(fd) as entries:
            names = [entry.name for entry in entries]
        for child in names:
            with contextlib.suppress(FileNotFoundError):
                _remove(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)
