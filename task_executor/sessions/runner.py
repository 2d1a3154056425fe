"""A persistent bash per session that never wedges: :class:`ShellSession`.

One long-lived ``bash`` keeps what a terminal keeps between commands (cwd, variables, exported
environment, functions, aliases, background jobs). Each :meth:`ShellSession.run` goes through
the Sandman checklist (DESIGN.md, "Command runner"):

* **Syntax check first** (:mod:`task_executor.syntax`): bash's parser refuses unterminated input
  in milliseconds with its own message and exit status 2; nothing runs, state is kept.
* **Own process groups**: the shell runs with job control (``set -m``), so every job of a command
  gets a process group of its own; every process carries the session's marker in its environment
  (:mod:`task_executor.reaper`).
* **Continuous, capped drain**: stdout and stderr share one pipe, read while the command runs
  into a :class:`~task_executor.output.CappedOutput`; memory stays flat under any flood.
* **Strict status frame** on a pipe of its own that the command cannot see; the command's text
  and the control line that runs it are described in :mod:`task_executor.framing`.

Per call (:mod:`task_executor.sessions.modes`): a command may run in a subshell of the shell
(stateless, with a cwd and env of its own), and its stderr may go to a pipe of its own, drained
and capped like the output. :meth:`ShellSession.interrupt` (from another thread) stops the
running command: SIGINT to the process groups it started, SIGKILL after a grace; the shell traps
SIGINT, so it survives and the command's list or loop ends, as after Ctrl-C in a terminal (a
loop in the shell itself, with no process to signal, is ended by recovering the shell).

When the shell cannot be trusted any more (timeout, the shell exited or was killed, a bad frame,
a failed liveness check) it is *recovered*: the shell is killed, so is every process started
since the command began (SIGTERM, a short grace, SIGKILL until none is left; found by marker,
session id and start time, so background, TERM-ignoring and double-forked children die too),
and a fresh shell is started and given back the snapshot. What a recovery keeps: the variables,
exported environment, functions, aliases and ``shopt`` options as of the end of the last
completed command, and the cwd as of the moment of the recovery (or of the last completed
command if the shell had died). What it loses: ``set`` options (``set -e`` would otherwise kill
every later shell), traps, the job table, ``umask``/``ulimit`` and the directory stack.
Background jobs started by *earlier* commands keep running, as they would after Ctrl-C in a
terminal (they no longer appear in ``jobs``); :meth:`ShellSession.restart` and
:meth:`ShellSession.close` kill them too.

A command's background children that outlive a normally finished command keep running (like
``cmd &`` in a terminal); their later output shows up in the next command's output.

Known limits. The shell is non-interactive: under ``set -u`` an unset variable, and under
``set -e`` a failing command, end the shell (reported as its exit, then recovered); under
``set -e`` a command also starts with ``$?`` 0, not the last status. A ``set -x`` trace marks the
command's lines ``+++`` (it runs two ``eval`` levels deep). The protocol's functions and fd
variables are read-only; its per-command ``__dy_*`` variables, set by a command, break that
command alone (an error or a timeout, then recovery resets them). bash's
runtime messages number lines of the shell's whole input ("bash: line 57: ..."); the syntax
check's messages use the command's own line numbers. A frame that the shell never writes while
it stays alive (``ulimit -n`` below ~110 leaves it unable to restore its fds; an agent function
named ``builtin`` or ``eval`` that does not pass its arguments on; one named ``local``, which
leaves the syntax check's ``set -n`` on) is seen as a timeout, and then recovered; the
recovery drops agent functions named ``eval``, ``builtin``, ``local`` and ``return``, which
would otherwise take over every later command too. Children that both scrub their environment
and ``setsid`` escape the sweep (see :mod:`task_executor.reaper`). A shell killed while it
writes a snapshot leaves the one before it (:func:`~task_executor.framing.latest_state`).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import select
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandbox_client.protocol import ExecResult
from task_executor.sandbox import reaper
from task_executor.sandbox.namespaces import Launcher, as_launcher
from task_executor.sandbox.output import CappedOutput

from .framing import (
    RELEASE_LINE,
    RUN_LINE,
    RUN_SEPARATE_LINE,
    SPARE_LINE,
    TOO_OLD_STATUS,
    TRIGGER_LINE,
    TRIGGER_SEPARATE_LINE,
    Frame,
    FrameError,
    FrameParser,
    ShellFds,
    bootstrap_script,
    command_file,
    latest_state,
    ping_line,
    restore_line,
    spare_post_line,
)
from .idle import Parked, Parking, shell_chain
from .modes import DEFAULT_MODE, CallMode, command_text
from .syntax import REFUSED_STATUS, refusal_message, tidy_message

KILL_GRACE_S = 0.5
"""Seconds between SIGTERM and SIGKILL when a command's processes are killed."""
START_TIMEOUT_S = 10.0
_PIPE_SIZE = 1 << 20
_READ_CHUNK = 1 << 18
_FRAME_FIRST_S = 0.005
"""How long a command's output is left in the pipe while waiting for its frame alone: most
commands end sooner, and are then answered after one wake-up instead of one per write. A command
that fills the pipe (1 MiB) before that waits at most this long for it to be drained."""
_LOW_FD = 100  # private fds live at/above this so they never collide with the agent's 3..9


