"""An executor process's start and end: take over the base directory, drain, clean up.

**Start** (:func:`take_over_base_dir`, before the app is built). An executor killed with SIGKILL
(OOM, node drain, a crash) leaves behind test runs and shells (they run in sessions of their
own, so they outlive it), mounts and working trees. A new executor on the same base directory
first makes sure no other live executor uses it (a lock file; the kernel drops the lock of a dead
process), then kills every process whose environment carries ``DOCKYARD_EXECUTOR=<base_dir>``
(all that the executor starts, see ``grading.sandbox_env``), unmounts everything mounted below the
base directory (deepest first, lazily if busy), and removes ``<base_dir>/work/*``. Mirrors and
templates stay: they are caches, valid across runs.

**End** (:func:`serve_until_stopped`, instead of waitress's ``server.run()``). On SIGTERM or
SIGINT the executor drains: routes that start work (submit, session start, exec, reset, fork)
and ``/health`` -- so a readiness probe takes the pod out of rotation -- answer 503
``shutting_down`` with Retry-After, while requests already running go on, and so do calls that
end a session's work (finish, file reads and writes, state, close). Once no request is in
flight, or the grace period (``DOCKYARD_SHUTDOWN_GRACE``) is over, or a second signal comes,
pending answers are flushed and every connection is closed; then sessions are closed, all at
once (their processes killed through their cgroups, their mounts detached, their cgroups
removed), every process of this executor is killed and the working trees go -- those not yet
removed when the grace period (counted from the signal) is over are left for the next start,
holding no process, mount or cgroup -- and the process exits 0.

A grading cut off by the grace period never answers: its connection is closed *before* its
processes are killed, so a test run killed under it cannot turn into a wrong verdict on the
wire; the client sees a lost reply, which it reports as no verdict (``execution_error``).
"""

from __future__ import annotations

import fcntl
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from flask import Flask, request
from werkzeug.wsgi import ClosingIterator

from task_executor.config import Settings
from task_executor.errors import ShuttingDown
from task_executor.grading.grader import OWNER_VARIABLE, owner_token
from task_executor.sandbox import reaper
from task_executor.sandbox.mounts import mounts_under, unmount_under
from task_executor.workspaces.fsutil import remove_tree

from .services import Services

log = logging.getLogger(__name__)

EXTENSION = "dockyard.lifecycle"
LOCK_FILE = "executor.lock"
RETRY_AFTER_S = 5
"""What a refused caller is told to wait: by then this executor is gone or another one answers."""

# Calls that finish work already under way; everything else is refused while draining.
ALLOWED_WHILE_DRAINING = frozenset(
    {
        "/session/<session_id>/finish",
        "/session/<session_id>/file",
        "/session/<session_id>",
        "/metrics",
        "/openapi.json",
    }
)

_FLUSH_S = 5.0
_WIND_DOWN_S = 10.0
_TREES_MIN_S = 3.0
"""Seconds the working trees' removal is given at shutdown even past the grace period."""


# -- draining ----------------------------------------------------------------------------------


class Drain:
    """Whether the app is draining, and how many requests it is serving (answer bodies
    included: a request counts until the server has taken its whole body)."""

    def __init__(self) -> None:
        self._draining = threading.Event()
        self._idle = threading.Condition()
        self._in_flight = 0

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def begin(self) -> None:
        self._draining.set()

    def wait_idle(self, timeout: float, abort: threading.Event | None = None) -> bool:
        """Wait until no request is in flight; False if ``timeout`` passed or ``abort`` was set."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0 or (abort is not None and abort.is_set()):
                    return False
                self._idle.wait(min(left, 0.1))
        return True

    def wrap(self, wsgi_app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
        """A WSGI middleware that counts a request until the server closes its body."""

        def counted(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            with self._idle:
                self._in_flight += 1
            try:
                body = wsgi_app(environ, start_response)
            except BaseException:
                self._done()
                raise
            return ClosingIterator(body, self._done)

        return counted

    def _done(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()


def install(app: Flask) -> Drain:
    """Refuse new work with 503 while ``app`` drains, and count its requests in flight."""
    drain = Drain()
    app.extensions[EXTENSION] = drain
    app.wsgi_app = drain.wrap(app.wsgi_app)  # type: ignore[method-assign]

    @app.before_request
    def refuse_new_work_while_draining() -> None:
        if not drain.draining or request.url_rule is None:
            return
        if request.url_rule.rule not in ALLOWED_WHILE_DRAINING:
            raise ShuttingDown(
                "this executor is shutting down; send new work to another one",
                retry_after=RETRY_AFTER_S,
            )

    return drain


# -- cleaning the base directory ---------------------------------------------------------------


class ServingLoopFailed(RuntimeError):
    """An exception escaped waitress's serving loop: this process can no longer serve. It is
    logged with its traceback; the process must exit non-zero at once (its supervisor restarts
    it, and the next executor on the base directory cleans up what this one leaves)."""


class BaseDirInUse(RuntimeError):
    """Another live executor holds the base directory's lock."""


