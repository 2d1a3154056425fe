"""/proc helpers shared by the benchmark scripts (they run as scripts: imported by file name)."""

from __future__ import annotations

import os
from pathlib import Path


def descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        children = kids.get(todo.pop(), [])
        found += children
        todo += children
    return found
