"""Process checks shared by the tests: is a pid still a live (non-zombie) process, and which
processes of code under test exist (seen from the host)?"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.loopback import LoopbackServer


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


class ProcessWatch:
    """Records, while it runs, the host pids of every process whose environment carries
    ``PROBE_VARIABLE=<token>``: code under test has its own PID namespace, so the pids it could
    report itself mean nothing outside, and the host view is the one a leak would be seen in."""

    def __init__(self, token: str) -> None:
        self.entry = f"{PROBE_VARIABLE}={token}".encode()
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.seen.update(pids_carrying(self.entry))
            self._stop.wait(0.01)

    def alive(self) -> list[int]:
        return [pid for pid in sorted(self.seen | set(pids_carrying(self.entry))) if alive(pid)]


PROBE_VARIABLE = "DOCKYARD_TEST_PROBE"


def pids_carrying(entry: bytes) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        if entry in environ.split(b"\0"):
            found.append(int(name))
    return found


def mounts_anywhere(root: Path) -> list[str]:
    """Every mount table line, in any mount namespace on the machine, naming a path below
    ``root`` (as mount point or in its options: an overlay's layers): an executor serving as its
    own process keeps its mounts in a namespace of its own, which the test's table never shows."""
    prefix = str(root.resolve()).rstrip("/") + "/"
    seen: set[str] = set()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            namespace = os.readlink(f"/proc/{name}/ns/mnt")
            if namespace in seen:
                continue
            table = Path(f"/proc/{name}/mountinfo").read_text(errors="replace")
        except OSError:
            continue  # gone meanwhile
        seen.add(namespace)
        found += [f"{namespace}: {line}" for line in table.splitlines() if prefix in line]
    return found


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll ``condition`` until it holds; the timeout only turns a hang into a failure."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


class ConnectionCounter(LoopbackServer):
    """A loopback TCP server that answers each connection with how many came before it: the
    channel from sandboxed code under test (which sees the host read-only, so it cannot leave a
    file behind) to a test, when the task runs with egress allowed."""

    def __init__(self) -> None:
        self.count = 0
        super().__init__(self._answer, backlog=128)

    def _answer(self, connection: socket.socket) -> None:
        with connection:
            connection.sendall(str(self.count).encode())
            self.count += 1

    def snippet(self) -> str:
        """Python that connects once and evaluates to the count before it."""
        return f"int(__import__('socket').create_connection(('127.0.0.1', {self.port})).recv(16))"
