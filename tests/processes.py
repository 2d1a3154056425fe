"""Process checks shared by the tests: is a pid still a live (non-zombie) process?"""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")
