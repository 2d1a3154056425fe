"""``RemoteSession``: a multi-turn shell session pinned to the executor that started it.

Every call goes to the owning executor (a session lives in one executor's memory, so failing over
would only find "no such session"). Only ``finish`` is sent again after a lost reply, with its
own ``Idempotency-Key``, which the executor answers from its store; ``exec`` is never replayed.
Sessions come from ``SandboxClient.start_session``, or from ``fork()`` of another session (on the
same executor: the fork is made from its workspace).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tarfile
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal, Protocol, TypeVar
from urllib.parse import quote

import pydantic

from .config import ClientConfig
from .errors import (
    ExecutorRejected,
    ExecutorUnreachable,
    ProtocolError,
    ReplyLost,
    TaskExecutorError,
    parse_spec,
)
from .protocol import (
    IDEMPOTENCY_HEADER,
    ExecRequest,
    ExecResult,
    FileWriteResult,
    FinishResult,
    FinishSpec,
    ForkRequest,
    InterruptRequest,
    InterruptResult,
    SessionStartResult,
    SessionState,
    SnapshotInfo,
    SnapshotRequest,
    UploadResult,
)

log = logging.getLogger(__name__)

M = TypeVar("M", bound=pydantic.BaseModel)


class SessionTransport(Protocol):
    """What a session needs of the client that started it (``SandboxClient`` is one): its config
    and one call on one executor. Typed here, so this module never imports the client."""

    config: ClientConfig

    def _call(
        self, url: str, method: str, path: str, model: type[M] | None, *,
        read_timeout: float, **send: Any
    ) -> Any: ...


class RemoteSession:
    """A shell session pinned to the executor that started it. ``with`` closes it on exit
    (unless it was finished, which closes it server-side)."""

    def __init__(
        self,
        client: SessionTransport,
        url: str,
        started: SessionStartResult,
        *,
        command_timeout: float | None = None,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        #: Called once when the session ends here (finished or closed): an image pool's lease.
        self._on_end = on_end
        #: Base URL of the executor that owns this session; every call goes there.
        self.url = url
        self.session_id = started.session_id
        self.workdir = started.workdir
        self.base_commit = started.base_commit
        #: Whether the executor reused the session's template (False: this start built it).
        self.template_hit = started.template_hit
        self._command_timeout = command_timeout
        self._path = f"/session/{quote(self.session_id, safe='')}"
        self.finished = False
        self.closed = False

    def __repr__(self) -> str:
        return f"RemoteSession({self.session_id!r} on {self.url})"

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.close()
        except TaskExecutorError as error:
            # Never mask the body's own exception; an unclosed session is reaped when idle.
            log.warning("session %s: close failed: %s", self.session_id, error)

    def exec(
        self,
        command: str,
        timeout: float | None = None,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stateless: bool = False,
        shell: str = "default",
        stderr: Literal["merged", "separate"] = "merged",
    ) -> ExecResult:
        """Run one command in one of the session's shells; never replayed after a lost reply.

        ``cwd``/``env``/``stateless``: run it in a subshell (nothing it changes persists);
        ``shell``: a named shell (started on first use); ``stderr="separate"``: stderr in the
        result's ``stderr`` field, apart from ``output``."""
        request = parse_spec(ExecRequest, {
            "command": command, "timeout": timeout, "cwd": cwd, "env": env,
            "stateless": stateless, "shell": shell, "stderr": stderr,
        })
        # Only what differs from the defaults: an older executor accepts the call unchanged.
        body = request.model_dump(exclude_defaults=True)  # the command has no default: kept
        read = self.client.config.run_read_timeout(timeout or self._command_timeout)
        return self._call("POST", "/exec", ExecResult, read, json=body)

    def interrupt(self, shell: str = "default") -> bool:
        """SIGINT the command running in ``shell`` (SIGKILL after a short grace); the shell
        and its state stay. False when nothing was running."""
        body = parse_spec(InterruptRequest, {"shell": shell}).model_dump()
        answer = self._call("POST", "/interrupt", InterruptResult, self._short, json=body)
        return bool(answer.interrupted)

    def close_shell(self, name: str) -> None:
        """Close the named shell ``name`` (not "default") and everything it runs."""
        self._call("DELETE", f"/shell/{quote(name, safe='')}", None, self._short)

    def upload(self, source: str | os.PathLike[str] | bytes, remote_dir: str) -> UploadResult:
        """Put a local directory (or a tar archive's bytes) into ``remote_dir`` inside the
        sandbox, file modes kept."""
        if isinstance(source, bytes):
            data = source
        else:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as archive:
                archive.add(os.fspath(source), arcname=".")
            data = buffer.getvalue()
        return self._call(
            "POST", "/upload", UploadResult, self.client.config.run_read_timeout(None),
            params={"path": remote_dir}, data=data,
            headers={"Content-Type": "application/x-tar"},
        )

    def read_file(self, path: str) -> bytes:
        """The file's bytes, exactly (checked against the executor's SHA-256 header);
        ``path`` is relative to the tree, or absolute anywhere in the sandbox."""
        response = self._call("GET", "/file", None, self._short, params={"path": path})
        return response.content

    def write_file(self, path: str, data: bytes) -> FileWriteResult:
        """Write ``data`` to ``path`` (relative to the tree, or absolute anywhere the sandbox
        may write), byte for byte."""
        written = self._call(
            "PUT",
            "/file",
            FileWriteResult,
            self._short,
            params={"path": path},
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        expected = hashlib.sha256(data).hexdigest()
        if written.sha256 != expected or written.size != len(data):
            raise ProtocolError(
                f"PUT {path}: executor stored {written.size} bytes sha256 {written.sha256}, "
                f"sent {len(data)} bytes sha256 {expected}",
                url=self.url,
            )
        return written

    def reset(self) -> None:
        """Back to the base state: fresh workspace, fresh shell."""
        self._call("POST", "/reset", None, self._short + self.client.config.timeout_margin)

    def state(self) -> SessionState:
        """Liveness, cwd, age, idle time and commands run."""
        return self._call("GET", "", SessionState, self._short)

    def finish(self, spec: FinishSpec | None = None, **fields: Any) -> FinishResult:
        """Capture the agent's diff and grade it; the executor closes the session.

        ``patch=`` grades that patch (the agent's submission) instead of the tree's diff;
        ``exclude_paths=[...]`` leaves paths (fnmatch globs) out of the captured diff.

        The call carries an ``Idempotency-Key`` of its own: after a lost reply it is sent again
        with it, and the executor answers the verdict it made (or still makes) for it.
        """
        if spec is not None and fields:  # a spec plus fields of this call (patch=...)
            spec_or_fields: Any = {**spec.model_dump(exclude_unset=True), **fields}
        else:
            spec_or_fields = spec if spec is not None else fields
        finish = parse_spec(FinishSpec, spec_or_fields)
        finish = self.client.config.with_task_timeout(finish)
        read = self.client.config.run_read_timeout(finish.timeout)
        body = finish.model_dump(mode="json", exclude_none=True)
        if not body.get("exclude_paths"):
            body.pop("exclude_paths", None)  # an older executor refuses fields it lacks
        headers = {IDEMPOTENCY_HEADER: uuid.uuid4().hex}
        lost: ReplyLost | None = None
        for attempt in range(self.client.config.resubmits + 1):
            try:
                result = self._call("POST", "/finish", FinishResult, read, json=body,
                                    headers=headers, poll_in_progress=True)
                break
            except ReplyLost as exc:
                lost = exc
                log.warning("session %s: finish reply lost (%s); retry %d of %d", self.session_id,
                            exc.message, attempt + 1, self.client.config.resubmits)
            except ExecutorUnreachable:
                if lost is None:
                    raise
                raise lost from None  # the executor, and the session with it, is gone
        else:
            assert lost is not None
            raise lost
        self.finished = True
        self._ended()
        log.info(
            "session %s: finished %s in %.1fs",
            self.session_id,
            result.result.status,
            result.result.duration_s,
        )
        return result

    def snapshot(self, name: str | None = None) -> SnapshotInfo:
        """Keep a named read-only capture of the workspace (default name ``snap-N``) to
        ``fork`` from later; the session goes on unchanged."""
        body = parse_spec(SnapshotRequest, {"name": name}).model_dump(exclude_none=True)
        read = self.client.config.run_read_timeout(None)  # a copy of the tree, in some modes
        return self._call("POST", "/snapshot", SnapshotInfo, read, json=body)

    def fork(self, snapshot: str | None = None) -> RemoteSession:
        """A new session on the same executor from this one's current tree (or a snapshot
        taken with ``snapshot()``), with its cwd and exported environment; this one is not
        touched. Close the fork like any session."""
        body = parse_spec(ForkRequest, {"snapshot": snapshot}).model_dump(exclude_none=True)
        read = self.client.config.run_read_timeout(None)
        started = self._call("POST", "/fork", SessionStartResult, read, json=body)
        log.info("session %s: forked from %s on %s", started.session_id, self.session_id, self.url)
        return self.client._held_session(self.url, started, self._command_timeout)

    def close(self) -> None:
        """Close without grading (``DELETE``). Idempotent; a no-op after ``finish``."""
        if self.finished or self.closed:
            return
        try:
            self._call("DELETE", "", None, self._short)
        except ExecutorRejected as exc:
            if exc.status != 404:
                raise
        self.closed = True
        self._ended()

    def _ended(self) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end()

    @property
    def _short(self) -> float:
        return self.client.config.read_timeout

    def _call(
        self, method: str, suffix: str, model: type[M] | None, read: float, **send: Any
    ) -> Any:
        return self.client._call(
            self.url, method, self._path + suffix, model, read_timeout=read, **send
        )