class _ShellGone(Exception):
    """The shell exited (or closed its stdin) with no frame begun."""


class ShellStartError(RuntimeError):
    """A fresh shell did not answer its first ping."""


class SessionClosed(RuntimeError):
    """The session was closed; it runs nothing more."""


@dataclass
class _Shell:
    """One bash process and the fds that die with it."""

    proc: subprocess.Popen[bytes]
    stdin_fd: int
    status_fd: int
    pid_fd: int  # readable once the shell has exited
    status_w: int  # the number the shell knows its end of the status pipe by
    spare_since: int | None = None
    """Boot ticks when the shell was told to fork a spare that waits now (None: none waits)."""

    @property
    def pid(self) -> int:
        return self.proc.pid


class ShellSession(Parking):
    """A persistent bash: run commands one at a time, each checked, framed, capped, killable.

    ``env`` is the shell's whole environment (nothing is inherited from the executor); the
    session adds its marker. ``output_cap`` is the number of output bytes kept per command,
    half from the head and half from the tail. Thread-safe: calls are serialized, except that
    :meth:`close` kills a running command at once and :meth:`check_alive` on a busy session
    answers from the process state.
    """

    def __init__(
        self,
        cwd: str,
        env: dict[str, str],
        default_timeout: float = 300.0,
        output_cap: int = 64 * 1024,
        launcher: Launcher | Sequence[str] = (),
        restore: tuple[bytes, str] | None = None,
        launch: bool = True,
    ) -> None:
        """``launcher`` prefixes bash's argv (namespaces, limits); ``restore`` is a
        (:meth:`saved_state`, cwd) pair from another session to start from (a fork).

        Without ``launch`` the runner starts *parked* (see ``idle``): no process, no fd, until
        the first call that needs the shell, or :meth:`launch_parked`, starts it."""
        self.commands_run = 0
        self._initial_cwd = cwd
        self._launcher = as_launcher(launcher)
        self._default_timeout = default_timeout
        self._head = output_cap // 2
        self._tail = output_cap - self._head
        self._marker = reaper.new_marker()
        self._env = {**env, reaper.MARKER_VAR: self._marker}
        self._lock = threading.Lock()
        self._closed = False
        self._closing = threading.Lock()  # two closes at once (DELETE, reset) free fds once
        self._suspect = False
        self._sids: set[int] = set()
        self._shell: _Shell | None = None
        self._running_since: int | None = None  # boot ticks at the running command's start
        self._running_spare: int | None = None  # boot ticks at its spare's fork, if in one
        self._done = threading.Event()
        self._interrupted = False
        self._abandon = False
        self._forget_fds()
        state, start_dir = restore or (b"", None)
        self._parked: Parked | None = Parked(state, start_dir, time.monotonic(), fresh=True)
        if launch:
            self._launch_fresh()

    def launch_parked(self) -> bool:
        """Start the shell of a runner started parked, unless a call holds the runner (it
        starts the shell itself); whether this started it. A failure leaves the runner as it
        was: the next call tries again, and answers why."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._closed or not self.never_started:
                return False
            self._launch_fresh()
            return True
        finally:
            self._lock.release()

    def _launch_fresh(self) -> None:
        """Start the first shell of a runner started parked: nothing ran before it, so there is
        nothing to sweep (a recovery's work); on failure, parked again and fd-free."""
        parked = self._parked
        assert parked is not None and parked.fresh
        self._unpark()
        try:
            if parked.cwd is None:
                self._shell = self._spawn(self._initial_cwd)
            else:
                go = b"builtin cd -- " + shlex.quote(parked.cwd).encode("utf-8", "surrogateescape")
                self._shell = self._spawn(self._initial_cwd, parked.state + b"\n" + go + b"\n")
        except BaseException:
            self._close_fds()
            self._parked = parked
            raise

    def _open_fds(self) -> None:
        """The output and stderr pipes, the interrupt's wake-up pipe and the memfds of the
        protocol (all closed again if one fails)."""
        self._forget_fds()
        try:
            self._out_r, out_w = os.pipe2(os.O_CLOEXEC)
            self._out_w = _high_fd(out_w)
            try:
                fcntl.fcntl(self._out_r, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
            except OSError:  # above /proc/sys/fs/pipe-max-size: keep the default
                pass
            os.set_blocking(self._out_r, False)
            self._pipe_size = fcntl.fcntl(self._out_r, fcntl.F_GETPIPE_SZ)
            # stderr on request (a pipe of its own), and the interrupt's wake-up of a waiting run.
            self._err_r, err_w = os.pipe2(os.O_CLOEXEC)  # the command's end blocks, as stdout's
            self._err_w = _high_fd(err_w)
            os.set_blocking(self._err_r, False)
            self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            self._cmd_fd = _high_fd(os.memfd_create("dockyard-cmd", os.MFD_CLOEXEC))
            for _ in range(2):
                state = _high_fd(os.memfd_create("dockyard-state", os.MFD_CLOEXEC))
                self._snap_fds = (*self._snap_fds, state)
            self._msg_fd = _high_fd(os.memfd_create("dockyard-check-messages", os.MFD_CLOEXEC))
        except BaseException:
            self._close_fds()
            raise

    # -- public API ---------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """Process id of the current shell (it changes when the shell is recovered)."""
        return self._shell.pid if self._shell is not None else None

    @property
    def confined(self) -> bool:
        """Every process the shell starts stays in its PID namespace (see ``Launcher``)."""
        return self._launcher.confined

    @property
    def marker(self) -> str:
        """Value of :data:`~task_executor.reaper.MARKER_VAR` in every process of the session."""
        return self._marker

    def run(
        self, command: str, timeout: float | None = None, mode: CallMode = DEFAULT_MODE
    ) -> ExecResult:
        """Run one command (in a subshell, with stderr apart, as ``mode`` says); never raises
        for anything the command does."""
        limit = self._default_timeout if timeout is None else timeout
        with self._lock:
            self._check_open()
            self.commands_run += 1
            started = time.monotonic()
            if "\0" in command:
                return ExecResult(
                    exit_code=REFUSED_STATUS,
                    output="dockyard: not run: the command contains a NUL byte\n",
                    duration_s=time.monotonic() - started,
                )
            try:
                if self.never_started:
                    self._launch_fresh()
                self._unpark()
                if self._suspect or not self._shell_running():
                    self._recover(since=reaper.boot_ticks(), cwd=self._shell_cwd())
                result = self._run_locked(command, limit, started, mode)
            except (ShellStartError, OSError) as exc:  # OSError: no fd or process to restart
                # The session's code can see to this (a workspace whose memory or process
                # limit its own files and processes fill): an answer, never a 500; the next
                # command tries again, and finish still captures and grades the tree.
                result = ExecResult(exit_code=None, output="",
                                    error=f"the shell could not be started: {exc}")
            result.duration_s = time.monotonic() - started
            return result

    def check_alive(self, within: float = 2.0) -> bool:
        """Whether the shell answers a trivial command within ``within`` seconds.

        While a command runs, the shell cannot answer; then the answer is whether its process
        exists and is not stopped (and while its shell is being started, by a call or in the
        background, there is none yet: that is alive). A shell that fails the check is
        recovered before the next command.
        """
        if not self._lock.acquire(blocking=False):
            return self._shell is None or self._shell_running()
        try:
            return self.parked or self._ping(within)
        finally:
            self._lock.release()

    def cwd(self) -> str | None:
        """The shell's current directory (a parked shell's, as it was parked), or None if
        there is no live shell."""
        return self._shell_cwd() or self._parked_cwd()

    def saved_state(self) -> bytes:
        """The shell state as of the last completed command (variables, exports, functions,
        aliases, shopt), in the form ``restore`` takes."""
        with self._lock:
            self._check_open()  # closed under a fork: its fds are gone, maybe reused
            parked = self._parked_state()
            if parked is not None:
                return parked
            self._ping(within=2.0)  # answered once the last command's snapshot is written
            return self._latest_state()

    def restart(self, cwd: str | None = None) -> None:
        """Kill every process of the session and start a fresh shell; all state is lost."""
        with self._lock:
            self._check_open()
            self._unpark()
            self._kill_everything()
            for fd in self._snap_fds:
                os.ftruncate(fd, 0)
            self._drain(None, self._pipe_size * 4)
            self._sids.clear()
            self._suspect = False
            self._shell = self._spawn(cwd or self._initial_cwd)

    def stop_processes(self) -> None:
        """Kill the shell and everything it started, keeping the state it saved: the next
        command starts a shell from that state, as after a crash (finish stops them before
        capturing; a retried finish finds the session as it was, its processes aside)."""
        with self._lock:
            self._check_open()
            # The shell writes a command's snapshot after answering it: a ping is answered once
            # that is done (killed in between, the last command's variables and cwd were lost).
            self._ping(within=2.0, keep_spare=False)
            # TERM, then KILL what is left: what they write on TERM is in the diff captured next
            self._sweep(grace=KILL_GRACE_S)
            self._kill_everything()

    def close(self) -> None:
        """Kill every process of the session and close every fd; idempotent, and safe from
        another thread while a command runs."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
        # Kill first, without the lock, so that a running command ends now (its run() then
        # sees the shell die and returns); then, holding the lock, sweep again and free fds.
        # SIGKILL at once: what a closed session's processes would do with a SIGTERM is
        # thrown away with its workspace, and the grace's polls were 10 of a DELETE's 13 ms.
        self._sweep(grace=0)
        with self._lock:
            self._kill_everything(grace=0)
            self._close_fds()

    def __enter__(self) -> ShellSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one command --------------------------------------------------------------------------

    def interrupt(self, grace: float = KILL_GRACE_S) -> bool:
        """Stop the running command, keep the shell: SIGINT to the process groups it started,
        SIGKILL to them after ``grace``, and when even that does not end it (a loop in the
        shell itself), the shell is recovered from its saved state after another ``grace``.
        The running :meth:`run` answers ``interrupted``. False when nothing was running.
        Safe from another thread; never waits for the session's lock."""
        since, spare = self._running_since, self._running_spare
        if since is None or self._done.is_set():
            return False
        self._interrupted = True
        for signum in (signal.SIGINT, signal.SIGKILL):
            _kill_groups(self._command_groups(since, spare), signum)
            if self._done.wait(grace):
                return True
        self._abandon = True
        os.write(self._wake_w, b"!")
        return True

    def _command_groups(self, since: int, spare: int | None = None) -> set[int]:
        """The process groups of the shell's children started by the running command (each
        job has its own, under job control; the shell's group is never among them); with
        ``spare`` (when the spare was forked), the group of the spare running it too: the
        youngest child since then (start times are clock ticks, and a background job of an
        earlier command may share the spare's)."""
        shell = self._shell
        if shell is None:
            return set()
        bash = _innermost(shell.pid)
        own = reaper.read_proc(bash)
        groups = set()
        youngest: tuple[int, int, int] | None = None
        for child in _children(bash):
            info = reaper.read_proc(child)
            if info is None or (own is not None and info.pgid == own.pgid):
                continue
            if info.start_ticks >= since:
                groups.add(info.pgid)
            elif spare is not None and info.start_ticks >= spare:
                youngest = max(youngest or (0, 0, 0), (info.start_ticks, child, info.pgid))
            # else: a background job of an earlier command keeps running
        if youngest is not None:
            groups.add(youngest[2])
        return groups

    def _run_locked(
        self, command: str, limit: float, started: float, mode: CallMode = DEFAULT_MODE
    ) -> ExecResult:
        shell = self._shell
        assert shell is not None
        out = CappedOutput(self._head, self._tail)
        err = CappedOutput(self._head, self._tail) if mode.separate_stderr else None
        # A spare forked after the last call runs this one. It is the shell's only child younger
        # than its fork (the shell waits on it meanwhile), so an interrupt finds its group from
        # then on; the sweep after a timeout keeps to what started since the call began: a
        # background job's worker forked while the spare waited is not this call's.
        spare = shell.spare_since if mode.subshell else None
        since = reaper.boot_ticks()
        nonce = secrets.token_hex(16)
        text, added_lines = command_text(command, mode)
        _rewrite(self._cmd_fd, command_file(nonce, _encode(text)))
        exit_code: int | None = None
        error: str | None = None
        timed_out = False
        self._drain_fd(self._wake_r, None, 64)
        self._interrupted = self._abandon = False
        self._done.clear()
        self._running_since, self._running_spare = since, spare
        try:
            if mode.subshell:
                shell.spare_since = None
                trigger = TRIGGER_SEPARATE_LINE if err is not None else TRIGGER_LINE
                self._send_raw(("" if spare is not None else SPARE_LINE) + trigger
                               + spare_post_line(nonce))
            else:
                self._send(RUN_SEPARATE_LINE if err is not None else RUN_LINE)
            frame = self._await_frame(nonce, out, started + limit, err)
            if frame is None:
                timed_out = not self._abandon
            elif frame.kind == "ready":
                error = "invalid frame: a ping answer instead of a status"
            else:
                self._drain(out, self._pipe_size)
                self._drain_fd(self._err_r, err if err is not None else out, self._pipe_size)
                if mode.subshell:
                    self._fork_spare(shell)
                return self._answer(frame, out, err, added_lines)
        except FrameError as exc:
            error = str(exc)
        except _ShellGone:
            exit_code, error = self._exit_report(shell)
        finally:
            self._running_since = None
            self._done.set()
        if self._abandon:
            error = "the command outlived its interrupt; the shell was restarted from its state"
        elif self._interrupted and exit_code == 128 + signal.SIGINT:
            # bash ends a list or loop whose job died of SIGINT as if it had been sent the
            # signal itself (the rest of the list must not run): a non-interactive shell exits.
            error = "interrupted; the shell was restarted from its state"
        if spare is not None:  # the spare itself (a loop in it is no process of its own)
            _kill_groups(self._command_groups(since, spare), signal.SIGKILL)
        self._recover(since=since, cwd=self._shell_cwd(), out=out)
        if self._closed:
            exit_code, error = None, "session closed while the command ran"
        return ExecResult(
            exit_code=exit_code,
            output=out.text(),
            truncated=out.truncated,
            output_bytes=out.total_bytes,
            timed_out=timed_out,
            error=error,
            interrupted=self._interrupted,
            **_stderr_fields(err),
        )

    def _answer(
        self, frame: Frame, out: CappedOutput, err: CappedOutput | None, added_lines: int
    ) -> ExecResult:
        """The result of a command that framed its status (ran, or refused by the check)."""
        text = out.text()
        refused: dict[str, str] = {}
        if frame.kind == "refused":
            text = tidy_message(text, added_lines)
            refused = {"not_run": "syntax_error", "syntax_error": refusal_message(text)}
        return ExecResult(
            exit_code=frame.status,
            output=text,
            truncated=out.truncated,
            output_bytes=out.total_bytes,
            interrupted=self._interrupted,
            **refused,  # type: ignore[arg-type]
            **_stderr_fields(err),
        )

    def _ping(self, within: float, keep_spare: bool = True) -> bool:
        """Under the lock: whether the shell answers a ping in time; if not, it is suspect. A
        spare the ping let go is forked again (``keep_spare``): a client polling the session's
        state between subshell calls would otherwise put every next call's fork on its path."""
        shell = self._shell
        if self._closed or shell is None or not self._shell_running():
            return False
        had_spare = shell.spare_since is not None
        nonce = secrets.token_hex(16)
        try:
            self._send(ping_line(nonce))
            frame = self._await_frame(nonce, None, time.monotonic() + within)
        except (_ShellGone, FrameError):
            frame = None
        if frame is None or frame.kind != "ready":
            self._suspect = True
            return False
        if had_spare and keep_spare:
            self._fork_spare(shell)
        return True

    def _exit_report(self, shell: _Shell) -> tuple[int | None, str]:
        """The exit status and error text for a shell that died during a command."""
        try:
            status = shell.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return None, "shell stopped answering (not reaped); restarted"
        if status < 0:
            return None, f"shell killed by signal {-status}; restarted"
        if 128 < status <= 128 + signal.SIGRTMAX:
            # Under bubblewrap the shell is a grandchild: its death by a signal comes back as
            # 128 + the signal (bwrap's own status), as bash reports a killed child.
            return status, f"shell killed by signal {status - 128} (status {status}); restarted"
        # `exit 3` typed by the agent: its status is the command's, the shell is restarted.
        return status, f"shell exited with status {status}; restarted"

    def _await_frame(
        self, nonce: str, out: CappedOutput | None, deadline: float,
        err: CappedOutput | None = None,
    ) -> Frame | None:
        """Drain output into ``out`` until the frame arrives (returned) or the deadline (None).

        Raises FrameError for a bad frame and _ShellGone when the shell exits with no frame
        begun. Its exit is seen on a pidfd, not as the status pipe's end of file: a subshell
        forked into the background keeps a copy of the pipe (bash's saved copy of the fd).
        With ``out`` None the output is left in the pipe (a ping between commands). ``err``:
        stderr is drained apart, into it. An interrupt that gave up on the command wakes the
        wait, which then returns None as at the deadline.
        """
        shell = self._shell
        assert shell is not None
        parser = FrameParser(nonce)
        poller = select.poll()
        poller.register(shell.status_fd, select.POLLIN)
        poller.register(shell.pid_fd, select.POLLIN)
        if out is not None:
            poller.register(self._wake_r, select.POLLIN)
        watch_output_at = None if out is None else time.monotonic() + _FRAME_FIRST_S
        while True:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                return None
            if watch_output_at is not None:
                if now >= watch_output_at:
                    poller.register(self._out_r, select.POLLIN)
                    if err is not None:
                        poller.register(self._err_r, select.POLLIN)
                    watch_output_at = None
                else:
                    remaining = min(remaining, watch_output_at - now)
            for fd, _ in poller.poll(max(1, int(remaining * 1000) + 1)):
                if fd == self._out_r:
                    self._drain(out, _READ_CHUNK)
                    continue
                if fd == self._err_r:
                    self._drain_fd(self._err_r, err, _READ_CHUNK)
                    continue
                if fd == self._wake_r:
                    self._drain_fd(self._wake_r, None, 64)
                    if self._abandon:
                        return None
                    continue
                # Status bytes, or the shell's exit (then read what it wrote before dying).
                frame = _read_status(shell.status_fd, parser)
                if frame is not None:
                    return frame
                if fd == shell.pid_fd:
                    parser.finish()
                    raise _ShellGone

    def _drain(self, out: CappedOutput | None, limit: int) -> None:
        """Read what the output pipe holds now, at most ``limit`` bytes (bounded even while a
        background job keeps writing)."""
        self._drain_fd(self._out_r, out, limit)

    @staticmethod
    def _drain_fd(fd: int, out: CappedOutput | None, limit: int) -> None:
        """Read what the pipe ``fd`` holds now, at most ``limit`` bytes, into ``out``."""
        taken = 0
        while taken < limit:
            try:
                chunk = os.read(fd, min(_READ_CHUNK, limit - taken))
            except BlockingIOError:
                return
            if not chunk:
                return
            taken += len(chunk)
            if out is not None:
                out.write(chunk)

    def _send(self, line: str) -> None:
        """Send control lines to the shell itself (a waiting spare is let go first)."""
        assert self._shell is not None
        if self._shell.spare_since is not None:
            self._shell.spare_since = None
            line = RELEASE_LINE + line
        self._send_raw(line)

    def _send_raw(self, line: str) -> None:
        assert self._shell is not None
        data = line.encode()
        try:
            while data:
                data = data[os.write(self._shell.stdin_fd, data) :]
        except BrokenPipeError as exc:
            raise _ShellGone from exc

    def _fork_spare(self, shell: _Shell) -> None:
        """Have the shell fork the spare the next subshell call runs in (after a subshell call:
        an agent that makes one makes many). A shell gone meanwhile is the next call's to
        recover."""
        since = reaper.boot_ticks()
        try:
            self._send_raw(SPARE_LINE)
        except _ShellGone:
            return
        shell.spare_since = since

    def _release_spare(self) -> None:
        """Let a waiting spare go (a ping: answered once it has exited), so that the shell's
        children are the agent's alone."""
        if self._shell is not None and self._shell.spare_since is not None:
            self._ping(within=2.0, keep_spare=False)

    # -- shell lifecycle ----------------------------------------------------------------------

    def _spawn(
        self, cwd: str, restore: bytes | None = None, out: CappedOutput | None = None
    ) -> _Shell:
        """Start a bash, give it the protocol (and a state to restore), wait for its ping.

        Output meanwhile (earlier background jobs, a ``BASH_ENV`` script) goes to ``out`` or is
        dropped: left in a full pipe, it could block the new shell before it answers.
        """
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        child_w = _high_fd(status_w)
        try:
            proc = self._launcher.popen(
                ["bash", "--noprofile", "--norc"],
                stdin=subprocess.PIPE,
                stdout=self._out_w,
                stderr=self._out_w,  # the launcher's own errors; bash's is /dev/null (framing)
                cwd=cwd,
                env=self._env,
                pass_fds=(child_w, self._cmd_fd, *self._snap_fds, self._msg_fd, self._out_w,
                          self._err_w),
                start_new_session=True,
            )
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(child_w)
        assert proc.stdin is not None
        self._sids.add(proc.pid)
        os.set_blocking(status_r, False)
        shell = _Shell(proc, proc.stdin.fileno(), status_r, os.pidfd_open(proc.pid), child_w)
        self._shell = shell
        fds = self._fds(shell)
        # The protocol (4 KB) is sourced from a memfd, not sent down the pipe: bash reads a pipe
        # one byte per system call, a file in one (1.8 ms of a shell's start here). The
        # messages memfd is free until the first command's check empties it.
        _rewrite(self._msg_fd, bootstrap_script(fds).encode())
        try:
            self._send(f"builtin source /proc/self/fd/{self._msg_fd}\n")
            if restore is not None:
                _rewrite(self._cmd_fd, restore)
                self._send(restore_line(fds))
            nonce = secrets.token_hex(16)
            self._send(ping_line(nonce))
            sink = out if out is not None else CappedOutput(0, 0)
            frame = self._await_frame(nonce, sink, time.monotonic() + START_TIMEOUT_S)
            if frame is None or frame.kind != "ready":
                raise ShellStartError(f"bash did not answer its first ping ({frame})")
        except (_ShellGone, FrameError, ShellStartError) as exc:
            _kill_now(shell)  # reaps it: an exit of its own keeps its status
            self._shell = None
            if shell.proc.returncode == TOO_OLD_STATUS:
                raise ShellStartError("bash 4.4 or later is needed for sessions") from exc
            raise ShellStartError(f"bash did not start: {exc!r}") from exc
        return shell

    def _recover(self, since: int, cwd: str | None, out: CappedOutput | None = None) -> None:
        """Kill the shell and what the current command started; start a shell with the saved
        state, in ``cwd`` (None: the cwd the saved state recorded)."""
        within = self._within()  # its tree, read while the shell still holds it together
        if self._shell is not None:
            _kill_now(self._shell)
            self._shell = None
        if self._closed:
            return
        reaper.kill(
            reaper.Target(marker=self._marker, sids=self._sids, started_at_or_after=since,
                          within=within),
            grace=KILL_GRACE_S,
        )
        self._drain(out, self._pipe_size)
        self._drain_fd(self._err_r, out, self._pipe_size)
        snapshot = self._latest_state()
        if cwd is not None:
            go = b"builtin cd -- " + shlex.quote(cwd).encode("utf-8", "surrogateescape")
        else:
            go = b'builtin cd -- "$PWD"'
        self._suspect = False
        start_in = cwd if cwd is not None and os.path.isdir(cwd) else self._initial_cwd
        if not os.path.isdir(start_in):
            start_in = "/"
        self._shell = self._spawn(start_in, snapshot + b"\n" + go + b"\n", out)

    def _kill_everything(self, grace: float = KILL_GRACE_S) -> None:
        within = self._within()  # read before the shell's death scatters its tree
        if self._shell is not None:
            _kill_now(self._shell)
            self._shell = None
        self._sweep(grace=grace, within=within)

    def _sweep(self, grace: float, within: reaper.Finder | None = None) -> None:
        """Kill every process of the session: marked, or in any session a shell of ours led."""
        reaper.kill(reaper.Target(marker=self._marker, sids=set(self._sids),
                                  within=within or self._within()), grace=grace)

    def _within(self) -> reaper.Finder | None:
        """Where the session's processes are: below its shells, when the launcher confines
        them to a PID namespace (a scan of all /proc grew with every live session)."""
        if not self._launcher.confined:
            return None
        within = reaper.tree_of(self._sids)
        within()  # seen now: the shell's tree before a kill scatters it
        return within

    def _shell_running(self) -> bool:
        """The shell process exists and is neither a zombie nor stopped."""
        shell = self._shell
        if shell is None:
            return False
        # One waitid() that leaves the state in place (WNOWAIT), where reading /proc/PID/stat
        # cost tens of microseconds on every command.
        try:
            change = os.waitid(
                os.P_PID, shell.pid, os.WEXITED | os.WSTOPPED | os.WNOHANG | os.WNOWAIT
            )
        except ChildProcessError:  # reaped already
            return False
        return change is None

    def _shell_cwd(self) -> str | None:
        shell = self._shell
        if shell is None or shell.proc.poll() is not None:
            return None
        try:
            path = os.readlink(f"/proc/{_innermost(shell.pid)}/cwd")
        except OSError:
            return None
        return path.removesuffix(" (deleted)")

    def _fds(self, shell: _Shell) -> ShellFds:
        return ShellFds(
            status=shell.status_w,
            command=self._cmd_fd,
            snapshots=self._snap_fds,
            messages=self._msg_fd,
            output=self._out_w,
            stderr=self._err_w,
        )

    def _latest_state(self) -> bytes:
        return latest_state([_read_all(fd) for fd in self._snap_fds])

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosed("the shell session is closed")

    def _forget_fds(self) -> None:
        self._out_r = self._out_w = self._cmd_fd = self._msg_fd = -1
        self._err_r = self._err_w = self._wake_r = self._wake_w = -1
        self._snap_fds: tuple[int, ...] = ()

    def _close_fds(self) -> None:
        """Close the runner's fds once: a number closed twice may by then be another
        session's (a parked shell's are closed already)."""
        fds = (self._out_r, self._out_w, self._cmd_fd, *self._snap_fds, self._msg_fd,
               self._err_r, self._err_w, self._wake_r, self._wake_w)
        self._forget_fds()
        for fd in fds:
            if fd < 0:
                continue
            try:
                os.close(fd)
            except OSError:
                pass

    def _shell_pids(self) -> set[int]:
        return shell_chain(self._shell.pid) if self._shell_running() and self._shell else set()

    def _session_pids(self) -> set[int]:
        within = self._within()
        if within is not None:  # every process below the shells, whatever it claims
            return set(within())
        return {p.pid for p in reaper.find(reaper.Target(marker=self._marker, sids=self._sids))}


def _kill_now(shell: _Shell) -> None:
    """SIGKILL the shell itself (its state is in the snapshot), reap it, close its pipes."""
    try:
        os.kill(shell.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        shell.proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:  # stuck in the kernel; the sweep retries
        pass
    assert shell.proc.stdin is not None
    try:
        shell.proc.stdin.close()
    except OSError:  # BrokenPipe while flushing: nothing was buffered that matters
        pass
    os.close(shell.status_fd)
    os.close(shell.pid_fd)


def _kill_groups(groups: set[int], signum: int) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _read_status(fd: int, parser: FrameParser) -> Frame | None:
    """Feed the parser what the status pipe holds now; the frame once complete, else None.

    Bytes right behind a complete frame make it invalid (nothing else writes there).
    """
    frame = None
    while True:
        try:
            chunk = os.read(fd, 256)
        except BlockingIOError:
            return frame
        if not chunk:  # every writer gone: the shell died, perhaps right after its frame
            if frame is not None:
                return frame
            parser.finish()
            raise _ShellGone
        frame = parser.feed(chunk)


def _stderr_fields(err: CappedOutput | None) -> dict[str, object]:
    """The result's stderr fields: none unless stderr was asked for apart."""
    if err is None:
        return {}
    return {"stderr": err.text(), "stderr_bytes": err.total_bytes}


def _children(pid: int) -> list[int]:
    """The children of ``pid`` (every thread's)."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return found


def _innermost(pid: int) -> int:
    """The bash a launcher started: under bubblewrap it is a grandchild (bwrap, its init in the
    new PID namespace, then bash), and its cwd reads as code under test sees it (/testbed/...)."""
    for _ in range(4):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "bwrap":
                return pid
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return pid
        if not children:
            return pid
        pid = int(children[0])
    return pid


def _high_fd(fd: int) -> int:
    """Move ``fd`` to a number >= 100 (close-on-exec), closing the original."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _LOW_FD)
    os.close(fd)
    return high


def _rewrite(fd: int, data: bytes) -> None:
    """Make the memfd hold exactly ``data``, with the (shared) offset at its start. Cutting the
    file after writing, not before, keeps its pages instead of freeing and allocating them."""
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
    os.lseek(fd, 0, os.SEEK_SET)


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0) if size else b""


def _encode(command: str) -> bytes:
    try:
        return command.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return command.encode("utf-8", "replace")
