"""How one exec call runs in the session's shell: in the shell itself, or in a subshell of it.

A *stateless* call (or one with a ``cwd`` or ``env`` of its own) runs its command in a subshell
of the session's shell: a fork of the live shell (no new bash started), which sees the session's
variables, functions and aliases, while whatever the command changes (``cd``, ``export``,
functions, ``set`` options, ``exit``) dies with the subshell. This is what mini-swe-agent's
``execute(command, cwd)`` and SWE-ReX's ``execute(Command)`` expect. The subshell is usually a
*spare* forked after the previous call, so the fork is off the call's path
(:mod:`~task_executor.sessions.framing`).

The subshell's first line enters the directory and exports the variables; the command follows on
lines of its own, so bash's parser (the session's syntax check) still sees the command as written
and refuses it whole when it does not parse. Only the line numbers of bash's messages shift, by
:data:`SUBSHELL_LINES`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

SUBSHELL_LINES = 1
"""Lines the subshell's prologue adds before the command."""


@dataclass(frozen=True)
class CallMode:
    """One exec call's options beyond the command and its timeout."""

    subshell: bool = False
    cwd: str | None = None
    """An absolute directory inside the sandbox (the caller resolved a relative one)."""
    env: dict[str, str] = field(default_factory=dict)
    separate_stderr: bool = False


DEFAULT_MODE = CallMode()


def command_text(command: str, mode: CallMode) -> tuple[str, int]:
    """The text the shell runs for ``command`` and the lines added before it (for messages)."""
    if not mode.subshell:
        return command, 0
    steps = []
    if mode.cwd is not None:
        # `cd` prints its own message on failure; the call then ends with status 1, as a
        # terminal's `cd missing && cmd` would, and nothing of the command runs.
        steps.append(f"builtin cd -- {shlex.quote(mode.cwd)} || builtin exit 1")
    steps += [f"builtin export {name}={shlex.quote(value)}" for name, value in mode.env.items()]
    # Always one line of prologue, so that bash's messages shift by SUBSHELL_LINES.
    prologue = "; ".join(steps) or "builtin :"
    return f"{prologue}\n{command}", SUBSHELL_LINES
