"""Running one shell command for grading: own process group, wall clock, capped output.

Used for setup and test commands of single-shot gradings. The command runs under ``bash -c`` in a
new session (so it leads its own process group), with a marker variable in its environment that
every descendant inherits; at the end (normal exit or deadline) the group is killed and any
process still carrying the marker -- a daemonized child that left the group -- is killed too, so
nothing the code under test started outlives its grading.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .namespaces import Launcher, as_launcher
from .output import CappedOutput
from .reaper import DEFAULT_GRACE_S, MARKER_VAR, Target, kill, new_marker


@dataclass(frozen=True)
class CommandOutcome:
    exit_code: int | None
    output: str
    truncated: bool
    timed_out: bool
    duration_s: float


def run_command(
    script: str,
    *,
    cwd: str,
    env: Mapping[str, str],
    timeout: float,
    launcher: Launcher | Sequence[str] = (),
    head: int = 16 * 1024,
    tail: int = 48 * 1024,
) -> CommandOutcome:
    """Run ``script`` with bash; kill it and all its descendants at ``timeout`` seconds.

    ``launcher`` prefixes bash's argv: the sandbox (namespaces, fixed path, limits) it runs in.
    """
    marker = new_marker()
    full_env = dict(env)
    full_env[MARKER_VAR] = marker
    output = CappedOutput(head=head, tail=tail)
    read_fd, write_fd = os.pipe()
    started = time.monotonic()
    try:
        proc = as_launcher(launcher).popen(
            ["bash", "-c", script],
            cwd=cwd,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            start_new_session=True,
        )
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    os.close(write_fd)
    stop_draining = threading.Event()
    drainer = threading.Thread(
        target=_drain, args=(read_fd, output, stop_draining), daemon=True
    )
    drainer.start()
    timed_out = False
    try:
        exit_code: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        exit_code = None
    finally:
        # Kill the group, the session and every marked process whatever happened: background
        # children of a finished test run are as unwelcome as those of a timed-out one. A timed
        # out run gets SIGTERM and a short grace first, so test runners can flush and clean up.
        kill(
            Target(marker=marker, pgids=(proc.pid,), sids=(proc.pid,)),
            grace=DEFAULT_GRACE_S if timed_out else 0.0,
        )
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        # Every writer is dead now, so the pipe reaches EOF; should a writer have escaped both
        # kills, the drainer stops at the next quiet moment instead of waiting for it forever.
        drainer.join(timeout=2)
        stop_draining.set()
        drainer.join()
    duration = time.monotonic() - started
    return CommandOutcome(
        exit_code=exit_code,
        output=output.text(),
        truncated=output.truncated,
        timed_out=timed_out,
        duration_s=duration,
    )


def _drain(fd: int, output: CappedOutput, stop: threading.Event) -> None:
    # poll(), not select(): an executor holding many sessions hands out fds past 1024, which
    # select() refuses (the drain died, the command lost its stdout and every grading had no
    # verdict).
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    try:
        while True:
            if poller.poll(100):
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                output.write(chunk)
            if stop.is_set():
                break
    finally:
        os.close(fd)
