"""The syntax check every command passes before it runs: bash's own parser, in milliseconds.

Unterminated input (a heredoc without its terminator, an open quote or ``$(``, an inline
``python3 -c "`` program left open) used to make the persistent shell wait for more input until
the 300 s timeout (Sandman table A26). Now each command is first parsed without being run, and
refused with bash's own message and exit status 2 if bash cannot parse all of it.

How it parses without running: the command is stored after a first line ``set -n``
(:data:`CHECK_PREFIX`) and a forked subshell ``source``-s that file. ``source`` parses and runs a
file one command at a time; the first, ``set -n``, switches execution off, so every later command
is only parsed (exactly what ``bash -n`` does to a script; ``set -n`` cannot be switched off
again, hence the subshell). The subshell is a fork of the session's shell, so its aliases and
``shopt`` settings (``extglob``) parse the command as the real run will; it costs one fork, not a
new ``bash``. ``source`` (unlike ``eval``) numbers lines from the start of the file, so bash's
messages can be given the command's own line numbers.

bash only *warns* about a here-document delimited by end of file and exits 0; that warning is a
refusal too, since the heredoc would otherwise have swallowed the rest of the command.

:data:`CHECK_FUNCTION` is the bash side (the session's shell defines it);
:func:`tidy_message` fixes the line numbers the extra ``set -n`` line shifted; and
:func:`check_syntax` runs the same check in a one-off ``bash`` for callers without a session.
"""

from __future__ import annotations

import os
import re
import subprocess

REFUSED_STATUS = 2
"""Exit status reported for a refused command (bash's own status for a syntax error)."""

CHECK_PREFIX = "set -n\n"
"""One line written before the command in the file ``__dy_check`` reads (the session strips
it, through the first newline, before running the command)."""

CHECK_FUNCTION = r"""
__dy_check() {
  __dy_msg=$({ builtin set +x; } 2>/dev/null; builtin source "$1" 2>&1) && __dy_chk=0 || __dy_chk=$?
  if [[ $__dy_chk != 0 || $__dy_msg == *'delimited by end-of-file'* ]]; then
    builtin printf '%s\n%s\n' "$__dy_msg" \
      'dockyard: not run: bash cannot parse the whole command'
    return 2
  fi
  [[ -z $__dy_msg ]] || builtin printf '%s\n' "$__dy_msg"
  return 0
}
"""
"""Defines ``__dy_check FILE``: FILE holds :data:`CHECK_PREFIX` then the command; prints bash's
message and returns 2 when bash refuses the command."""

_MESSAGE = re.compile(
    r"^/proc/self/fd/\d+: line (\d+): (?:(warning: here-document at line )(\d+))?", re.MULTILINE
)


def _renumber(match: re.Match[str]) -> str:
    line = f"bash: line {max(int(match.group(1)) - 1, 1)}: "
    if match.group(2) is None:
        return line
    return f"{line}{match.group(2)}{max(int(match.group(3)) - 1, 1)}"


def tidy_message(text: str) -> str:
    """Make the checker's messages read as bash's own for the command: ``bash: line N: ...``
    with N counted in the command (the file had the extra ``set -n`` line first)."""
    return _MESSAGE.sub(_renumber, text)


def check_syntax(command: str, bash: str = "bash", timeout: float = 10.0) -> str | None:
    """Check ``command`` in a one-off bash; return bash's message if refused, else None."""
    fd = os.memfd_create("dockyard-check")
    try:
        os.write(fd, (CHECK_PREFIX + command).encode("utf-8", "surrogateescape"))
        script = CHECK_FUNCTION + f"__dy_check /proc/self/fd/{fd}\n"
        proc = subprocess.run(
            [bash, "--noprofile", "--norc", "-c", script],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            pass_fds=(fd,),
            env={"PATH": os.defpath, "LC_ALL": "C.UTF-8"},
        )
    finally:
        os.close(fd)
    if proc.returncode == 0:
        return None
    return tidy_message(proc.stdout.decode("utf-8", errors="replace"))
