"""A mini-swe-agent ``Environment`` backed by a Dockyard session (mini-swe-agent 2.4.6).

Checked against ``minisweagent/__init__.py`` (the ``Environment`` protocol: ``config``,
``execute(action, cwd="")``, ``get_template_vars(**kwargs)``, ``serialize()``) and
``minisweagent/environments/local.py`` / ``docker.py`` of 2.4.6: ``execute(action: dict, cwd="",
*, timeout=None)`` takes ``{"command": ...}`` and returns ``{"output", "returncode",
"exception_info"}`` (plus ``extra`` on an exception: a timeout is returncode -1 with
``exception_type`` ``TimeoutExpired``, as LocalEnvironment reports it); an output whose first line
is ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` with status 0 raises ``Submitted`` carrying the rest
as the submission. Every command runs stateless (``cd``/``export`` do not persist), as in mini's
own environments, each of which runs a fresh ``bash -c``.

Differences from ``LocalEnvironment``, on purpose: the host's environment is never passed in
(secrets, the executor's token); name variables in ``env``, or in ``forward_env`` as
``DockerEnvironment`` does. The default ``cwd`` is the session's working tree. A failure to reach
the executor is not shown to the model as output: it raises ``TaskExecutorError`` (mini's agent
records the exit status and re-raises), because a rollout without a sandbox has no verdict.

Grading: ``finish(test_patch=..., fail_to_pass=..., pass_to_pass=...)`` grades the submission
(the patch the agent printed after the marker) when there is one, else the tree's diff, leaving
out ``exclude_paths`` (mini's ``patch.txt`` by default).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from typing import Any

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel, Field

from ..client import SandboxClient
from ..protocol import ExecResult, FinishResult, FinishSpec
from ..session import RemoteSession
from .sessions import open_session

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class DockyardEnvironmentConfig(BaseModel):
    """What ``DockyardEnvironment(**kwargs)`` accepts (mini builds environments from YAML)."""

    cwd: str = ""
    """Directory for commands ("" = the session's working tree); ``execute(cwd=)`` overrides."""
    env: dict[str, str] = {}
    """Variables set for every command."""
    forward_env: list[str] = []
    """Names of this process's variables to pass in when set (``env`` wins on a clash)."""
    timeout: int = 30
    """Seconds per command."""
    task: dict[str, Any] = {}
    """``SessionStartSpec`` fields (repo, base_commit, setup, env, image, ...) to start the
    session with, when no session is given."""
    urls: list[str] | str | None = None
    """Executor URLs for the client this environment makes (None: ``DOCKYARD_SANDBOX_URLS``)."""
    token: str | None = Field(default=None, exclude=True)
    """API token for that client; never serialized into trajectories or templates."""
    exclude_paths: list[str] = ["patch.txt"]
    """Paths left out of the graded diff when the tree's diff is graded."""


class DockyardEnvironment:
    """mini-swe-agent's Environment protocol over one Dockyard session."""

    def __init__(
        self,
        *,
        config_class: type[DockyardEnvironmentConfig] = DockyardEnvironmentConfig,
        session: RemoteSession | None = None,
        client: SandboxClient | None = None,
        **kwargs: Any,
    ) -> None:
        self.config = config_class(**kwargs)
        self._opened = open_session(self.config.task, session=session, client=client,
                                    urls=self.config.urls, token=self.config.token)
        self.session = self._opened.session
        #: The patch the agent submitted (None until it submits).
        self.submission: str | None = None

    def execute(
        self, action: Mapping[str, Any] | str, cwd: str = "", *, timeout: int | None = None
    ) -> dict[str, Any]:
        """Run ``action["command"]`` (a bare string is accepted too, as mini 1.x passed it)."""
        command = action if isinstance(action, str) else str(action.get("command", ""))
        limit = timeout or self.config.timeout
        result = self.session.exec(command, limit, cwd=cwd or self.config.cwd or None,
                                   env=self._env() or None, stateless=True)
        output = _output(command, limit, result)
        self._check_finished(output)
        return output

    def _env(self) -> dict[str, str]:
        forwarded = {k: v for k in self.config.forward_env if (v := os.environ.get(k)) is not None}
        return forwarded | self.config.env

    def _check_finished(self, output: dict[str, Any]) -> None:
        """Raises ``Submitted`` when the output starts with the marker and the command
        succeeded (mini's rule, same message shape)."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            self.submission = submission
            raise Submitted({
                "role": "exit",
                "content": submission,
                "extra": {"exit_status": "Submitted", "submission": submission},
            })

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        session = {"workdir": self.session.workdir, "session_id": self.session.session_id,
                   "base_commit": self.session.base_commit}
        return recursive_merge(self.config.model_dump(), platform.uname()._asdict(), session,
                               kwargs)

    def serialize(self) -> dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                }
            }
        }

    def finish(self, spec: FinishSpec | Mapping[str, Any] | None = None,
               **fields: Any) -> FinishResult:
        """Grade: the submission if the agent submitted (``patch=`` overrides), else the tree's
        diff without ``exclude_paths``. The session is closed by the executor."""
        grading = dict(spec.model_dump(exclude_unset=True) if isinstance(spec, FinishSpec)
                       else spec or {}) | fields
        if "patch" not in grading and self.submission is not None:
            grading["patch"] = self.submission
        grading.setdefault("exclude_paths", list(self.config.exclude_paths))
        return self.session.finish(**grading)

    def cleanup(self) -> None:
        """Close the session if this environment started it (mini calls ``cleanup``)."""
        self._opened.close()

    close = cleanup

    def __enter__(self) -> DockyardEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _output(command: str, limit: float, result: ExecResult) -> dict[str, Any]:
    """mini's result dict for one ExecResult."""
    if result.timed_out:
        message = f"Command '{command}' timed out after {limit} seconds"
        return _exception(result.output, message, "TimeoutExpired")
    if result.exit_code is None:  # killed, or the shell lost its status and was restarted
        return _exception(result.output, result.error or "the command's exit status was lost",
                          "ExitStatusLost")
    return {"output": result.output, "returncode": result.exit_code, "exception_info": ""}


def _exception(output: str, message: str, kind: str) -> dict[str, Any]:
    return {
        "output": output,
        "returncode": -1,
        "exception_info": f"An error occurred while executing the command: {message}",
        "extra": {"exception_type": kind, "exception": message},
    }
