"""Whether one more session fits in what this executor and its machine have left (issue 24).

A session start takes file descriptors in the executor (about ten per live session), processes
(a shell and its sandbox) and memory. Running out half way through a start gave a 500; checked
first, with a margin, it is a retryable 503 whose code names the resource (``out_of_fds``,
``out_of_pids``, ``out_of_memory``), and nothing that runs already is touched.
"""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from task_executor.errors import OverCapacity

FDS_PER_SESSION = 16
"""What one start may open in the executor, with room to spare (about ten stay open)."""
FD_MARGIN = 64
"""Kept for everything else: new connections, log files, gradings' pipes."""
PIDS_PER_SESSION = 16
PID_SHARE = 0.8
"""Of the kernel's pid_max, the share this executor's sessions may take the machine to."""
MEMORY_MARGIN_BYTES = 128 * 1024 * 1024
RETRY_AFTER_S = 5


class OutOfResource(OverCapacity):
    """A resource a session needs is (nearly) exhausted: retry later or elsewhere."""

    http_status = 503


def limits() -> dict[str, int]:
    """The effective limits a session start is checked against (``/health`` shows them)."""
    return {
        "open_files": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "pids_max": int(PID_SHARE * _read_int("/proc/sys/kernel/pid_max")),
    }


def check() -> None:
    """Raise :class:`OutOfResource` unless one more session fits, margins included."""
    open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    open_now = open_fds()
    if open_now + FDS_PER_SESSION + FD_MARGIN > open_files:
        raise _out("fds", f"{open_now} of {open_files} file descriptors are open")
    pids_max = limits()["pids_max"]
    pids_now = _tasks_on_machine()
    if pids_now + PIDS_PER_SESSION > pids_max:
        raise _out("pids", f"{pids_now} processes and threads run; {pids_max} allowed")
    available = _mem_available()
    if available is not None and available < MEMORY_MARGIN_BYTES:
        raise _out("memory", f"{available // 2**20} MiB of memory available")


@contextmanager
def running_out_is_503() -> Iterator[None]:
    """A start that runs out of descriptors anyway is the same 503 (the check is a snapshot: a
    connection or another start can take the margin between it and the start), never a 500."""
    try:
        yield
    except Exception as exc:
        out_of_fds = _exhausted(exc)
        if out_of_fds is None:
            raise
        raise out_of_fds from exc


def _exhausted(exc: BaseException) -> OutOfResource | None:
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno in (errno.EMFILE, errno.ENFILE):
            return _out("fds", f"a descriptor could not be opened ({cause.strerror})")
        cause = cause.__cause__ or cause.__context__
    return None


def open_fds() -> int:
    """How many fds this process holds. Linux 6.2 and later give the count as the size of
    ``/proc/self/fd``: one stat, where listing it (O(fds), ten thousand at a thousand sessions,
    under the manager's lock) took a quarter of a session start at 600 sessions."""
    counted = os.stat("/proc/self/fd").st_size
    return counted if counted > 0 else len(os.listdir("/proc/self/fd"))


def _out(what: str, detail: str) -> OutOfResource:
    return OutOfResource(
        f"no room for another session: {detail}; retry later or on another executor",
        retry_after=RETRY_AFTER_S,
        code=f"out_of_{what}",
    )


def _read_int(path: str) -> int:
    return int(Path(path).read_text().split()[0])


def _tasks_on_machine() -> int:
    # /proc/loadavg's fourth field is "running/total" scheduling entities (processes and
    # threads), the count pid_max bounds; one read instead of a /proc scan.
    return int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])


def _mem_available() -> int | None:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None
