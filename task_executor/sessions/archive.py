"""Checking a directory upload's tar archive before anything of it is extracted.

The archive comes from the client (an agent framework uploading its tools), and it is extracted
inside the sandbox as the sandbox user (:mod:`task_executor.sessions.outside`), so it can never
write anywhere the session's code could not. Still, an upload must land *in* its target
directory: members that would leave it are refused whole (400 ``unsafe_archive``) before
anything is written:

* absolute names, and names with a ``..`` component;
* device nodes, FIFOs and anything else that is neither a file, a directory nor a link;
* symlinks with an absolute target, a target that climbs out of the directory, or a ``..``
  after a component that is itself a symlink of the archive (``l -> .`` then ``m -> l/..``
  climbs one level more than it reads);
* members below a symlink of the archive (written through the link);
* hard links to anything but a regular file earlier in the archive.

The members that pass are written into a fresh plain tar (gzip, bzip2 and xz are read), with
the modes kept (executable bits; never setuid or setgid) and no owner: only what was checked
reaches the extracting ``tar``. Regular files may hold at most ``cap`` bytes in all (413
``payload_too_large``: a small gzip may expand to any size).
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import zlib
from dataclasses import dataclass

from task_executor.errors import ExecutorError, InvalidRequest

KEPT_MODE_BITS = 0o1777
"""Permission bits an extracted member keeps (setuid and setgid dropped)."""

MAX_MEMBERS = 100_000
"""Entries an archive may hold: directories, links and empty files weigh nothing against the
byte cap, and 100,000 empty entries gzip to 470 KB yet cost seconds and a 50 MB rewrite."""


class UnsafeArchive(InvalidRequest):
    code = "unsafe_archive"


class InvalidArchive(InvalidRequest):
    code = "invalid_archive"


class PayloadTooLarge(ExecutorError):
    code = "payload_too_large"
    http_status = 413


@dataclass(frozen=True)
class CheckedArchive:
    tar: bytes
    """A plain tar of the checked members only."""
    files: int
    bytes: int


def check_archive(data: bytes, cap: int) -> CheckedArchive:
    """The archive's safe form, or UnsafeArchive / InvalidArchive / PayloadTooLarge."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as source:
            members = _members(source, cap)
            _check_members(members, cap)
            return _rewrite(source, members)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise InvalidArchive(f"the body is not a readable tar archive: {exc}") from None


def _members(source: tarfile.TarFile, cap: int) -> list[tarfile.TarInfo]:
    """The archive's entries, read one by one: past ``MAX_MEMBERS`` entries, or a stream whose
    headers alone outgrow the cap, it stops there (``getmembers`` would read them all first)."""
    members = []
    for member in source:
        members.append(member)
        if len(members) > MAX_MEMBERS or source.offset > cap + 1024 * MAX_MEMBERS:
            raise PayloadTooLarge(f"the archive holds more than {MAX_MEMBERS} entries or "
                                  f"{cap} bytes")
    return members


def _name(member: tarfile.TarInfo) -> str:
    """The member's path in one form for every comparison: no empty or ``.`` component (tar
    writes ``a/./l/x`` through a symlink ``a/l`` as ``a/l/x`` would)."""
    return "/".join(part for part in member.name.split("/") if part not in ("", "."))


def _check_members(members: list[tarfile.TarInfo], cap: int) -> None:
    symlinks = {_name(m) for m in members if m.issym()}
    files: set[str] = set()
    total = 0
    for member in members:
        name = _name(member)
        if member.name.startswith("/"):
            raise UnsafeArchive(f"member {member.name!r} has an absolute name")
        if ".." in name.split("/"):
            raise UnsafeArchive(f"member {member.name!r} climbs out of the target with '..'")
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            raise UnsafeArchive(f"member {member.name!r} is a device, FIFO or other special file")
        parents = name.split("/")[:-1]
        for depth in range(1, len(parents) + 1):
            if "/".join(parents[:depth]) in symlinks:
                raise UnsafeArchive(f"member {member.name!r} lies below a symlink of the archive")
        if member.issym():
            _check_symlink(name, member.linkname, symlinks)
        elif member.islnk():
            target = _name(tarfile.TarInfo(member.linkname))
            if member.linkname.startswith("/") or ".." in target.split("/") or target not in files:
                raise UnsafeArchive(
                    f"hard link {member.name!r} does not point to a file of the archive")
        elif member.isreg():
            files.add(name)
            total += member.size
            if total > cap:
                raise PayloadTooLarge(f"the archive's files hold more than {cap} bytes")


def _check_symlink(name: str, target: str, symlinks: set[str]) -> None:
    if target.startswith("/"):
        raise UnsafeArchive(f"symlink {name!r} points to an absolute path")
    stack: list[str] = []
    for part in [*posixpath.dirname(name).split("/"), *target.split("/")]:
        if part in ("", "."):
            continue
        if part != "..":
            stack.append(part)
            continue
        # A '..' after a symlink climbs from where the link leads, not from its name.
        if not stack or "/".join(stack) in symlinks:
            raise UnsafeArchive(f"symlink {name!r} points out of the target directory")
        stack.pop()


def _rewrite(source: tarfile.TarFile, members: list[tarfile.TarInfo]) -> CheckedArchive:
    out = io.BytesIO()
    files = size = 0
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as clean:
        for member in members:
            name = _name(member)
            if not name:
                continue  # the target directory itself: its mode stays the sandbox's
            info = tarfile.TarInfo(name)
            info.type = member.type
            info.mode = member.mode & KEPT_MODE_BITS
            info.mtime = member.mtime
            if member.issym() or member.islnk():
                info.linkname = member.linkname if member.issym() else _name(
                    tarfile.TarInfo(member.linkname))
            content = None
            if member.isreg():
                info.size = member.size
                content = source.extractfile(member)
                files += 1
                size += member.size
            clean.addfile(info, content)
    return CheckedArchive(tar=out.getvalue(), files=files, bytes=size)
