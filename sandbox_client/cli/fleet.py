"""``dockyard fleet``: executors on this machine (``up``), and the hook for cluster jobs (``reap``).

``fleet up`` starts N ``python -m task_executor serve`` subprocesses, each with its own base dir
and log file, waits until every one answers ``/health``, prints the ``DOCKYARD_SANDBOX_URLS=...``
line a trainer needs, and then supervises: Ctrl-C, SIGTERM or SIGHUP stops them all, and so does
the death of any one (a fleet silently short of a worker would rebuild that worker's templates
elsewhere). Stopping signals each executor's process group and every process descended from it,
waits, then kills what is left: no orphans. The workers share nothing of their work: each
keeps its mounts in a mount namespace of its own (every ``task-executor serve`` does), and
:func:`worker_environment` gives each one's sandboxes a uid of their own and hides the whole
fleet directory from every worker's code under test.

The base directory defaults to one that stays: ``$XDG_CACHE_HOME/dockyard/fleet`` (else
``~/.cache/dockyard/fleet``), so templates and mirrors survive from one run to the next and
nothing is left in a temporary directory. Run as root with a home the sandbox uid cannot pass
through (``/root`` is 0700, and bubblewrap resolves its binds as that uid: the sandbox would be
lost), it is ``/var/cache/dockyard/fleet``. Ports that are taken are refused before anything
starts, in one line (exit 2).
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from ..client import SandboxClient
from ..errors import TaskExecutorError

STOP_WITH_PARENT_VAR = "DOCKYARD_STOP_WITH_PARENT"
"""Tells ``task-executor serve`` the pid whose death must stop it (the executor's own name for
it is the same)."""

_LISTENING = re.compile(r"listening on (http://\S+)")
_IN_USE = "Address already in use"
ROOT_CACHE = Path("/var/cache/dockyard/fleet")
DEFAULT_SANDBOX_UID = 64000
"""The executor's own default (``DOCKYARD_SANDBOX_UID``): worker i's sandboxes get this + i."""
HOST_SHARE = 0.8
"""What all workspaces of one executor may use of the host by default (its DOCKYARD_HOST_SHARE):
a fleet of N on one host splits it, so N executors cannot together promise N x 80%."""


def default_base_dir(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """Where a fleet keeps its executors' directories between runs (see the module doc)."""
    environ = os.environ if environ is None else environ
    euid = os.geteuid() if euid is None else euid
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(
        environ.get("HOME") or os.path.expanduser("~"), ".cache"
    )
    chosen = Path(cache) / "dockyard" / "fleet"
    if euid == 0 and not _passable(chosen):
        return ROOT_CACHE
    return chosen


def _passable(path: Path) -> bool:
    """Every existing directory above ``path`` lets others through (o+x)."""
    for directory in path.parents:
        try:
            if not directory.stat().st_mode & 0o001:
                return False
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return True


def taken_ports(host: str, ports: list[int]) -> list[int]:
    """The ports of ``ports`` something already listens on at ``host``."""
    taken = []
    for port in ports:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # As waitress binds: SO_REUSEADDR, so a port in TIME_WAIT is not "taken".
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                taken.append(port)
    return taken


@dataclass
class Worker:
    """One executor subprocess."""

    index: int
    process: subprocess.Popen[bytes]
    log_path: Path
    url: str | None = None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def worker_environment(index: int, base_dir: Path, environ: Mapping[str, str],
                       workers: int = 1) -> dict[str, str]:
    """Worker ``index``'s environment: ``environ`` with a sandbox uid of its own, the whole
    fleet directory hidden from its code under test, and (unless set) a 1 / ``workers`` part of
    the host share all its workspaces together may use (each executor alone would take 80%).

    Co-hosted executors' sandboxes must share nothing: with one uid, root in one worker's
    sandbox would own the files of another's trees (a copy-mode workspace, a template) wherever
    it could reach them; and every worker's base dir sits in ``base_dir``, beside its own, where
    a host view would show them (the worker hides only its own base dir). Raises ValueError
    when ``DOCKYARD_SANDBOX_UID`` is not a number.
    """
    env = dict(environ)
    first_uid = int(env.get("DOCKYARD_SANDBOX_UID") or DEFAULT_SANDBOX_UID)
    env["DOCKYARD_SANDBOX_UID"] = str(first_uid + index)
    hidden = [path for path in env.get("DOCKYARD_HIDE_PATHS", "").split(":") if path]
    env["DOCKYARD_HIDE_PATHS"] = ":".join([*hidden, str(base_dir.resolve())])
    if not env.get("DOCKYARD_HOST_SHARE"):
        env["DOCKYARD_HOST_SHARE"] = f"{HOST_SHARE / max(1, workers):.4f}"
    return env


