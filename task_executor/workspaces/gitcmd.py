"""Running git as a subprocess with a scrubbed environment and a clear error on failure."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

# git must never prompt (a prompt would hang a worker forever) nor read the user's config.
_GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ASKPASS": "/bin/true",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "dockyard",
    "GIT_AUTHOR_EMAIL": "dockyard@localhost",
    "GIT_COMMITTER_NAME": "dockyard",
    "GIT_COMMITTER_EMAIL": "dockyard@localhost",
    "LC_ALL": "C",
    # Trees handed to an unprivileged uid are still the executor's to read and patch.
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
}


class GitFailed(Exception):
    """A git command exited non-zero; ``stderr`` holds its message."""

    def __init__(self, args: Sequence[str], returncode: int, stderr: str) -> None:
        super().__init__(f"git {' '.join(args)} failed ({returncode}): {stderr.strip()[:2000]}")
        self.returncode = returncode
        self.stderr = stderr


def git_env() -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.devnull}
    env.update(_GIT_ENV)
    return env


def git(
    args: Sequence[str],
    cwd: str | os.PathLike[str] | None = None,
    *,
    input: bytes | None = None,
    timeout: float = 600.0,
    check: bool = True,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``git ARGS`` and return the completed process (bytes out), raising GitFailed."""
    env = git_env()
    env.update(extra_env or {})
    proc = subprocess.run(
        ["git", *args],
        cwd=cwd,
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        env=env,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise GitFailed(args, proc.returncode, proc.stderr.decode("utf-8", "replace"))
    return proc
