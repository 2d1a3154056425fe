"""Mount namespaces sandboxes are launched from: the host's mounts and one workspace's, no more.

bubblewrap copies the mount table of the namespace it starts in and reads it back after each
mount it makes. Started from the executor's own namespace, where every live workspace keeps its
tmpfs, overlay and runtime overlays, a launch grew slower with every session (84 ms at the first
tenth of 100 live sessions, 320 ms at the last; seconds at 1,000) and every sandbox's copy of the
table grew with it, in kernel memory.

So at start the executor makes a *clean* namespace (a private copy of its own, before any
workspace exists: the host, the host view, the runtime binds), and each workspace (or template
setup) gets a namespace of its own copied from the clean one, with one mount added: the
workspace's holder directory. In the executor's namespace the holder is bound on itself and made
shared, and that mount is cloned into the workspace's namespace, so every mount the executor
later makes below the holder (the tmpfs, the overlay, the runtime overlays; and their unmounts)
propagates into the workspace's namespace as well, and only those. Host-side work (the file API,
capture, snapshots) keeps using the executor's namespace, where everything is.

A launch forks from one long-lived thread of the executor that enters the workspace's namespace
for the fork (the child inherits it) and returns to the executor's namespace at once (see
``_Spawner``); every other thread stays in the executor's namespace.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import queue
import subprocess
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .mounts import (
    MS_PRIVATE,
    MS_SHARED,
    attach_mount,
    bind,
    clone_mount,
    set_propagation,
    unmount,
)

log = logging.getLogger(__name__)
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_CLONE_FS, _CLONE_NEWNS = 0x200, 0x20000
_T = TypeVar("_T")
_LIVENESS_CHECK_S = 5.0
"""How often a launch waiting on the spawner checks that its thread still runs."""


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _own_namespace() -> int:
    return os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)


def _in_new_thread(work: Callable[[], _T]) -> _T:
    """Run ``work`` on a thread of its own (it changes that thread's namespace; the thread ends
    with it)."""
    result: list[_T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            _check(_libc.unshare(_CLONE_FS), "unshare(CLONE_FS)")
            result.append(work())
        except BaseException as exc:  # handed to the caller
            error.append(exc)

    thread = threading.Thread(target=run, name="dockyard-mount-namespace")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


class MountNamespace:
    """One workspace's launch namespace, held open by an fd (closing it frees the namespace).

    It can be *released* while nothing runs in it (every shell of the session
    parked): the fd is closed, and the next launch makes the namespace again. A parked session
    then holds no fd at all, and every fd the executor holds is copied into (and closed again
    in) each child it forks: 7 ms a launch at 16,800 fds against 0.8 ms at a few."""

    def __init__(self, fd: int, remake: Callable[[], int]) -> None:
        self._fd = fd
        self._remake = remake
        self._closed = False
        self._lock = threading.Lock()  # close waits for a launch in progress

    @property
    def held(self) -> bool:
        """Whether the namespace is open now (not released, not closed)."""
        return self._fd >= 0

    def release(self) -> None:
        """Close the fd until the next launch (see the class)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def popen(self, argv: list[str], options: dict[str, Any]) -> subprocess.Popen[bytes]:
        """``subprocess.Popen(argv, **options)``, the child started in this namespace."""
        with self._lock:
            if self._closed:
                raise OSError(errno.ENOENT, "the workspace's mount namespace is closed")
            if self._fd < 0:
                self._fd = self._remake()
            return _spawner().popen(self._fd, argv, options)


