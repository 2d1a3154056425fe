"""SWE-ReX's runtime and deployment over a Dockyard session (swe-rex 1.4.0), so SWE-agent runs
on Dockyard with ``SWEEnv(deployment=DockyardDeployment(task={...}), ...)``.

Checked against ``swerex/runtime/abstract.py``, ``swerex/runtime/local.py`` and
``swerex/deployment/abstract.py`` of 1.4.0. The mapping:

- a SWE-ReX session (``create_session``/``run_in_session``/``close_session``) is a named shell of
  the one Dockyard session (``rex.<name>``); its state (cwd, variables, functions) persists;
- ``execute(Command)`` is a stateless exec (a subshell: ``cwd``, ``env`` for this call only,
  stdout and stderr separate unless ``merge_output_streams``) in the session's default shell;
- ``BashInterruptAction`` is the interrupt route (SIGINT, then SIGKILL, to the running command;
  the shell survives);
- ``read_file``/``write_file``/``upload`` are the file routes and the tar upload (file modes
  kept), anywhere the sandbox may write;
- errors are SWE-ReX's own classes: ``SessionExistsError``, ``SessionDoesNotExistError``,
  ``BashIncorrectSyntaxError`` (from the structured ``not_run``), ``CommandTimeoutError``,
  ``NonZeroExitCodeError``, ``NoExitCodeError``, ``FileNotFoundError``.

Not supported (the README lists them): interactive programs (``is_interactive_command`` /
``is_interactive_quit``: Dockyard shells have no terminal to drive a REPL through), and a command
left running after a timeout (Dockyard kills the process group at the timeout, so the interrupt
that SWE-ReX needs afterwards finds nothing to stop). ``Command.env`` is added to the session's
environment, not a replacement for it as ``subprocess.run(env=)`` would make it.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import re
import shlex
import tarfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from pydantic import BaseModel, Field
from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    DeploymentNotStartedError,
    NoExitCodeError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (
    AbstractRuntime,
    Action,
    BashAction,
    BashInterruptAction,
    BashObservation,
    CloseBashSessionResponse,
    CloseResponse,
    CloseSessionRequest,
    CloseSessionResponse,
    Command,
    CommandResponse,
    CreateBashSessionResponse,
    CreateSessionRequest,
    CreateSessionResponse,
    IsAliveResponse,
    Observation,
    ReadFileRequest,
    ReadFileResponse,
    UploadRequest,
    UploadResponse,
    WriteFileRequest,
    WriteFileResponse,
)

from ..client import SandboxClient
from ..errors import ExecutorRejected, TaskExecutorError
from ..protocol import ExecResult
from ..session import RemoteSession
from .sessions import OpenedSession, open_session

T = TypeVar("T")

_SHELL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,60}$")
#: The Dockyard shell that ``execute`` runs its subshells in.
EXECUTE_SHELL = "default"


def shell_name(session: str) -> str:
    """The Dockyard shell that stands for SWE-ReX session ``session``: ``rex.<name>``, or a
    digest of a name the shell pattern does not allow."""
    if _SHELL_NAME.match(session):
        return f"rex.{session}"
    return "rex." + hashlib.sha256(session.encode()).hexdigest()[:32]


def command_line(command: str | Sequence[str], shell: bool) -> str:
    """``Command.command`` as bash source, with ``subprocess.run``'s meaning: a list is argv;
    a string is a shell line with ``shell=True``, else the program's name."""
    if isinstance(command, str):
        return command if shell else shlex.quote(command)
    return shlex.join(command)


