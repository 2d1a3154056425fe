"""Pods of the stand-in API that run as real local executor processes.

:class:`ExecutorPodRunner` is the stand-in's ``pod_runner`` hook: when a pod's simulated start is
over, the stand-in calls :meth:`~ExecutorPodRunner.start`, which launches
``python -m task_executor serve --host 127.0.0.1 --port 0 --base-dir <tmp>`` (plus
``image_args(image)``, e.g. ``--image REF --image-root DIR`` where the executor has them) and
returns the port it printed. The stand-in then reports the pod Ready at ``127.0.0.1`` with that
port in the ``dockyard.io/port`` annotation (a real cluster serves every pod on the configured
port; only the stand-in needs the annotation, because its pods share one address).
:meth:`~ExecutorPodRunner.stop` ends the process and removes its base directory; the stand-in
calls it on delete and keeps the pod (terminating) until it returns, as a kubelet does.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

PORT_ANNOTATION = "dockyard.io/port"
"""Stand-in only: the port a pod's executor listens on (on a cluster: the configured port)."""
_LISTENING = re.compile(r"listening on http://[^:]+:(\d+)")


class PodStartFailed(RuntimeError):
    """The pod's executor exited or never said where it listens."""


class ExecutorPodRunner:
    """Starts and stops one executor process per stand-in pod; thread-safe."""

    def __init__(self, image_args: Callable[[str], list[str]] | None = None,
                 env: dict[str, str] | None = None, start_timeout_s: float = 60.0,
                 stop_timeout_s: float = 20.0) -> None:
        self._image_args = image_args
        self._env = env
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._lock = threading.Lock()
        self._procs: dict[str, tuple[subprocess.Popen[str], str]] = {}
        self._readers: dict[str, threading.Thread] = {}
        self.started: list[str] = []
        """Names of every pod started, in order (tests count them)."""

    def start(self, name: str, body: dict[str, Any]) -> int:
        """Launch the executor of pod ``name`` and return its port (raises PodStartFailed)."""
        image = body["spec"]["containers"][0]["image"]
        base = tempfile.mkdtemp(prefix=f"dockyard-pod-{name}-")
        argv = [sys.executable, "-m", "task_executor", "serve", "--host", "127.0.0.1",
                "--port", "0", "--base-dir", base]
        if self._image_args is not None:
            argv += self._image_args(image)
        env = {**os.environ, **(self._env or {})}
        env.pop("API_TOKEN", None)  # the stand-in's pods answer without a token
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, env=env, start_new_session=True)
        with self._lock:
            self._procs[name] = (proc, base)
            self.started.append(name)
        port = self._read_port(proc)
        if port is None:
            self.stop(name)
            raise PodStartFailed(f"executor of pod {name} exited before listening")
        # Keep reading stdout so a chatty executor never blocks on a full pipe.
        reader = threading.Thread(target=_drain, args=(proc,), daemon=True)
        reader.start()
        with self._lock:
            self._readers[name] = reader
        return port

    def _read_port(self, proc: subprocess.Popen[str]) -> int | None:
        found: list[int] = []

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                match = _LISTENING.search(line)
                if match:
                    found.append(int(match.group(1)))
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(self._start_timeout_s)
        return found[0] if found else None

    def alive(self, name: str) -> bool:
        """Whether pod ``name``'s executor is still running (False once it exited or stopped)."""
        with self._lock:
            entry = self._procs.get(name)
        return entry is not None and entry[0].poll() is None

    def pid(self, name: str) -> int | None:
        with self._lock:
            entry = self._procs.get(name)
        return entry[0].pid if entry is not None else None

    def base_dir(self, name: str) -> str | None:
        with self._lock:
            entry = self._procs.get(name)
        return entry[1] if entry is not None else None

    def stop(self, name: str) -> None:
        """End pod ``name``'s executor (TERM, then KILL) and remove its base directory."""
        with self._lock:
            entry = self._procs.pop(name, None)
            reader = self._readers.pop(name, None)
        if entry is None:
            return
        proc, base = entry
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self._stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if reader is not None:
            reader.join(2.0)  # EOF follows the exit; then the pipe can be closed under no one
        if proc.stdout is not None and (reader is None or not reader.is_alive()):
            proc.stdout.close()
        shutil.rmtree(base, ignore_errors=True)

    def stop_all(self) -> None:
        with self._lock:
            names = list(self._procs)
        for name in names:
            self.stop(name)


def _drain(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    try:
        for _ in proc.stdout:
            pass
    except (OSError, ValueError):  # closed under us at stop: nothing left to read
        pass