@dataclass(frozen=True)
class Cleanup:
    """What :func:`clean_base_dir` found and removed."""

    processes: int
    unmounted: int
    removed: int
    kept: tuple[str, ...]
    """Working trees left in place because something is still mounted in them."""


def owner_entries(base_dir: Path) -> tuple[str, ...]:
    """The environment entries that mark processes of an executor on ``base_dir``."""
    return (f"{OWNER_VARIABLE}={owner_token(base_dir)}",)


def kill_owned(base_dir: Path, grace: float = reaper.DEFAULT_GRACE_S) -> int:
    """Kill every process started by an executor on ``base_dir``; return how many there were."""
    return reaper.kill(reaper.Target(environment=owner_entries(base_dir)), grace=grace)


def remove_work(work_root: Path, deadline: float | None = None) -> tuple[int, tuple[str, ...]]:
    """Remove every entry of ``work_root``; a tree with a mount still in it is left alone,
    because removing it would delete through the mount into whatever is mounted there. Past
    ``deadline`` (``time.monotonic()``) the rest stays, for the next start to remove."""
    if not work_root.is_dir():
        return 0, ()
    still_mounted = mounts_under(work_root)
    removed, kept = 0, []
    for entry in sorted(work_root.iterdir()):
        if deadline is not None and time.monotonic() > deadline:
            log.warning("the grace period is over: %s and the trees after it are left for the "
                        "next start to remove", entry)
            break
        inside = str(entry.resolve()) + "/"
        if any(point.startswith(inside) or point == inside[:-1] for point in still_mounted):
            kept.append(str(entry))
            continue
        if entry.is_dir() and not entry.is_symlink():
            remove_tree(entry)
        else:
            entry.unlink()
        removed += 1
    return removed, tuple(kept)


def clean_base_dir(base_dir: Path, grace: float = reaper.DEFAULT_GRACE_S,
                   deadline: float | None = None) -> Cleanup:
    """Kill the processes, unmount the mounts and remove the working trees of any executor that
    ran on ``base_dir`` (the trees only until ``deadline``). Mirrors, templates and the log
    stay."""
    # Processes first: they may hold mounts busy and write into the trees being removed.
    processes = kill_owned(base_dir, grace)
    unmounted = unmount_under(base_dir)
    removed, kept = remove_work(base_dir / "work", deadline)
    for tree in kept:
        log.error("left %s in place: something is still mounted inside it", tree)
    return Cleanup(processes=processes, unmounted=unmounted, removed=removed, kept=kept)


def take_over_base_dir(settings: Settings) -> IO[bytes]:
    """Lock the base directory for this process and clean up what a previous run left.

    Returns the lock file, which must stay open as long as the executor runs; raises
    BaseDirInUse when another live executor holds it (its work must not be destroyed).
    """
    settings.base_dir.mkdir(parents=True, exist_ok=True)
    handle = open(settings.base_dir / LOCK_FILE, "wb")  # held open until the process exits
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise BaseDirInUse(
            f"another executor is running on {settings.base_dir}; give each its own TASK_BASE_DIR"
        ) from None
    cleanup = clean_base_dir(settings.base_dir)
    if cleanup.processes or cleanup.unmounted or cleanup.removed:
        log.warning(
            "previous run left %d processes, %d mounts and %d working trees; all removed",
            cleanup.processes,
            cleanup.unmounted,
            cleanup.removed,
        )
    return handle


# -- serving until a signal --------------------------------------------------------------------


