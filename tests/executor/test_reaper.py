"""The reaper against real processes: by marker, session, group and age, whatever they did."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from task_executor.sandbox import reaper
from tests.processes import alive


def spawn(script: str, pid_file: Path, marker: str | None, new_session: bool = True) -> int:
    """Run ``script`` in bash and return the pid it writes (a descendant, not bash itself)."""
    env = {"PATH": os.environ["PATH"]}
    if marker is not None:
        env[reaper.MARKER_VAR] = marker
    subprocess.Popen(
        ["bash", "-c", script],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=new_session,
    ).wait()
    deadline = time.monotonic() + 5
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return int(pid_file.read_text())


def daemon(pid_file: Path, trap_term: bool = False) -> str:
    """A double-forked, setsid'd sleeper that writes its pid: it leaves group and session."""
    trap = "trap '' TERM; " if trap_term else ""
    return f'( setsid bash -c "{trap}echo \\$\\$ > {pid_file}; exec sleep 1000" & ) &'


def test_kill_marked_processes_kills_daemons_even_term_ignoring(tmp_path: Path) -> None:
    marker = reaper.new_marker()
    polite = spawn(daemon(tmp_path / "a"), tmp_path / "a", marker)
    stubborn = spawn(daemon(tmp_path / "b", trap_term=True), tmp_path / "b", marker)
    other = spawn(daemon(tmp_path / "c"), tmp_path / "c", reaper.new_marker())
    try:
        assert reaper.kill(reaper.Target(marker=marker), grace=0.2) == 2
        assert not alive(polite) and not alive(stubborn)
        assert alive(other)  # another marker: not ours
    finally:
        os.kill(other, 9)


def test_started_at_or_after_spares_older_processes(tmp_path: Path) -> None:
    marker = reaper.new_marker()
    old = spawn(daemon(tmp_path / "a"), tmp_path / "a", marker)
    time.sleep(0.05)
    since = reaper.boot_ticks()
    new = spawn(daemon(tmp_path / "b"), tmp_path / "b", marker)
    reaper.kill(reaper.Target(marker=marker, started_at_or_after=since), grace=0)
    assert alive(old) and not alive(new)
    reaper.kill(reaper.Target(marker=marker), grace=0)
    assert not alive(old)


def test_kill_process_group_catches_unmarked_members(tmp_path: Path) -> None:
    leader = subprocess.Popen(
        ["bash", "-c", f"env -i sh -c 'echo $$ > {tmp_path / 'a'}; exec sleep 1000' & wait"],
        start_new_session=True,
    )
    deadline = time.monotonic() + 5
    while not (tmp_path / "a").exists() or not (tmp_path / "a").read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    member = int((tmp_path / "a").read_text())
    assert reaper.kill(reaper.Target(pgids=(leader.pid,)), grace=0.2) >= 2
    leader.wait(timeout=5)
    assert not alive(member)


def test_never_signals_the_caller() -> None:
    me = reaper.Target(sids=(os.getsid(0),), pgids=(os.getpgrp(),))
    assert all(p.pid != os.getpid() for p in reaper.find(me))
    assert reaper.find(me) == []


def test_a_reused_leader_pid_is_not_taken_for_ours() -> None:
    # An unmarked live leader of the session named: the pid belongs to someone else now.
    stranger = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    try:
        target = reaper.Target(marker=reaper.new_marker(), sids=(stranger.pid,))
        assert reaper.find(target) == []
        assert [p.pid for p in reaper.find(reaper.Target(sids=(stranger.pid,)))] == [stranger.pid]
    finally:
        stranger.kill()
        stranger.wait()
