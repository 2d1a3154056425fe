"""Multi-turn sessions: a workspace and a persistent shell per session, and their lifecycle.

A session owns one workspace (a fresh tree at base_commit, setup done) and one ``ShellSession``.
Calls on one session are serialized (a second concurrent call is refused with 409, never queued
behind a long command); sessions idle past the idle timeout are closed by a reaper thread; at
most ``max_sessions`` live at once (429 beyond). ``finish`` captures the agent's diff and grades it
through the same ``Grader`` as ``/task/submit``. Nothing here knows about HTTP.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

from sandbox_client.protocol import (
    ExecRequest,
    ExecResult,
    FileWriteResult,
    FinishResult,
    FinishSpec,
    SessionStartResult,
    SessionStartSpec,
    SessionState,
    SnapshotInfo,
    TaskResult,
    UploadResult,
    template_key,
)
from task_executor.config import Settings
from task_executor.errors import Conflict, NotFound, OverCapacity, Unavailable
from task_executor.grading.grader import Grader, GradingJob
from task_executor.workspaces.fsutil import remove_tree
from task_executor.workspaces.workspace import Snapshot, Workspace, WorkspaceFactory

from . import headroom, idle
from .archive import check_archive
from .capture import CapturedPatch, CaptureFailed, capture_patch
from .files import MAX_READ_BYTES, FileBytes, read_file, write_file
from .modes import CallMode
from .outside import SandboxFiles
from .reclaim import Reclaimer
from .runner import SessionClosed as ShellClosed
from .runner import ShellSession, ShellStartError
from .warmup import Warmup

MAX_SHELLS = 16
"""Shells one session may hold ("default" included)."""
DEFAULT_SHELL = "default"

log = logging.getLogger(__name__)

CLOSE_WORKERS = 16
"""Sessions closed at once at shutdown."""


@dataclass
class Session:
    """One live session; ``lock`` serializes calls on it."""

    session_id: str
    spec: SessionStartSpec
    workspace: Workspace
    shell: ShellSession
    started: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    deny_network: bool = False
    snapshots: dict[str, Snapshot] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False
    named: dict[str, ShellSession] = field(default_factory=dict)
    """The shells besides ``shell`` (the default one), by name."""
    settled: bool = False
    """Every shell stopped (none waiting for its first start) and the launch namespace let go:
    nothing for the idle sweep to do until a call uses the session again."""

    def all_shells(self) -> list[ShellSession]:
        return [self.shell, *self.named.values()]

    def shell_names(self) -> list[str]:
        return [DEFAULT_SHELL, *sorted(self.named)]

    def find_shell(self, name: str) -> ShellSession:
        """The shell called ``name``: 404 shell_not_found if the session has none."""
        shell = self.shell if name == DEFAULT_SHELL else self.named.get(name)
        if shell is None:
            raise NotFound(f"the session has no shell {name!r}", code="shell_not_found")
        return shell


_EXIT_POLL_S = 0.001
"""How often a DELETE looks whether its session's last processes are gone (they are dying
already: a 10 ms poll would mostly wait)."""


class SessionManager:
    """Creates, serves and closes sessions."""

    def __init__(self, settings: Settings, workspaces: WorkspaceFactory, grader: Grader) -> None:
        self.settings = settings
        self.workspaces = workspaces
        self.grader = grader
        self._sessions: dict[str, Session] = {}
        self._starting = 0
        self._guard = threading.Lock()
        self._reaper: threading.Thread | None = None
        self._stop = threading.Event()
        self._warmup = Warmup(max_wait=settings.session_idle_stop)
        self._reclaimer = Reclaimer()
        self._launch_now = settings.session_launch == "wait"

    # ------------------------------------------------------------------ lifecycle

    @property
    def live(self) -> int:
        return len(self._sessions)

    def start(self, spec: SessionStartSpec) -> SessionStartResult:
        with self._guard:
            if len(self._sessions) + self._starting >= self.settings.max_sessions:
                raise OverCapacity(
                    f"{self.settings.max_sessions} sessions are live; close one or retry later",
                    retry_after=5,
                )
            headroom.check()
            self._starting += 1
            self._ensure_reaper()
        try:
            with headroom.running_out_is_503():
                session = self._open(spec)
        finally:
            with self._guard:
                self._starting -= 1
        with self._guard:
            self._sessions[session.session_id] = session
        self._launch_later(session)
        log.info("session %s started (task %s)", session.session_id, spec.task_id)
        return self._started(session)

    def _launch_later(self, session: Session) -> None:
        """A shell started parked (``session_launch`` background) is launched by the warm-up
        thread, unless the session's first call comes first."""
        if session.shell.parked:
            self._warmup.submit(session.shell)

    def _open(
        self,
        spec: SessionStartSpec,
        snapshot: Snapshot | None = None,
        restore: tuple[bytes, str] | None = None,
    ) -> Session:
        self.grader.expect_image(spec.image)
        deny_network = self.grader.deny_for(spec.deny_network, spec.conditions)
        key = template_key(spec.repo, spec.base_commit, spec.setup, spec.env)
        self.grader.expect_conditions(spec.conditions, key, spec.env, deny_network)
        workspace = self.workspaces.create(
            spec.repo, spec.base_commit, spec.setup, spec.env, snapshot=snapshot
        )
        try:
            if spec.conditions is not None and snapshot is None:
                self.grader.conditions_in(spec.conditions, key, workspace, spec.env, deny_network)
            shell = self._shell(spec, workspace, deny_network, restore)
        except BaseException:
            workspace.destroy()
            raise
        return Session(uuid.uuid4().hex, spec, workspace, shell, deny_network=deny_network)

    def _shell(
        self,
        spec: SessionStartSpec,
        workspace: Workspace,
        deny_network: bool,
        restore: tuple[bytes, str] | None = None,
    ) -> ShellSession:
        """The session's shell; ``restore`` is (saved state, cwd relative to the tree)."""
        if restore is not None:
            state, relative_cwd = restore
            restore = (state, os.path.normpath(os.path.join(workspace.visible_path, relative_cwd)))
        return ShellSession(
            cwd=str(workspace.path),
            env=_session_env(workspace, spec.env),
            default_timeout=spec.command_timeout or self.settings.command_timeout,
            output_cap=self.settings.output_cap_bytes,
            launcher=workspace.launcher(deny_network),
            restore=restore,
            launch=self._launch_now,
        )

    def close(self, session_id: str) -> None:
        session = self._pop(session_id)
        # A running command ends now rather than being waited out: DELETE runs on one of the
        # threads kept for short calls, which an agent's `sleep 300` must not hold. (The shell
        # closes safely under a running command; its exec answers that the session closed.)
        for shell in session.all_shells():
            shell.close()
        with session.lock:
            self._dispose(session, remove_later=True)

    def close_all(self, keep_trees: bool = False) -> None:
        """Close every session; with ``keep_trees``, their trees are left for the caller to
        remove (see ``WorkspaceFactory.destroy_all``)."""
        self._stop.set()
        self._warmup.close()  # no shell starts while they are being stopped
        with self._guard:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        # All at once (issue 24): one by one, each closing session's unmounts paid for the
        # thousands of mounts beside it (10,000 sessions: 157 s, far past any grace). The
        # workspaces' processes die together through their cgroups, so each shell's close
        # finds nothing left to wait for; then the workspaces go in one pass.
        self.workspaces.kill_processes([s.workspace for s in sessions])
        with ThreadPoolExecutor(CLOSE_WORKERS, thread_name_prefix="close") as pool:
            for failure in pool.map(self._close_shell_quietly, sessions):
                if failure is not None:
                    log.error("closing a session failed: %r", failure)
        closed = self._reclaimer.close()  # deleted sessions' workspaces not removed yet
        self.workspaces.destroy_all([*closed, *(s.workspace for s in sessions)],
                                    keep_trees=keep_trees)
        log.info("%d sessions closed", len(sessions))

    @staticmethod
    def _close_shell_quietly(session: Session) -> BaseException | None:
        session.closed = True
        failure: BaseException | None = None
        for shell in session.all_shells():  # named shells too: each holds processes and fds
            try:
                shell.close()
            except Exception as error:  # one shell's failure must not keep the rest open
                failure = failure or error
        return failure

    def _pop(self, session_id: str) -> Session:
        with self._guard:
            session = self._sessions.pop(session_id, None)
        if session is None:
            raise NotFound(f"no live session {session_id!r}", code="session_not_found")
        return session

    def _dispose(self, session: Session, remove_later: bool = False) -> None:
        """Close the session's shells and remove its workspace; with ``remove_later``, once
        nothing of it runs any more, the removal may be left to the reclaimer (see
        ``reclaim``)."""
        if session.closed:
            return
        session.closed = True
        running = any(shell.pid is not None for shell in session.all_shells())
        try:
            for shell in session.all_shells():
                shell.close()
        finally:
            workspace = session.workspace
            # A confined shell's death takes its PID namespace along, but the kernel kills the
            # rest of it as its init exits, after the shell we waited for: a CI run saw one of
            # its processes still alive at the answer. Unconfined shells may have lost a process
            # that cleared its marker. Either way the cgroup has them until they are gone (a
            # session whose shells were all stopped has nothing there: not read).
            if workspace.group is not None and (running or not session.shell.confined):
                workspace.group.kill_all(poll=_EXIT_POLL_S)
            if not (remove_later and self._reclaimer.submit(workspace)):
                workspace.destroy()
        log.info("session %s closed", session.session_id)

    @property
    def reclaiming(self) -> int:
        """Closed sessions whose workspaces wait for removal."""
        return self._reclaimer.waiting

    # ------------------------------------------------------------------ calls

    @contextmanager
    def _using(self, session_id: str, touch: bool = True) -> Iterator[Session]:
        with self._guard:
            session = self._sessions.get(session_id)
        if session is None:
            raise NotFound(f"no live session {session_id!r}", code="session_not_found")
        if not session.lock.acquire(blocking=False):
            raise Conflict(
                "another call on this session is running", code="session_busy", retry_after=1
            )
        try:
            if session.closed:
                raise NotFound(f"no live session {session_id!r}", code="session_not_found")
            session.settled = False
            yield session
            session.settled = False  # (a sweep during the call may have seen it stopped)
            if touch:
                session.last_used = time.monotonic()
        except ShellClosed:  # a DELETE closed the shell under this call
            raise NotFound(f"session {session_id!r} was closed", code="session_not_found") from None
        finally:
            session.lock.release()

    def exec(self, session_id: str, command: str, timeout: float | None,
             request: ExecRequest | None = None) -> ExecResult:
        """Run ``command`` in the shell (and mode: subshell, cwd, env, stderr) ``request``
        names; a shell name not used yet starts a shell."""
        request = request or ExecRequest(command=command)
        with self._using(session_id) as session:
            shell = self._shell_for(session, request.shell)
            mode = CallMode(
                subshell=request.in_subshell,
                cwd=None if request.cwd is None else posixpath.join(
                    session.workspace.visible_path, request.cwd),
                env=dict(request.env or {}),
                separate_stderr=request.stderr == "separate",
            )
            result = shell.run(command, timeout=timeout, mode=mode)
        if result.timed_out:
            log.info("session %s: command timed out after %.1fs", session_id, result.duration_s)
        elif result.error is not None:
            log.warning("session %s: %s", session_id, result.error)
        return result

    def _shell_for(self, session: Session, name: str) -> ShellSession:
        """The named shell, started (in the tree, with the session's env) on first use."""
        if name == DEFAULT_SHELL or name in session.named:
            return session.find_shell(name)
        if len(session.named) + 1 >= MAX_SHELLS:
            raise Conflict(f"the session has {MAX_SHELLS} shells; close one first",
                           code="too_many_shells")
        try:
            shell = self._shell(session.spec, session.workspace, session.deny_network)
        except ShellStartError as exc:
            # The workspace's limits, full of what its code left, can see to this: the session
            # and its other shells go on; retry, or close a shell.
            raise Unavailable(f"shell {name!r} could not be started: {exc}", retry_after=5,
                              code="shell_start_failed") from None
        session.named[name] = shell
        return shell

    def interrupt(self, session_id: str, shell_name: str) -> bool:
        """Stop the command running in a shell; the shell and its state stay. Never waits
        for the session's lock: the call it interrupts holds it."""
        with self._guard:
            session = self._sessions.get(session_id)
        if session is None or session.closed:
            raise NotFound(f"no live session {session_id!r}", code="session_not_found")
        return session.find_shell(shell_name).interrupt()

    def close_shell(self, session_id: str, shell_name: str) -> None:
        if shell_name == DEFAULT_SHELL:
            raise Conflict("the default shell closes with the session",
                           code="cannot_close_default_shell")
        with self._using(session_id) as session:
            session.find_shell(shell_name)
            session.named.pop(shell_name).close()

    def read(self, session_id: str, path: str) -> FileBytes:
        with self._using(session_id) as session:
            requested = self._tree_path(session, path)
            if posixpath.isabs(requested):  # outside the tree: read in the sandbox
                data = _files(session).read(requested, MAX_READ_BYTES)
                return FileBytes(data=data, sha256=hashlib.sha256(data).hexdigest())
            return read_file(session.workspace.path, requested, shown=path)

    def write(self, session_id: str, path: str, data: bytes) -> FileWriteResult:
        with self._using(session_id) as session:
            requested = self._tree_path(session, path)
            if posixpath.isabs(requested):  # outside the tree: written in the sandbox
                _files(session).write(requested, data)
                return FileWriteResult(size=len(data), sha256=hashlib.sha256(data).hexdigest())
            # The file and the parents made for it are created owned by the uid code under test
            # runs as (when one is configured), through the same fds that made them: a chown by
            # path afterwards would follow whatever the session swapped in meanwhile.
            return write_file(
                session.workspace.path, self._tree_path(session, path), data,
                owner=self.workspaces.sandbox.owner, shown=path,
            )

    def upload(self, session_id: str, directory: str, data: bytes) -> UploadResult:
        """Extract a tar archive into ``directory`` (relative to the tree, or absolute) inside
        the sandbox, as the sandbox user; its members are checked first (see ``archive``)."""
        with self._using(session_id) as session:  # an unknown session costs no check
            checked = check_archive(data, self.settings.max_body_bytes)
            target = posixpath.join(session.workspace.visible_path, directory)
            _files(session).extract(target, checked.tar)
        return UploadResult(files=checked.files, bytes=checked.bytes)

    @staticmethod
    def _tree_path(session: Session, path: str) -> str:
        """Absolute paths are the agent's view (the fixed path): map them onto the tree as a
        relative path. Any other absolute path stays absolute: it is reached in the sandbox."""
        visible = session.workspace.visible_path.rstrip("/")
        if path == visible or path.startswith(visible + "/"):
            return path[len(visible):].lstrip("/") or "."
        return path

    def state(self, session_id: str) -> SessionState:
        with self._using(session_id, touch=False) as session:
            now = time.monotonic()
            return SessionState(
                session_id=session_id,
                alive=session.shell.check_alive(within=2.0),
                cwd=session.shell.cwd(),
                age_s=round(now - session.started, 3),
                idle_s=round(now - session.last_used, 3),
                commands_run=sum(shell.commands_run for shell in session.all_shells()),
                shells=session.shell_names(),
                stopped=all(shell.parked for shell in session.all_shells()),
            )

    def reset(self, session_id: str) -> SessionStartResult:
        """Back to the base state: the base tree (setup kept) and a fresh shell."""
        with self._using(session_id) as session:
            for shell in session.all_shells():
                shell.close()
            session.named.clear()
            try:
                session.workspace.reset()
                session.shell = self._shell(session.spec, session.workspace, session.deny_network)
            except BaseException:
                with self._guard:
                    self._sessions.pop(session_id, None)
                self._dispose(session)
                raise
            return self._started(session)

    def snapshot(self, session_id: str, name: str | None) -> SnapshotInfo:
        """A named read-only capture of the workspace (its changes, in overlay mode)."""
        with self._using(session_id) as session:
            name = name or f"snap-{len(session.snapshots) + 1}"
            if name in session.snapshots:
                raise Conflict(f"snapshot {name!r} exists", code="snapshot_exists")
            target = session.workspace.root / "snapshots" / name
            snap = session.workspace.snapshot(target)
            # Snapshots live on the host's disk, outside the workspace's tmpfs: together they
            # may hold no more than the disk quota, or N snapshots would write N quotas.
            quota = self.workspaces.disk_quota
            kept = sum(s.size_bytes for s in session.snapshots.values()) + snap.size_bytes
            if quota is not None and kept > quota:
                remove_tree(target)
                raise Conflict(
                    f"the session's snapshots would hold {kept} bytes, over the workspace's "
                    f"disk quota of {quota}; delete the session or snapshot less",
                    code="snapshot_quota_exceeded",
                )
            session.snapshots[name] = snap
            return SnapshotInfo(session_id=session_id, name=name, size_bytes=snap.size_bytes)

    def fork(self, session_id: str, snapshot_name: str | None) -> SessionStartResult:
        """A new session from the source's current tree (or a named snapshot of it), cwd and
        exported environment; the source is not touched."""
        with self._guard:
            if len(self._sessions) + self._starting >= self.settings.max_sessions:
                raise OverCapacity(
                    f"{self.settings.max_sessions} sessions are live", retry_after=5
                )
            headroom.check()
            self._starting += 1
        try:
            with self._using(session_id) as source:
                if snapshot_name is not None:
                    if snapshot_name not in source.snapshots:
                        raise NotFound(f"no snapshot {snapshot_name!r}", code="snapshot_not_found")
                    snap = source.snapshots[snapshot_name]
                    transient = None
                else:
                    transient = source.workspace.root / "forks" / uuid.uuid4().hex
                    snap = source.workspace.snapshot(transient)
                state = source.shell.saved_state()
                root = source.workspace.visible_path
                cwd = source.shell.cwd() or root
                relative = os.path.relpath(cwd, root) if cwd.startswith(root) else "."
                try:
                    with headroom.running_out_is_503():
                        forked = self._open(source.spec, snapshot=snap,
                                            restore=(state, relative))
                finally:
                    if transient is not None:
                        remove_tree(transient)
        finally:
            with self._guard:
                self._starting -= 1
        with self._guard:
            self._sessions[forked.session_id] = forked
        self._launch_later(forked)
        log.info("session %s forked from %s", forked.session_id, session_id)
        return self._started(forked)

    @staticmethod
    def _started(session: Session) -> SessionStartResult:
        return SessionStartResult(
            session_id=session.session_id,
            workdir=session.workspace.visible_path,
            base_commit=session.workspace.base_commit,
            template_hit=session.workspace.template_hit,
        )

    def finish(self, session_id: str, spec: FinishSpec) -> FinishResult:
        """Capture the diff, close the session, grade the diff in a fresh tree.

        A request that cannot be graded is refused first (4xx), the session kept. A tree whose
        changes cannot be read is a verdict (``patch_apply_failed``, ``capture_failed``), like
        a patch that does not apply; a capture step the sandbox never started is
        CaptureUnavailable (503), and the session is kept for the retry.
        """
        with self._using(session_id) as session:
            job = GradingJob(
                task_id=session.spec.task_id or session_id,
                repo=session.spec.repo,
                base_commit=session.workspace.base_commit,
                patch="",
                spec=spec,
                setup=list(session.spec.setup),
                env=dict(session.spec.env),
                deny_network=spec.deny_network,
                conditions=session.spec.conditions,
                image=session.spec.image,
            )
            self.grader.admit(job)
            # Nothing the agent left running may go on once its changes are read: a background
            # job could rewrite the tree while git reads it, and its processes hold the budget
            # of all workspaces, which the capture's own cgroup draws on too. (Before the
            # capture had a group of its own, processes holding the workspace's pids limit made
            # every launch fail: a 503 retried forever.)
            for shell in session.all_shells():
                shell.stop_processes()
            if session.workspace.group is not None:
                session.workspace.group.kill_all()  # escaped the shell's sweep: not the cgroup
            try:
                captured: CapturedPatch | CaptureFailed = (
                    CapturedPatch(patch=spec.patch) if spec.patch is not None
                    else capture_patch(session.workspace, spec.exclude_paths)
                )
            except CaptureFailed as exc:
                captured = exc
            with self._guard:
                self._sessions.pop(session_id, None)
            self._dispose(session)
        if isinstance(captured, CaptureFailed):
            log.info("session %s: %s", session_id, captured)
            return FinishResult(patch="", result=_not_captured(job, captured))
        job.patch = captured.patch
        result = self.grader.grade(job)
        result.excluded_files = sorted(set(result.excluded_files) | set(captured.excluded_files))
        return FinishResult(patch=captured.patch, result=result)

    # ------------------------------------------------------------------ idle reaping

    def _ensure_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = threading.Thread(
                target=self._reap_idle_forever, name="session-reaper", daemon=True
            )
            self._reaper.start()

    def _reap_idle_forever(self) -> None:
        shortest = min(self.settings.session_idle_timeout,
                       self.settings.session_idle_stop or float("inf"))
        interval = min(30.0, max(0.2, shortest / 4))
        while not self._stop.wait(interval):
            self.reap_idle()
            self.stop_idle()

    def stop_idle(self) -> int:
        """Save and stop the shells of sessions idle past ``session_idle_stop`` (see
        ``idle``); how many were stopped now. A session in a call is skipped."""
        after = self.settings.session_idle_stop
        if after is None:
            return 0
        # Settled sessions are skipped: at 10,000 sessions a sweep of them all held the GIL
        # 11 ms every 1.25 s (in-process), a pause for every call it overlapped.
        now = time.monotonic()
        with self._guard:
            sessions = [s for s in self._sessions.values()
                        if not s.settled and now - s.last_used > after]
        # named shells too: each is saved and stopped on its own
        shells = [(shell, s.last_used) for s in sessions for shell in s.all_shells()]
        stopped = idle.park_idle(shells, after)
        if stopped:
            log.info("%d idle session shells saved and stopped", stopped)
        for session in sessions:
            if session.closed or not all(shell.parked and not shell.never_started
                                         for shell in session.all_shells()):
                continue
            # A session whose every shell is parked runs nothing: its launch namespace goes
            # too (one fd each; the next launch makes it again).
            namespace = session.workspace.namespace
            if namespace is not None and namespace.held:
                namespace.release()
            session.settled = True
        return stopped

    def reap_idle(self) -> list[str]:
        """Close sessions idle past the timeout (busy ones are left alone); return their ids."""
        now = time.monotonic()
        with self._guard:
            idle = [
                s for s in self._sessions.values()
                if now - s.last_used > self.settings.session_idle_timeout
            ]
        reaped = []
        for session in idle:
            if not session.lock.acquire(blocking=False):
                continue
            try:
                with self._guard:
                    if self._sessions.get(session.session_id) is not session:
                        continue
                # Disposed before it leaves the table: whoever sees a 404 sees it fully gone.
                self._dispose(session)
                with self._guard:
                    self._sessions.pop(session.session_id, None)
                reaped.append(session.session_id)
                log.info("session %s reaped after idling", session.session_id)
            finally:
                session.lock.release()
        return reaped


def _session_env(workspace: Workspace, extra: dict[str, str]) -> dict[str, str]:
    """The shells' environment: code under test's, with HOME at /root where the sandbox shows
    the workspace's home there (``Sandbox.root_home``), as agent tools expect (unless the
    spec sets HOME)."""
    env = workspace.sandbox_env(extra)
    home = workspace.factory.sandbox.root_home
    if home is not None and "HOME" not in extra:
        env["HOME"] = home
    return env


def _files(session: Session) -> SandboxFiles:
    return SandboxFiles(session.workspace, session.deny_network)


def _not_captured(job: GradingJob, failure: CaptureFailed) -> TaskResult:
    """The verdict on a tree git cannot read: the agent's doing, as a patch that does not
    apply is (never no verdict, which would let an agent erase its own failure)."""
    return TaskResult(
        task_id=job.task_id, status="patch_apply_failed", resolved=False,
        rules=job.spec.rules or "strict", error=str(failure), error_code="capture_failed",
        log=f"[the agent's changes could not be captured]\n{failure}\n",
    )