def serve_until_stopped(server: Any, app: Flask) -> bool:
    """Run waitress's ``server`` until SIGTERM or SIGINT, then drain and clean up (see the
    module docstring). Returns True if every request finished within the grace period.

    Must run in the main thread (it installs signal handlers).
    """
    services: Services = app.extensions["dockyard"]
    drain: Drain = app.extensions[EXTENSION]
    grace = services.settings.shutdown_grace
    stop, hurry = threading.Event(), threading.Event()
    drained: list[bool] = []
    signalled: list[float] = []

    def wait_then_stop() -> None:
        drained.append(drain.wait_idle(grace, abort=hurry))
        stop.set()
        server.pull_trigger()  # wake the loop now rather than at its next timeout

    def on_signal(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if drain.draining:
            log.warning("%s again: not waiting for running work any more", name)
            hurry.set()
            return
        log.info("%s: draining; %d requests in flight, %.0fs grace", name, drain.in_flight, grace)
        signalled.append(time.monotonic())
        drain.begin()
        threading.Thread(target=wait_then_stop, name="drain", daemon=True).start()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            _run_loop(server, stop)
        except Exception as error:
            # Never a quiet drain and exit 0: a server that cannot serve says why, and its
            # caller exits non-zero so the supervisor restarts it (issue 24).
            log.exception("the serving loop failed; this executor cannot serve any more")
            raise ServingLoopFailed(f"the serving loop failed: {error!r}") from error
        if drained and drained[0]:
            _flush(server)
        else:
            log.warning("grace period over with %d requests in flight: cut off", drain.in_flight)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # The trees are removed within the grace period (from the signal on); what is left then
    # holds no process, mount or cgroup, and the next start removes it (issue 24).
    _shut_down(server, services, (signalled[0] if signalled else time.monotonic()) + grace)
    return bool(drained and drained[0])


def _run_loop(server: Any, stop: threading.Event) -> None:
    while not stop.is_set():
        server.asyncore.loop(
            timeout=server.adj.asyncore_loop_timeout,
            map=server._map,
            use_poll=server.adj.asyncore_use_poll,
            count=1,
        )


def _channels(server: Any) -> list[Any]:
    return [c for c in list(server._map.values()) if c is not server and c is not server.trigger]


def _flush(server: Any) -> None:
    """Keep the loop running until every answer already produced has been sent."""
    deadline = time.monotonic() + _FLUSH_S
    while time.monotonic() < deadline and any(
        getattr(c, "total_outbufs_len", 0) or getattr(c, "requests", None)
        for c in _channels(server)
    ):
        server.asyncore.loop(
            timeout=0.05, map=server._map, use_poll=server.adj.asyncore_use_poll, count=1
        )


def release_mounts(services: Services) -> None:
    """What holds mounts beyond the base dir's own table: the launch namespaces' clean copy. An
    executor serving as its own process loses it with the process; one embedded in another
    process (tests, a trainer) must let it go, or its view pins every directory it shows."""
    namespaces = services.workspaces.namespaces
    if namespaces is not None:
        namespaces.close()


def _shut_down(server: Any, services: Services, deadline: float) -> None:
    base_dir = services.settings.base_dir
    # Connections first: from here on no answer can leave, so nothing the kills below do to a
    # running grading can reach a client as a verdict. (Not ``server.close()``: that also closes
    # the trigger, whose fd number a worker thread still running would then write to.)
    server.asyncore.dispatcher.close(server)
    for channel in _channels(server):
        channel.close()
    services.sessions.close_all(keep_trees=True)  # removed below, in one sweep
    # Worker threads end once their grading notices its processes died; a grading between two
    # steps may start a new command after a sweep, so keep sweeping until the threads are gone.
    winding_down = threading.Thread(
        target=server.task_dispatcher.shutdown,
        kwargs={"cancel_pending": True, "timeout": _WIND_DOWN_S},
        daemon=True,
    )
    winding_down.start()
    killed = 0
    while winding_down.is_alive():
        killed += kill_owned(base_dir, grace=0.5)
        winding_down.join(0.2)
    if not server.task_dispatcher.threads:
        server.asyncore.close_all(server._map)  # the trigger, now that no thread can pull it
    release_mounts(services)
    # A few seconds whatever is left of the grace: enough for every tree at a small density.
    cleanup = clean_base_dir(base_dir, deadline=max(deadline, time.monotonic() + _TREES_MIN_S))
    if services.workspaces.groups is not None:
        services.workspaces.groups.remove_all()  # the workspaces' cgroups, emptied above
    log.info(
        "shut down: killed %d processes, unmounted %d, removed %d working trees",
        killed + cleanup.processes,
        cleanup.unmounted,
        cleanup.removed,
    )
