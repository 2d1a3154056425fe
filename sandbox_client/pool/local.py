"""The local provider: an executor process on this machine per pod, an image being a directory.

An image is an unpacked root filesystem (what ``docker export <container> | tar -x`` or an OCI
unpacker such as ``umoci unpack`` produces), found under the provider's image directory by its
reference: ``image_root(images_dir, ref)`` is ``images_dir / quote(ref)``, the reference with
every character but letters, digits and ``-_.@+:`` percent-encoded (``/`` becomes ``%2F``), so
``swebench/sweb.eval.x86_64.django__django-11099:latest`` lives in
``swebench%2Fsweb.eval.x86_64.django__django-11099:latest``. A reference with no directory is
``ImageNotFound``: never a fallback to the host's root.

Each pod is ``python -m task_executor serve --image REF --image-root DIR`` on 127.0.0.1, port 0,
with a base directory of its own under ``work_dir``; ``delete`` stops it (SIGTERM, then SIGKILL
after a grace) and removes that directory: no process, mount (the executor keeps its mounts in
a namespace of its own) or file is left.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from .provider import ImageNotFound, PodStatus, PoolKey, ProviderError

log = logging.getLogger(__name__)

SAFE = "-_.@+:"


def image_root(images_dir: Path, ref: str) -> Path:
    """Where the unpacked root filesystem of ``ref`` lives under ``images_dir``."""
    if not ref or ref in (".", "..") or any(ord(c) < 32 or c.isspace() for c in ref):
        raise ImageNotFound(f"not an image reference: {ref!r}")
    return images_dir / quote(ref, safe=SAFE)


_READER_JOIN_S = 2.0
"""How long ``delete`` lets the reader reach the end of a stopped executor's output (a process it
left may keep the pipe open: then the stream is closed under the reader)."""


@dataclass
class _Process:
    proc: subprocess.Popen[str]
    base: Path
    url: str | None = None
    output: list[str] = field(default_factory=list)
    reported: bool = False
    reader: threading.Thread | None = None


class LocalProvider:
    """Executor processes on this machine, one per pod (see the module docstring)."""

    def __init__(self, images_dir: Path | str, work_dir: Path | str, *,
                 env: Mapping[str, str] | None = None, python: str = sys.executable,
                 extra_args: Sequence[str] = (), stop_grace_s: float = 60.0,
                 first_uid: int = 64100) -> None:
        self.images_dir = Path(images_dir)
        self.work_dir = Path(work_dir)
        self.env = dict(env or {})
        self.python = python
        self.extra_args = tuple(extra_args)
        self.stop_grace_s = stop_grace_s
        self.first_uid = first_uid
        self._uids = itertools.count()
        self._lock = threading.Lock()
        self._pods: dict[str, _Process] = {}

    def create(self, key: PoolKey, name: str) -> None:
        root = image_root(self.images_dir, key.image)
        if not root.is_dir():
            raise ImageNotFound(f"no image {key.image!r}: {root} is not an unpacked root "
                                f"filesystem directory")
        base = self.work_dir / name
        base.mkdir(parents=True, exist_ok=False)
        env = {**os.environ, **self.env}
        env.pop("API_TOKEN", None)
        # Executors on one host each get a sandbox uid of their own (as `fleet up` gives).
        env.setdefault("DOCKYARD_SANDBOX_UID", str(self.first_uid + next(self._uids)))
        env.setdefault("DOCKYARD_DENY_NETWORK", "0" if key.egress else "1")
        if key.workspace:
            env["DOCKYARD_WORKSPACE_MODE"] = key.workspace
        if key.memory:
            env["DOCKYARD_MEMORY_LIMIT_BYTES"] = key.memory
        try:
            proc = subprocess.Popen(
                [self.python, "-m", "task_executor", "serve", "--host", "127.0.0.1", "--port",
                 "0", "--base-dir", str(base), "--image", key.image, "--image-root", str(root),
                 *self.extra_args],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        except OSError as exc:
            shutil.rmtree(base, ignore_errors=True)
            raise ProviderError(f"could not start an executor for {key.image}: {exc}") from exc
        pod = _Process(proc, base)
        with self._lock:
            self._pods[name] = pod
        pod.reader = threading.Thread(target=self._read, args=(pod,), daemon=True,
                                      name=f"dockyard-local-{name}")
        pod.reader.start()

    def _read(self, pod: _Process) -> None:
        """The first line names the URL; the rest is kept (a tail) for a failure's reason."""
        assert pod.proc.stdout is not None
        try:
            for line in pod.proc.stdout:
                if pod.url is None and "listening on http://" in line:
                    pod.url = line.strip().rsplit(" ", 1)[1]
                pod.output = [*pod.output[-19:], line.rstrip()]
        except (ValueError, OSError):
            # ``delete`` closed the stream under this thread: the pod is gone (a test run
            # failed on the ValueError this raised in a thread of its own).
            return

    def status(self, name: str) -> PodStatus:
        with self._lock:
            pod = self._pods.get(name)
        if pod is None:
            return PodStatus(name, "gone")
        code = pod.proc.poll()
        if code is not None:
            tail = " | ".join(line for line in pod.output[-3:] if line)
            if not pod.reported:
                pod.reported = True
                log.warning("pod %s: its executor exited %s; its last words:\n%s", name, code,
                            "\n".join(pod.output))
            return PodStatus(name, "failed", reason=f"executor exited {code}: {tail}")
        if pod.url is None:
            return PodStatus(name, "creating")
        return PodStatus(name, "ready", url=pod.url)

    def delete(self, name: str) -> None:
        with self._lock:
            pod = self._pods.get(name)
        if pod is None:
            return
        if pod.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                pod.proc.send_signal(signal.SIGTERM)
            try:
                pod.proc.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait()
        if pod.reader is not None:  # its last words read to the end, where they come
            pod.reader.join(_READER_JOIN_S)
        if pod.proc.stdout is not None:
            pod.proc.stdout.close()
        if pod.proc.returncode != 0:
            _remove_leftover_groups(pod.base)
        # A SIGKILLed executor's mounts went with its private mount namespace; a next one on
        # this base dir would clean what else it left, and there is none: remove it all.
        shutil.rmtree(pod.base, ignore_errors=True)
        if pod.base.exists():
            raise ProviderError(f"could not remove {pod.base}")
        with self._lock:
            self._pods.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._pods)

    def close(self) -> None:
        for name in self.names():
            self.delete(name)


def _remove_leftover_groups(base: Path) -> None:
    """An executor killed (not stopped) leaves its workspaces' cgroups; they are named by its
    base directory, which no executor will take over again here."""
    from task_executor.grading.grader import owner_token
    from task_executor.sandbox.cgroups import remove_executor_groups

    remove_executor_groups(owner_token(base))
