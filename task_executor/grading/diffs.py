"""Splitting a unified diff into per-file sections, byte for byte.

Patches are handled as text split on "\\n" only: ``str.splitlines`` would also split on a bare CR,
form feeds and Unicode separators and so corrupt CRLF patches that git itself applies fine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DIFF_GIT = re.compile(r"^diff --git (\"?a/.+?\"?) (\"?b/.+?\"?)\r?$")
_C_ESCAPES = {
    "n": "\n",
    "t": "\t",
    '"': '"',
    "\\": "\\",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "r": "\r",
    "v": "\v",
}


@dataclass(frozen=True)
class FileDiff:
    """The lines of one file's diff; paths are repository-relative, None for /dev/null."""

    old_path: str | None
    new_path: str | None
    text: str

    @property
    def paths(self) -> set[str]:
        return {p for p in (self.old_path, self.new_path) if p}


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split on LF only."""
    return re.split(r"(?<=\n)", text) if text else []


def _unquote(path: str) -> str:
    """Undo git's C-style quoting of unusual file names."""
    if not (len(path) >= 2 and path[0] == '"' and path[-1] == '"'):
        return path
    body, out, i = path[1:-1], bytearray(), 0
    while i < len(body):
        char = body[i]
        if char == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and i + 3 < len(body) + 1:
                out.append(int(body[i + 1 : i + 4], 8))
                i += 4
                continue
            out += _C_ESCAPES.get(nxt, nxt).encode()
            i += 2
            continue
        out += char.encode()
        i += 1
    return out.decode("utf-8", "surrogateescape")


def _strip_prefix(raw: str) -> str | None:
    raw = raw.rstrip("\r\n")
    # "--- a/file\t2024-01-01 ..." (diff -u output) carries a timestamp after a tab.
    if "\t" in raw and not raw.startswith('"'):
        raw = raw.split("\t", 1)[0]
    raw = _unquote(raw.strip())
    if raw == "/dev/null":
        return None
    return raw.split("/", 1)[1] if "/" in raw else raw


def _section_paths(lines: list[str]) -> tuple[str | None, str | None]:
    old: str | None = None
    new: str | None = None
    seen_old = seen_new = False
    for line in lines:
        if line.startswith("--- ") and not seen_old:
            old, seen_old = _strip_prefix(line[4:]), True
        elif line.startswith("+++ ") and not seen_new:
            new, seen_new = _strip_prefix(line[4:]), True
        elif line.startswith("rename from ") or line.startswith("copy from "):
            old, seen_old = _unquote(line.split(" ", 2)[2].rstrip("\r\n")), True
        elif line.startswith("rename to ") or line.startswith("copy to "):
            new, seen_new = _unquote(line.split(" ", 2)[2].rstrip("\r\n")), True
        elif line.startswith("@@"):
            break
    if not (seen_old or seen_new) and lines:
        match = _DIFF_GIT.match(lines[0].rstrip("\n"))
        if match:
            old = _strip_prefix(match.group(1))
            new = _strip_prefix(match.group(2))
            deleted = any(line.startswith("deleted file mode") for line in lines)
            created = any(line.startswith("new file mode") for line in lines)
            old = None if created else old
            new = None if deleted else new
    return old, new


def split_patch(text: str) -> tuple[str, list[FileDiff]]:
    """Split ``text`` into (preamble, per-file sections); joining them gives ``text`` back."""
    lines = split_lines(text)
    starts: list[int] = []
    has_git_headers = any(line.startswith("diff --git ") for line in lines)
    for index, line in enumerate(lines):
        if has_git_headers:
            if line.startswith("diff --git "):
                starts.append(index)
        elif (
            line.startswith("--- ")
            and index + 1 < len(lines)
            and lines[index + 1].startswith("+++ ")
        ):
            # A plain diff: the section starts at its "--- " line (or its "diff ..."/"Index:" line).
            start = index
            if index > 0 and (lines[index - 1].startswith(("diff ", "Index: "))):
                start = index - 1
            starts.append(start)
    if not starts:
        return text, []
    preamble = "".join(lines[: starts[0]])
    sections = []
    for position, start in enumerate(starts):
        end = starts[position + 1] if position + 1 < len(starts) else len(lines)
        chunk = lines[start:end]
        old, new = _section_paths(chunk)
        sections.append(FileDiff(old_path=old, new_path=new, text="".join(chunk)))
    return preamble, sections


def touched_paths(text: str) -> set[str]:
    """Every repository path a patch reads or writes."""
    _, sections = split_patch(text)
    paths: set[str] = set()
    for section in sections:
        paths |= section.paths
    return paths