class _Spawner:
    """The one thread that forks code under test into launch namespaces.

    setns needs a thread whose root and working directory no other thread shares, and a thread
    that made one shares its own with every thread it starts later; so launches do not enter
    namespaces on the calling threads (which start threads of their own: drainers, readers) but
    on this one, which starts none. It lives as long as the executor, which matters: bubblewrap's
    ``--die-with-parent`` is a parent-death signal, sent when the *thread* that forked it ends.
    """

    def __init__(self) -> None:
        self._home = _own_namespace()  # the executor's; kept for the process's life
        self._requests: queue.SimpleQueue[tuple[int, list[str], dict[str, Any], Future[Any]]]
        self._requests = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="dockyard-spawner", daemon=True)
        self._thread.start()

    def popen(self, fd: int, argv: list[str], options: dict[str, Any]) -> subprocess.Popen[bytes]:
        done: Future[subprocess.Popen[bytes]] = Future()
        self._requests.put((fd, argv, options, done))
        # No deadline (a fork on a loaded machine may take long, and a launch given up on would
        # leave its process running unowned), but never a wait on a thread that is gone.
        while True:
            try:
                return done.result(timeout=_LIVENESS_CHECK_S)
            except FutureTimeout:
                if not self._thread.is_alive() and not done.done():
                    raise RuntimeError("the sandbox spawner thread has stopped") from None

    def _serve(self) -> None:
        unshared = _libc.unshare(_CLONE_FS) == 0
        while True:
            fd, argv, options, done = self._requests.get()
            try:
                if not unshared:
                    raise OSError(errno.EINVAL, "the spawner could not unshare CLONE_FS")
                _check(_libc.setns(fd, _CLONE_NEWNS), "setns into the workspace's namespace")
                try:
                    done.set_result(subprocess.Popen(argv, **options))
                finally:
                    # Not needed for the next fork (it enters its own), but no thread of the
                    # executor should sit in a workspace's namespace.
                    if _libc.setns(self._home, _CLONE_NEWNS) != 0:
                        log.error("the spawner could not return to the executor's namespace")
            except BaseException as exc:  # the caller's to handle
                if not done.done():
                    done.set_exception(exc)


_the_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _spawner() -> _Spawner:
    global _the_spawner
    with _spawner_lock:
        if _the_spawner is None:
            _the_spawner = _Spawner()
        return _the_spawner


class LaunchNamespaces:
    """Makes the workspaces' launch namespaces (see the module). Build it after every mount the
    executor makes at start (host view, runtime binds): the clean namespace copies them then."""

    def __init__(self) -> None:
        self._clean = _in_new_thread(self._make_clean)

    def close(self) -> None:
        """Let the clean namespace go, at shutdown: its copies of the host view and runtime
        binds pin their mount points (nothing there can be removed, a directory hidden from
        code under test included) for as long as it lives, which is the process's life in an
        executor embedded in another process. No workspace can be made after this."""
        if self._clean >= 0:
            os.close(self._clean)
            self._clean = -1

    @staticmethod
    def _make_clean() -> int:
        _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        # Nothing the executor mounts later (workspaces) reaches the clean copy.
        set_propagation(Path("/"), MS_PRIVATE, recursive=True)
        return _own_namespace()

    def for_holder(self, holder: Path) -> MountNamespace:
        """A launch namespace showing what gets mounted below ``holder`` (an empty directory:
        it becomes a mount point, which the caller unmounts last when it is done).

        The namespace itself is made by the first launch (as after a release): a session
        whose shell starts later (``session_launch`` background) holds no fd until then."""
        bind(holder, holder)
        try:
            set_propagation(holder, MS_SHARED)
        except BaseException:
            unmount(holder)
            raise
        return MountNamespace(-1, remake=lambda: self._namespace_for(holder))

    def _namespace_for(self, holder: Path) -> int:
        """A new launch namespace showing ``holder`` (bound on itself and shared) with every
        mount below it now, and (as a peer) what is mounted there later."""
        if self._clean < 0:
            raise OSError(errno.ENOENT, "the launch namespaces are closed (shutting down)")
        tree = clone_mount(holder, recursive=True)
        try:
            return _in_new_thread(lambda: self._make_for(tree, holder))
        finally:
            os.close(tree)

    def _make_for(self, tree: int, holder: Path) -> int:
        _check(_libc.setns(self._clean, _CLONE_NEWNS), "setns into the clean namespace")
        _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        attach_mount(tree, holder)
        return _own_namespace()


@dataclass(frozen=True)
class Launcher:
    """How to start a command of code under test: the argv prefix, and the mount namespace to
    start it from (None: the executor's own)."""

    argv: tuple[str, ...] = ()
    namespace: MountNamespace | None = None
    confined: bool = False
    """Every process the command starts stays below the process ``popen`` returns (a new PID
    namespace whose init it starts): a sweep may look there instead of in all of /proc."""

    def popen(self, command: Sequence[str], **options: Any) -> subprocess.Popen[bytes]:
        if self.namespace is None:
            return subprocess.Popen([*self.argv, *command], **options)
        return self.namespace.popen([*self.argv, *command], options)


def as_launcher(launcher: Launcher | Sequence[str]) -> Launcher:
    return launcher if isinstance(launcher, Launcher) else Launcher(tuple(launcher))