class DockyardRuntime(AbstractRuntime):
    """``AbstractRuntime`` over one Dockyard session; every blocking call runs in a thread, so
    ``asyncio.gather`` over several shells runs them side by side."""

    def __init__(self, *, session: RemoteSession, on_close: Callable[[], None] | None = None,
                 logger: logging.Logger | None = None) -> None:
        self.session = session
        self.logger = logger or logging.getLogger(__name__)
        self._on_close = on_close
        self._shells: dict[str, str] = {}
        # One exec at a time per Dockyard shell: concurrent `execute` calls queue here.
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        try:
            state = await asyncio.to_thread(self.session.state)
        except TaskExecutorError as exc:
            return IsAliveResponse(is_alive=False, message=str(exc))
        return IsAliveResponse(is_alive=state.alive, message="" if state.alive else "shell dead")

    async def create_session(self, request: CreateSessionRequest) -> CreateSessionResponse:
        if request.session in self._shells:
            raise SessionExistsError(f"session {request.session} already exists")
        shell = shell_name(request.session)
        sources = [f"source {shlex.quote(path)}" for path in request.startup_source]
        result = await self._exec(" && ".join(sources) or ":", shell=shell,
                                  timeout=request.startup_timeout if sources else None)
        self._shells[request.session] = shell
        return CreateBashSessionResponse(output=result.output)

    async def run_in_session(self, action: Action) -> Observation:
        shell = self._shells.get(action.session)
        if shell is None:
            raise SessionDoesNotExistError(f"session {action.session!r} does not exist")
        if isinstance(action, BashInterruptAction):
            await asyncio.to_thread(self.session.interrupt, shell)
            return BashObservation(output="", exit_code=0)
        if action.is_interactive_command or action.is_interactive_quit:
            raise NotImplementedError(
                "interactive commands are not supported: Dockyard shells have no terminal"
            )
        result = await self._exec(action.command, shell=shell, timeout=action.timeout)
        return _observation(action, result)

    async def close_session(self, request: CloseSessionRequest) -> CloseSessionResponse:
        shell = self._shells.pop(request.session, None)
        if shell is None:
            raise SessionDoesNotExistError(f"session {request.session!r} does not exist")
        await asyncio.to_thread(self.session.close_shell, shell)
        return CloseBashSessionResponse()

    async def execute(self, command: Command) -> CommandResponse:
        line = command_line(command.command, command.shell)
        result = await self._exec(
            line, shell=EXECUTE_SHELL, timeout=command.timeout, cwd=command.cwd,
            env=command.env or None, stateless=True,
            stderr="merged" if command.merge_output_streams else "separate",
        )
        if result.timed_out:
            raise CommandTimeoutError(
                f"Timeout ({command.timeout}s) exceeded while running command"
            )
        response = CommandResponse(stdout=result.output, stderr=result.stderr or "",
                                   exit_code=result.exit_code)
        if command.check and result.exit_code != 0:
            message = (f"Command {command.command!r} failed with exit code {result.exit_code}. "
                       f"Stdout:\n{response.stdout!r}\nStderr:\n{response.stderr!r}")
            raise NonZeroExitCodeError(f"{command.error_msg}: {message}" if command.error_msg
                                       else message)
        return response

    async def read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        data = await asyncio.to_thread(_not_found_as_oserror, self.session.read_file,
                                       request.path)
        return ReadFileResponse(content=data.decode(request.encoding or "utf-8",
                                                    request.errors or "strict"))

    async def write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        data = request.content.encode()
        try:
            await asyncio.to_thread(self.session.write_file, request.path, data)
        except ExecutorRejected as exc:
            if exc.status != 404:
                raise
            # SWE-ReX makes missing parent directories; the file route does not.
            parent = str(PurePosixPath(request.path).parent)
            await self._exec(f"mkdir -p -- {shlex.quote(parent)}", shell=EXECUTE_SHELL,
                             timeout=None, stateless=True)
            await asyncio.to_thread(self.session.write_file, request.path, data)
        return WriteFileResponse()

    async def upload(self, request: UploadRequest) -> UploadResponse:
        source, target = Path(request.source_path), PurePosixPath(request.target_path)
        if source.is_dir():  # the session tars a directory itself, modes kept
            await asyncio.to_thread(self.session.upload, source, str(target))
        else:
            archive = _tar_of_file(source, target.name)
            await asyncio.to_thread(self.session.upload, archive, str(target.parent))
        return UploadResponse()

    async def close(self) -> CloseResponse:
        self._shells.clear()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            await asyncio.to_thread(on_close)
        return CloseResponse()

    async def _exec(self, command: str, *, shell: str, timeout: float | None,
                    **fields: Any) -> ExecResult:
        def run() -> ExecResult:
            with self._lock(shell):
                return self.session.exec(command, timeout, shell=shell, **fields)

        return await asyncio.to_thread(run)

    def _lock(self, shell: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(shell, threading.Lock())


def _observation(action: BashAction, result: ExecResult) -> BashObservation:
    """SWE-ReX's observation (or exception) for one exec in a shell."""
    if result.not_run == "syntax_error":
        stderr = result.syntax_error or result.output
        raise BashIncorrectSyntaxError(
            f"Error while checking bash command \n{action.command!r}\n---- Stderr ----\n{stderr}",
            extra_info={"bash_stdout": "", "bash_stderr": stderr},
        )
    if result.timed_out:
        raise CommandTimeoutError(
            f"timeout after {action.timeout} seconds while running command {action.command!r}"
        )
    exit_code = None if action.check == "ignore" else result.exit_code
    if action.check == "raise":
        if result.exit_code is None:
            raise NoExitCodeError(result.error or "the command's exit status was lost")
        if result.exit_code != 0:
            message = (f"Command {action.command!r} failed with exit code {result.exit_code}. "
                       f"Here is the output:\n{result.output!r}")
            raise NonZeroExitCodeError(f"{action.error_msg}: {message}" if action.error_msg
                                       else message)
    return BashObservation(output=result.output, exit_code=exit_code)


def _not_found_as_oserror(read: Callable[[str], bytes], path: str) -> bytes:
    try:
        return read(path)
    except ExecutorRejected as exc:
        if exc.status == 404 and exc.code == "file_not_found":
            raise FileNotFoundError(path) from exc
        raise


def _tar_of_bytes(name: str, data: bytes, mode: int = 0o644) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        member = tarfile.TarInfo(name)
        member.size, member.mode = len(data), mode
        archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def _tar_of_file(source: Path, name: str) -> bytes:
    return _tar_of_bytes(name, source.read_bytes(), source.stat().st_mode & 0o7777)



class DockyardDeploymentConfig(BaseModel):
    """What ``DockyardDeployment(**kwargs)`` accepts."""

    task: dict[str, Any] = {}
    """``SessionStartSpec`` fields (repo, base_commit, setup, image, ...) of the session."""
    urls: list[str] | str | None = None
    """Executor URLs (None: ``DOCKYARD_SANDBOX_URLS``)."""
    token: str | None = Field(default=None, exclude=True)
    """API token; never dumped."""


class DockyardDeployment(AbstractDeployment):
    """``AbstractDeployment`` whose ``start`` opens a Dockyard session and ``stop`` closes it."""

    def __init__(self, *, logger: logging.Logger | None = None,
                 session: RemoteSession | None = None, client: SandboxClient | None = None,
                 **kwargs: Any) -> None:
        self._config = DockyardDeploymentConfig(**kwargs)
        self._session, self._client = session, client
        self._runtime: DockyardRuntime | None = None
        self.logger = logger or logging.getLogger(__name__)
        self._hooks = CombinedDeploymentHook()

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    @property
    def runtime(self) -> DockyardRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        return await self.runtime.is_alive(timeout=timeout)

    async def start(self, *args: Any, **kwargs: Any) -> None:
        self._hooks.on_custom_step("Starting Dockyard session")
        opened: OpenedSession = await asyncio.to_thread(
            open_session, self._config.task, session=self._session, client=self._client,
            urls=self._config.urls, token=self._config.token,
        )
        self._runtime = DockyardRuntime(session=opened.session, on_close=opened.close,
                                        logger=self.logger)

    async def stop(self, *args: Any, **kwargs: Any) -> None:
        if self._runtime is not None:
            await self._runtime.close()
            self._runtime = None