def start_worker(
    index: int, host: str, port: int, base_dir: Path, token: str | None, threads: int | None,
    workers: int = 1,
) -> Worker:
    env = worker_environment(index, base_dir, os.environ, workers)  # before anything is made
    work_dir = base_dir / f"worker-{index}"
    work_dir.mkdir(parents=True, exist_ok=True)
    log_path = base_dir / f"worker-{index}.log"
    command = [
        sys.executable,
        "-m",
        "task_executor",
        "serve",
        "--host",
        host,
        "--port",
        str(port),
        "--base-dir",
        str(work_dir),
    ]
    if threads:
        command += ["--threads", str(threads)]
    if token:
        env["API_TOKEN"] = token  # not on the command line, where `ps` would show it
    # The worker stops when this process dies, however it dies: a `fleet up` killed with SIGKILL
    # left its executors serving, orphaned.
    env[STOP_WITH_PARENT_VAR] = str(os.getpid())
    # A fresh log per run: the base dir stays between runs, and the URL is read from this log.
    with open(log_path, "wb") as log_file:
        # Own session: a terminal's Ctrl-C reaches only us, and we stop the workers in order.
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return Worker(index, process, log_path)



def wait_ready(
    workers: list[Worker], client: SandboxClient, timeout: float, stop: threading.Event
) -> Worker | None:
    """Wait until every worker printed its URL and answers /health, or ``stop`` is set; returns
    a worker that died (None otherwise). Raises TimeoutError past ``timeout``."""
    deadline = time.monotonic() + timeout
    pending = list(workers)
    while pending and not stop.is_set():
        for worker in list(pending):
            if worker.process.poll() is not None:
                return worker
            if worker.url is None:
                found = _LISTENING.search(worker.log_tail(200))
                worker.url = found.group(1) if found else None
            if worker.url is not None:
                try:
                    client.health(worker.url)  # any valid answer ("ok" or "degraded") is ready
                except TaskExecutorError:
                    continue
                pending.remove(worker)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} executors not ready after {timeout:.0f}s")
        if pending:
            time.sleep(0.1)
    return None


