"""Byte-exact file reads and writes confined to a workspace.

Bytes go in and out untouched: no newline translation, no decoding, so CRLF, a byte-order mark,
mixed endings, a bare CR, invalid UTF-8 and binary files all round-trip (Sandman tables A23/A24:
text-mode reads changed bytes outside the edit in every sampled file).

The tree belongs to code under test, which can swap any name for a symlink or a FIFO while a
request runs, so paths are never checked and then opened: every access goes through
``sandbox.confined`` (the kernel resolves the path inside the tree; only a regular file is read
or replaced; a write goes to an unpredictable temporary name, then is renamed into place).
Paths are relative to the tree; refusals name the path as the client wrote it, never a host path.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from sandbox_client.protocol import FileWriteResult
from task_executor.sandbox.confined import ConfinedTree, PathOutsideTree, Refusal

MAX_READ_BYTES = 256 * 1024 * 1024

PathOutsideWorkspace = PathOutsideTree
"""The 403 ``path_outside_workspace`` refusal (its name before the confined module held it)."""


@dataclass(frozen=True)
class FileBytes:
    data: bytes
    sha256: str


def read_file(root: Path, requested: str, *, shown: str | None = None) -> FileBytes:
    """The bytes of the regular file ``requested`` (relative to ``root``); ``shown`` is the
    path as the client wrote it, for error messages (default: ``requested``)."""
    try:
        with ConfinedTree(root) as tree:
            data = tree.read_bytes(requested, MAX_READ_BYTES)
    except Refusal as refusal:
        raise refusal.as_requested(shown or requested) from None
    return FileBytes(data=data, sha256=hashlib.sha256(data).hexdigest())


def write_file(
    root: Path,
    requested: str,
    data: bytes,
    *,
    owner: tuple[int, int] | None = None,
    shown: str | None = None,
) -> FileWriteResult:
    """Replace (or create, parents included) ``requested`` with ``data``. An edit keeps the
    file's permissions (an executable stays one); ``owner`` (uid, gid), when code under test
    runs as one, is given the file and every parent made for it."""
    try:
        with ConfinedTree(root) as tree:
            tree.write_bytes(requested, data, owner=owner)
    except Refusal as refusal:
        raise refusal.as_requested(shown or requested) from None
    return FileWriteResult(size=len(data), sha256=hashlib.sha256(data).hexdigest())
