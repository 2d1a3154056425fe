"""Byte-exact file reads and writes confined to a workspace.

Bytes go in and out untouched: no newline translation, no decoding, so CRLF, a byte-order mark,
mixed endings, a bare CR, invalid UTF-8 and binary files all round-trip (Sandman tables A23/A24:
text-mode reads changed bytes outside the edit in every sampled file). Paths are resolved with
every symlink followed and must stay inside the workspace root.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from sandbox_client.protocol import FileWriteResult
from task_executor.errors import InvalidRequest, NotFound

MAX_READ_BYTES = 256 * 1024 * 1024


class PathOutsideWorkspace(InvalidRequest):
    code = "path_outside_workspace"
    http_status = 403


@dataclass(frozen=True)
class FileBytes:
    data: bytes
    sha256: str


def resolve_inside(root: Path, requested: str) -> Path:
    """The real path of ``requested`` (relative to ``root``, or absolute) if it is inside root."""
    if not requested or "\0" in requested:
        raise InvalidRequest("query parameter 'path' is required", code="missing_path")
    real_root = Path(os.path.realpath(root))
    candidate = Path(requested) if os.path.isabs(requested) else real_root / requested
    if len(str(candidate)) >= 4096 or any(len(part) > 255 for part in candidate.parts):
        raise InvalidRequest(f"path {requested[:100]!r}... is too long", code="path_too_long")
    # realpath follows every symlink that exists, including one planted as the final component.
    real = Path(os.path.realpath(candidate))
    if real != real_root and real_root not in real.parents:
        raise PathOutsideWorkspace(f"{requested!r} resolves outside the workspace")
    return real


def read_file(root: Path, requested: str) -> FileBytes:
    path = resolve_inside(root, requested)
    if path.is_dir():
        raise InvalidRequest(f"{requested!r} is a directory", code="is_a_directory")
    if not path.is_file():
        raise NotFound(f"no file {requested!r} in the workspace", code="file_not_found")
    if path.stat().st_size > MAX_READ_BYTES:
        raise InvalidRequest(f"{requested!r} is over {MAX_READ_BYTES} bytes", code="too_large")
    data = path.read_bytes()
    return FileBytes(data=data, sha256=hashlib.sha256(data).hexdigest())


def write_file(root: Path, requested: str, data: bytes) -> FileWriteResult:
    path = resolve_inside(root, requested)
    if path.is_dir():
        raise InvalidRequest(f"{requested!r} is a directory", code="is_a_directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    # The parent may have been created through nothing but real directories; check again after.
    resolve_inside(root, str(path.parent))
    temporary = path.with_name(f".{path.name}.dockyard-write")
    with open(temporary, "wb") as handle:
        handle.write(data)
    mode = path.stat().st_mode & 0o7777 if path.exists() else None
    os.replace(temporary, path)
    if mode is not None:
        os.chmod(path, mode)  # an edit keeps the file's permissions (an executable stays one)
    return FileWriteResult(size=len(data), sha256=hashlib.sha256(data).hexdigest())