def process_tree() -> dict[int, list[int]]:
    """Parent pid -> child pids of every live process (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: fields start after the last ")".
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """Every live process descended from ``pid``; pass ``children`` (a ``process_tree()``) to
    reuse one /proc scan for several pids."""
    children = process_tree() if children is None else children
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def stop_workers(workers: list[Worker], grace: float = 10.0) -> None:
    """SIGTERM every worker's group and descendants, wait ``grace`` seconds, SIGKILL the rest."""
    targets: dict[int, list[int]] = {}
    tree = process_tree()  # one /proc scan for all workers, not one each
    for worker in workers:
        if worker.process.poll() is None:
            targets[worker.process.pid] = descendants(worker.process.pid, tree)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid, family in targets.items():
            _signal_group(pid, sig)
            for member in family:
                _signal(member, sig)
        deadline = time.monotonic() + wait
        for worker in workers:
            try:
                worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        if all(w.process.poll() is not None for w in workers) and not any(
            _alive(m) for family in targets.values() for m in family
        ):
            return


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)  # start_new_session made the worker its group's leader
    except (ProcessLookupError, PermissionError):
        pass


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def fleet_up(
    *,
    workers: int,
    base_port: int = 9090,
    host: str = "127.0.0.1",
    base_dir: Path | None = None,
    token: str | None = None,
    threads: int | None = None,
    startup_timeout: float = 60.0,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stop_event: threading.Event | None = None,
) -> int:
    """Run ``workers`` executors until a signal (or ``stop_event``); returns the exit status."""
    out, err = out or sys.stdout, err or sys.stderr
    base_dir = base_dir or default_base_dir()
    if base_port != 0:
        ports = [base_port + index for index in range(workers)]
        try:
            taken = taken_ports(host, ports)
        except OSError as exc:
            print(f"dockyard fleet: cannot bind {host}: {exc.strerror or exc}", file=err)
            return 2
        if taken:
            print(
                f"dockyard fleet: port{'s' if len(taken) > 1 else ''} "
                f"{', '.join(map(str, taken))} on {host} already in use (another fleet or "
                "executor?); stop it, or pick --base-port (0: any free ports)",
                file=err,
            )
            return 2
    stop = stop_event or threading.Event()
    previous = _install_stop_handlers(stop)
    started: list[Worker] = []
    try:
        for index in range(workers):
            # base_port 0: each executor picks its own port and prints it (no race on ports).
            port = 0 if base_port == 0 else base_port + index
            try:
                started.append(start_worker(index, host, port, base_dir, token, threads,
                                            workers))
            except OSError as exc:
                print(f"dockyard fleet: cannot start executor {index}: {exc}", file=err)
                return 1
            except ValueError as exc:  # DOCKYARD_SANDBOX_UID that is not a number
                print(f"dockyard fleet: DOCKYARD_SANDBOX_UID: {exc}", file=err)
                return 2
        probe_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        with SandboxClient(f"http://{probe_host}:1", token=token, timeout=(1.0, 3.0)) as probe:
            try:
                dead = wait_ready(started, probe, startup_timeout, stop)
            except TimeoutError as exc:
                print(f"dockyard fleet: {exc}; see the logs in {base_dir}", file=err)
                return 1
        if dead is not None:
            if _IN_USE in dead.log_tail(200):  # taken between our check and its bind
                print(f"dockyard fleet: executor {dead.index}'s port is already in use "
                      f"(see {dead.log_path}); pick --base-port", file=err)
                return 2
            print(
                f"dockyard fleet: executor {dead.index} exited with status "
                f"{dead.process.returncode}:\n{dead.log_tail()}",
                file=err,
            )
            return 1
        if stop.is_set():
            return 130
        # wait_ready returned with no death and no stop: every worker has its URL.
        urls = [str(w.url).replace("0.0.0.0", probe_host) for w in started]
        for worker, url in zip(started, urls, strict=True):
            print(
                f"# worker {worker.index}: pid {worker.process.pid} {url} log {worker.log_path}",
                file=out,
            )
        print(f"DOCKYARD_SANDBOX_URLS={','.join(urls)}", file=out, flush=True)
        while not stop.wait(0.5):
            for worker in started:
                if worker.process.poll() is not None:
                    print(
                        f"dockyard fleet: executor {worker.index} died (status "
                        f"{worker.process.returncode}); stopping the fleet:\n"
                        f"{worker.log_tail()}",
                        file=err,
                    )
                    return 1
        print("dockyard fleet: stopping", file=err)
        return 0
    finally:
        stop_workers(started)
        _restore_handlers(previous)


def _install_stop_handlers(stop: threading.Event) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}  # signals reach only the main thread; the caller stops us via stop_event

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    return {
        sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }


def _restore_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def fleet_reap(
    job_id: str,
    *,
    namespace: str | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """``dockyard fleet reap --job ID``: delete a job's executor pods via the [k8s] provisioner
    (``sandbox_client.provisioner.reap``, imported only here so the client never needs it)."""
    out, err = out or sys.stdout, err or sys.stderr
    kwargs = {"namespace": namespace} if namespace else {}
    try:
        from ..provisioner import reap

        outcome = reap(job_id, **kwargs)
    except ImportError as exc:
        # The provisioner imports the kubernetes client lazily, so this may come from inside reap.
        if (exc.name or "").split(".")[0] in ("kubernetes", "yaml"):
            print(
                "dockyard fleet reap needs the Kubernetes client: pip install 'dockyard[k8s]'",
                file=err,
            )
        else:
            print(f"dockyard fleet reap is not available in this build ({exc})", file=err)
        return 2
    except Exception as exc:  # cluster config, auth and API failures: one line, not a traceback
        print(f"dockyard fleet reap: {type(exc).__name__}: {exc}", file=err)
        return 1
    deleted, left = outcome.deleted, outcome.left
    print(f"dockyard fleet reap: job {job_id}: {deleted} pods deleted, {left} left", file=out)
    return 1 if left else 0
