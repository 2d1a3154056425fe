"""The syntax check every command passes before it runs: bash's own parser, in milliseconds.

Unterminated input (a heredoc without its terminator, an open quote or ``$(``, an inline
``python3 -c "`` program left open) used to make the persistent shell wait for more input until
the 300 s timeout (Sandman table A26). Now each command is first parsed without being run, and
refused with bash's own message and exit status 2 if bash cannot parse all of it.

How it parses without running: in a forked subshell, ``eval $'set -n\\n'"$cmd"``. ``eval`` parses
and runs its string one command at a time; the first command, ``set -n``, switches execution off,
so every later command is only parsed (exactly what ``bash -n`` does to a script). The subshell is
a fork of the session's shell, so its aliases and ``shopt`` settings (``extglob``) parse the
command as the real run will; it costs one fork, not a new ``bash``.

bash only *warns* about a here-document delimited by end of file and exits 0; that warning is a
refusal too, since the heredoc would otherwise have swallowed the rest of the command.

:data:`CHECK_FUNCTION` is the bash side (the session's shell defines it);
:func:`tidy_message` fixes the line numbers the extra ``set -n`` line shifted; and
:func:`check_syntax` runs the same check in a one-off ``bash`` for callers without a session.
"""

from __future__ import annotations

import re
import subprocess

REFUSED_STATUS = 2
"""Exit status reported for a refused command (bash's own status for a syntax error)."""

CHECK_FUNCTION = r"""
__dy_check() {
  __dy_msg=$(builtin eval $'set -n\n'"$1" 2>&1) && __dy_chk=0 || __dy_chk=$?
  if [[ $__dy_chk != 0 || $__dy_msg == *'delimited by end-of-file'* ]]; then
    builtin printf '%s\n%s\n' "$__dy_msg" \
      'dockyard: not run: bash cannot parse the whole command (it would wait for more input)'
    return 2
  fi
  [[ -z $__dy_msg ]] || builtin printf '%s\n' "$__dy_msg"
  return 0
}
"""
"""Defines ``__dy_check SOURCE``: prints bash's message and returns 2 when bash refuses SOURCE."""

_EVAL_LINE = re.compile(r"(eval: line |here-document at line )(\d+)")
_OUTER_LINE = re.compile(r"^(\S+: )line \d+: (warning: here-document)", re.MULTILINE)


def tidy_message(text: str) -> str:
    """Make the checker's messages read as if bash had run the command directly.

    Line numbers inside the command are one too high (the ``set -n`` line came first), and the
    heredoc warning carries the session shell's own input line number, meaningless to the caller.
    """
    text = _EVAL_LINE.sub(lambda m: f"{m.group(1)}{max(int(m.group(2)) - 1, 1)}", text)
    return _OUTER_LINE.sub(r"\1\2", text)


def check_syntax(command: str, bash: str = "bash", timeout: float = 10.0) -> str | None:
    """Check ``command`` in a one-off bash; return bash's message if refused, else None."""
    script = CHECK_FUNCTION + '__dy_check "$1"\n'
    proc = subprocess.run(
        [bash, "--noprofile", "--norc", "-c", script, "bash", command],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
    )
    if proc.returncode == 0:
        return None
    return tidy_message(proc.stdout.decode("utf-8", errors="replace"))
