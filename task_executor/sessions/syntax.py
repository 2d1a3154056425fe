"""The syntax check every command passes before it runs: bash's own parser, in milliseconds.

Unterminated input (a heredoc without its terminator, an open quote or ``$(``, an inline
``python3 -c "`` program left open) used to make the persistent shell wait for more input until
the 300 s timeout (Sandman table A26). Now each command is first parsed without being run, and
refused with bash's own message and exit status 2 if bash cannot parse all of it.

How it parses without running, and without a fork: the command is stored after a first line
``builtin set -n`` (:data:`CHECK_LINE`), and a shell function ``source``-s that file. ``source``
parses and runs a file one command at a time; the first, ``set -n``, switches execution off, so
every later command is only parsed (exactly what ``bash -n`` does to a script). ``set -n`` cannot
be switched off by a command (none runs any more), but the function declared ``local -``, which
makes bash put every ``set`` option back as it was when the function returns. So the check runs
in the session's own shell: its aliases and ``shopt`` settings (``extglob``) parse the command as
the real run will, and it costs tens of microseconds where a forked subshell cost most of a
millisecond. ``source`` (unlike ``eval``) numbers lines from the start of the file, so bash's
messages can be given the command's own line numbers. Nothing after ``source`` in that function
would run either (``set -n`` is still on until it returns), so the function does nothing else;
bash's messages go to a second file that the caller reads. (The function also switches off
POSIX mode and ``set -e``, under either of which a syntax error in a sourced file ends a
non-interactive shell; it writes with ``>|``, which the agent's ``set -C`` does not refuse; and
it needs no guard against ``set -x``/``-v``, which the session keeps off between commands.)
``local -`` is written without ``builtin``: ``local -`` run from inside an agent's function
named ``builtin`` would make the options local to *that* function, and ``set -n`` would stay on
in the session's shell.

bash only *warns* about a here-document delimited by end of file and exits 0; that warning is a
refusal too, since the heredoc would otherwise have swallowed the rest of the command.

:data:`CHECK_FUNCTION` is the bash side (the session's shell defines it), and
:func:`tidy_message` fixes the line numbers the extra ``set -n`` line shifted.
"""

from __future__ import annotations

import re

REFUSED_STATUS = 2
"""Exit status reported for a refused command (bash's own status for a syntax error)."""

CHECK_LINE = "builtin set -n"
"""The first line of the file ``__dy_check`` reads, before the command (a comment may follow
it on that line; the session strips the line before running the command)."""

NOT_RUN_LINE = "dockyard: not run: bash cannot parse the whole command"
"""The last line of a refused command's output (the text marker older clients look for)."""

CHECK_FUNCTION = r"""
__dy_parse() { local -; builtin set +e +o posix; builtin source "$1"; }
__dy_check() {
  __dy_parse "$1" 2>|"$2" && __dy_chk=0 || __dy_chk=$?
  __dy_msg=
  [[ ! -s $2 ]] || IFS= builtin read -r -d '' __dy_msg <"$2" || builtin true
  if [[ $__dy_chk != 0 || $__dy_msg == *'delimited by end-of-file'* ]]; then
    builtin printf '%s\n%s\n' "${__dy_msg%$'\n'}" \
      '@NOT_RUN@'
    return 2
  fi
  [[ -z $__dy_msg ]] || builtin printf '%s' "$__dy_msg"
  return 0
}
""".replace("@NOT_RUN@", NOT_RUN_LINE)
"""Defines ``__dy_check FILE MESSAGES``: FILE holds :data:`CHECK_LINE` then the command,
MESSAGES is a file bash's messages are written to; prints them, and returns 2 when bash refuses
the command."""

_MESSAGE = re.compile(
    r"^/proc/self/fd/\d+: line (\d+): (?:(warning: here-document at line )(\d+))?", re.MULTILINE
)


def _renumber(match: re.Match[str], shift: int) -> str:
    line = f"bash: line {max(int(match.group(1)) - shift, 1)}: "
    if match.group(2) is None:
        return line
    return f"{line}{match.group(2)}{max(int(match.group(3)) - shift, 1)}"


def tidy_message(text: str, added_lines: int = 0) -> str:
    """Make the checker's messages read as bash's own for the command: ``bash: line N: ...``
    with N counted in the command (the file had the extra ``set -n`` line first, and
    ``added_lines`` of a subshell's prologue)."""
    return _MESSAGE.sub(lambda match: _renumber(match, 1 + added_lines), text)


def refusal_message(tidied: str) -> str:
    """bash's own message in a refused command's (tidied) output, without the marker line."""
    return tidied.replace(NOT_RUN_LINE, "").strip("\n")
