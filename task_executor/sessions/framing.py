"""The protocol between the executor and its persistent shell: control lines in, frames out.

**In.** The executor writes the command's text into a memfd the shell holds, after a first
line that is the syntax check's :data:`~task_executor.syntax.CHECK_LINE` with the command's
nonce in a comment (:func:`command_file`), then the control line :data:`RUN_LINE` on the
shell's stdin. bash reads a pipe one byte per system call, so that line is 16 bytes and runs
the protocol's text from a read-only variable: read the command, check it
(:mod:`task_executor.syntax`), ``eval`` it at top level (so ``cd``, assignments, ``export`` and
function definitions persist) with stdin ``/dev/null`` and the protocol's fds closed, write the
frame, and only then save a snapshot of its state (``declare -p``, ``declare -f``,
``alias -p``, and the ``shopt`` options in two lines): the answer goes out while the shell
writes the snapshot, and the next control line waits in the pipe until it is done. Snapshots
alternate between two memfds and end with a numbered line (:data:`STATE_END_PRINTF`), so a
shell killed halfway through one (a forged frame is answered with a kill at once) leaves the
previous snapshot whole; :func:`latest_state` picks the newest complete one.
:func:`bootstrap_script` defines the shell functions this needs, read-only so that a command
cannot redefine them; :func:`restore_line` makes a fresh shell ``source`` a saved snapshot.

**Spares.** A subshell call (stateless, or with a cwd or env of its own: see
:mod:`~task_executor.sessions.modes`) runs in a *spare*: a subshell the shell forked after the
previous call (:data:`SPARE_LINE`), which waits for one line on the shell's stdin while the shell
waits for it. The fork (most of a millisecond) is then off the call's path. The line that starts
the call (:data:`TRIGGER_LINE`) is also what the shell runs itself when no spare took it (the
spare was killed meanwhile): the same call in a subshell forked then. Any other line makes the
spare exit unused, so the executor sends :data:`RELEASE_LINE` before anything else it sends
while a spare waits (a harmless ``:`` if the shell reads it itself). The spare checks and runs
the call and writes its frame (``ran`` or ``refused``) before it exits, so its exit is off the
call's path too, and leaves the nonce in the messages memfd to say so; when it did not get that
far (an ``exit`` in the command, ``set -e``, a signal) the shell frames the call with the
spare's status (:func:`spare_post_line`). No snapshot follows such a call: a subshell changes
nothing in the shell.

**Out.** After each command the shell writes one line to a pipe of its own (never the command's
output pipe, and closed for the command itself, so nothing the command prints can forge or
split it; only a subshell forked into the background keeps bash's saved copy of the fd, which
is why the executor watches the shell's exit on a pidfd rather than waiting for the pipe's end
of file)::

    DY1 <nonce> <kind> <status> END\\n

``nonce`` is 32 hex digits chosen per command by the executor, so a stale frame (from a command
that was given up on) or bytes that merely look like a frame cannot be taken for the current
command's. (A command that sets out to forge its own status can: the shell it runs in knows the
nonce. It only lies to its own caller; grading never reads an exec status.) ``kind`` is
``ran`` (the command ran; ``status`` is its exit status), ``refused`` (the syntax check refused
it; status 2) or ``ready`` (the shell answered a ping or finished starting). ``END`` and the
newline terminate the frame: a frame is only accepted whole.

The parser is strict (Sandman table A25: a lenient one reported 0 for failing commands whenever
the frame was empty, split or cut off). Bytes may arrive in any number of reads; the frame is
taken when its newline arrives and must then match exactly, with nothing after it. Anything else
raises :class:`InvalidFrame`; an end of file in the middle of a frame raises
:class:`IncompleteFrame`. The caller turns either into an error and a shell restart, never a
status.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Literal

from .syntax import CHECK_FUNCTION, CHECK_LINE

FrameKind = Literal["ran", "refused", "ready"]

FRAME_PRINTF = "DY1 %s %s %s END\\n"
"""The ``printf`` format the shell writes a frame with: nonce, kind, status."""

STATE_END_PRINTF = "# dockyard-state %s\\n"
"""The last line of a complete state snapshot (a comment, numbered: later is larger)."""
_STATE_END = re.compile(rb"# dockyard-state ([0-9]{1,18})\n\Z")

MAX_FRAME_BYTES = 128
_KINDS: dict[bytes, FrameKind] = {b"ran": "ran", b"refused": "refused", b"ready": "ready"}
_FRAME_RE = re.compile(rb"DY1 ([0-9a-f]{32}) (ran|refused|ready) (0|[1-9][0-9]{0,2}) END\n")


class FrameError(Exception):
    """The status frame could not be trusted; the command's status is unknown."""


class InvalidFrame(FrameError):
    """Bytes arrived that are not exactly one frame for the current command."""


class IncompleteFrame(FrameError):
    """The status pipe closed (the shell died) in the middle of a frame."""


@dataclass(frozen=True)
class Frame:
    """One parsed frame."""

    kind: FrameKind
    status: int


class FrameParser:
    """Accumulates the bytes of one command's frame and parses them strictly.

    Feed every chunk read from the status pipe to :meth:`feed`; call :meth:`finish` at end of
    file. The parser is the fault-injection point of the tests: any chunking of any bytes can be
    fed to it without a shell.
    """

    def __init__(self, nonce: str) -> None:
        self._nonce = nonce.encode("ascii")
        self._buf = bytearray()
        self._frame: Frame | None = None

    def feed(self, chunk: bytes) -> Frame | None:
        """Add bytes; return the frame once its terminator arrived, else None."""
        if self._frame is not None:
            if chunk:
                raise InvalidFrame(f"invalid frame: {len(chunk)} bytes after the frame")
            return self._frame
        self._buf += chunk
        newline = self._buf.find(b"\n")
        if newline < 0:
            if len(self._buf) > MAX_FRAME_BYTES:
                raise InvalidFrame(f"invalid frame: {len(self._buf)} bytes without a terminator")
            return None
        if newline != len(self._buf) - 1:
            raise InvalidFrame("invalid frame: bytes after the terminator")
        match = _FRAME_RE.fullmatch(self._buf)
        if match is None:
            raise InvalidFrame(f"invalid frame: {bytes(self._buf)[:MAX_FRAME_BYTES]!r}")
        nonce, kind, status = match.groups()
        if nonce != self._nonce:
            raise InvalidFrame("invalid frame: nonce of another command")
        code = int(status)
        if code > 255:
            raise InvalidFrame(f"invalid frame: status {code} out of range")
        self._frame = Frame(kind=_KINDS[kind], status=code)
        return self._frame

    def finish(self) -> None:
        """End of file on the status pipe: raise if a frame had begun but not ended.

        With nothing received, returns None: the shell exited between frames, which the caller
        reports with the shell's own exit status.
        """
        if self._frame is None and self._buf:
            raise IncompleteFrame(
                f"incomplete frame: shell exited after {len(self._buf)} bytes of the status frame"
            )


# -- the shell's side ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ShellFds:
    """The numbers the shell knows the protocol's fds by."""

    status: int
    """Write end of the status pipe."""
    command: int
    """Memfd holding the check prefix and the command (or a state to restore)."""
    snapshots: tuple[int, int]
    """Memfds the shell saves its state into after each command, in turn."""
    messages: int
    """Memfd the syntax check writes bash's messages into."""
    output: int
    """Write end of the output pipe (the command's stdout and, merged, stderr)."""
    stderr: int
    """Write end of the pipe a command's stderr goes to when asked for separately."""

    def declare(self) -> str:
        """Read-only variables with the fd numbers (and the control texts that use them)."""
        return (
            f"declare -r __dy_sfd={self.status} __dy_cfd={self.command}"
            f" __dy_mfd={self.messages} __dy_L={shlex.quote(_run_text(self, False))}"
            f" __dy_L2={shlex.quote(_run_text(self, True))}"
            f" {_SPARE_TEXTS}\n"
            f"declare -ra __dy_pfd=({self.snapshots[0]} {self.snapshots[1]})\n"
        )


# Builtins are called through `builtin` so that agent functions named printf, read... cannot
# hijack the frame; errexit cannot fire in the protocol's functions (`|| builtin true`, and
# __dy_pre hands on the last status only while `set -e` is off: under it, a non-zero return at
# top level would end the shell). Job control (`set -m`) gives every job of a command its own
# process group.
#
# `set -x` and `set -v` are off between commands: __dy_post switches them off (remembering
# which in __dy_xv) and __dy_pre puts them back as the command's first line, so the trace and
# the echo show the agent's command and never the protocol's lines (the control line, a ping).
_FUNCTIONS = r"""
__dy_take() {
  IFS= builtin read -r -d '' -u "$__dy_cfd" __dy_cmd || builtin true
  __dy_n=${__dy_cmd%%$'\n'*} __dy_cmd=${__dy_cmd#*$'\n'}
  __dy_n=${__dy_n##*' '}
  __dy_check "/proc/self/fd/$__dy_cfd" "/proc/self/fd/$__dy_mfd" || return 1
  [[ -z $__dy_xv ]] || __dy_cmd="builtin set -$__dy_xv"$'\n'$__dy_cmd
  return 0
}
__dy_pre() {
  if ! __dy_take; then
    __dy_rc=2 __dy_cmd= __dy_skip=1
    builtin printf '@FRAME@' "$__dy_n" refused 2 >&"$__dy_sfd"
  fi
  __dy_rcset
}
__dy_post() {
  if [[ -n $__dy_skip ]]; then __dy_skip=; return 0; fi
  __dy_xv=${-//[!xv]/}
  [[ -z $__dy_xv ]] || builtin set +xv
  __dy_rc=$1 __dy_cmd= __dy_msg=
  builtin printf '@FRAME@' "$__dy_n" ran "$1" >&"$__dy_sfd"
  (( ++__dy_seq )) || builtin true
  { builtin declare -p; builtin declare -f; builtin alias -p
    builtin printf 'builtin shopt -u %s\nbuiltin shopt -s %s\n@STATE_END@' \
      "${__dy_shopt0//:/ }" "${BASHOPTS//:/ }" "$__dy_seq"
  } >|"/proc/self/fd/${__dy_pfd[__dy_seq % 2]}" || builtin true
}
__dy_ping() { builtin printf '@FRAME@' "$1" ready 0 >&"$__dy_sfd"; }
__dy_spre() {
  if ! __dy_take; then
    __dy_sframe refused 2
    return 1
  fi
  [[ -z $__dy_e ]] || builtin set -e
  return 0
}
__dy_eoff() { __dy_e=${-//[!e]/}; builtin set +e; }
__dy_eon() { [[ -z $__dy_e ]] || builtin set -e; __dy_e=; }
__dy_sgo() {
  IFS= builtin read -r __dy_go || return 1
  if [[ $__dy_go == "$__dy_T" ]]; then __dy_go=$__dy_L
  elif [[ $__dy_go == "$__dy_T2" ]]; then __dy_go=$__dy_L2
  else return 1; fi
}
__dy_rcset() { [[ $- == *e* ]] || return "$__dy_rc"; }
__dy_sframe() {
  builtin printf '@FRAME@' "$__dy_n" "$1" "$2" >&"$__dy_sfd"
  builtin printf '%s' "$__dy_n" >|"/proc/self/fd/$__dy_mfd" || builtin true
}
__dy_sdone() { __dy_sframe ran "$1"; builtin exit "$1"; }
__dy_spost() {
  __dy_rc=$1 __dy_msg=
  IFS= builtin read -r -d '' __dy_msg <"/proc/self/fd/$__dy_mfd" || builtin true
  [[ $__dy_msg == "$2" ]] || builtin printf '@FRAME@' "$2" ran "$1" >&"$__dy_sfd"
  __dy_msg=
  __dy_eon
}
""".replace("@FRAME@", FRAME_PRINTF).replace("@STATE_END@", STATE_END_PRINTF)

RUN_LINE = '\\__dy_pre\n\\builtin eval "$__dy_L"\n{ \\__dy_post "$?"; } 2>/dev/null\n'
"""The control lines that check and run the command in the command memfd and frame its
status. They are short on purpose: bash reads a pipe one byte per system call, and the text it
runs (:func:`_run_text`, in ``__dy_L``) is set once per shell.

Three lines, not one list: when a command's job dies of SIGINT (an interrupt), bash ends the
list it runs in, even with SIGINT trapped (as the session's shell is, see
:func:`bootstrap_script`), so the frame must be written by a line of its own: an interrupted
command (a ``sleep``, a list, a loop) returns 130 and the shell goes on. ``eval`` is called through
``builtin``: the frame now follows on a line of its own, so an agent function named ``eval``
would otherwise make every later command a silent no-op answered "exit 0". The third line
is read once the command ran, possibly under its ``set -v``: bash's own stderr is
/dev/null, so that echo goes nowhere, while the command's fd 2 is the output pipe."""

TOO_OLD_STATUS = 97
"""The status a fresh shell exits with when it is older than bash 4.4."""


def command_file(nonce: str, command: bytes) -> bytes:
    """What the command memfd holds for one command: the check's first line, with the
    command's nonce in a comment after it, then the command."""
    return f"{CHECK_LINE} # {nonce}\n".encode() + command


RUN_SEPARATE_LINE = RUN_LINE.replace("__dy_L", "__dy_L2")
"""The control line for a command whose stderr goes to the stderr pipe, apart from stdout."""

SPARE_LINE = '\\__dy_eoff; \\builtin eval "$__dy_SP"\n'
"""Fork a spare (see the module) and wait for it: the spare reads the next line. The agent's
``set -e`` is off in the shell meanwhile (a failing call must not end the shell) and back on in
the spare before the call runs; whatever follows the spare puts it back in the shell
(:data:`RELEASE_LINE`, :func:`spare_post_line`). (Not a ``||`` list: a subshell started in one
runs with ``set -e`` ignored, and ``builtin eval`` there would not even spare the shell.)"""

TRIGGER_LINE = '\\builtin eval "$__dy_F"\n'
"""Run the call in the command memfd in the waiting spare (read by the spare), or in a subshell
forked now (read by the shell itself: the spare is gone)."""

TRIGGER_SEPARATE_LINE = TRIGGER_LINE.replace("__dy_F", "__dy_F2")
""":data:`TRIGGER_LINE` for a call whose stderr goes to the stderr pipe."""

RELEASE_LINE = "\\builtin :\n\\__dy_eon\n"
"""Makes a waiting spare exit unused (its first line; a no-op for the shell itself, should the
spare be gone), then puts the agent's ``set -e`` back in the shell."""


def spare_post_line(nonce: str) -> str:
    """After a spare's call: frame its status (``ran``) unless the spare framed the call itself
    (its nonce in the messages memfd); no snapshot."""
    return f'{{ \\__dy_spost "$?" {nonce}; }} 2>/dev/null\n'


def _subshell_text(run: str) -> str:
    """What a spare (or a subshell forked at the call) runs: check the command (a refusal ends
    it with status 2), give it the last status as ``$?``, run it at the subshell's top level."""
    return (f"\\__dy_spre || \\builtin exit 2\n\\__dy_rcset\n\\builtin eval \"${run}\"\n"
            '\\__dy_sdone "$?"')


def _spare_text() -> str:
    """The spare: one line from stdin; a trigger runs the call, anything else (or end of file)
    ends it unused. (No reserved word in it: it is parsed when run, after the agent's aliases,
    and bash expands an alias named ``case`` or ``{``.)"""
    return f"( \\__dy_sgo || \\builtin exit 0\n{_subshell_text('__dy_go')} )"


def _run_text(fds: ShellFds, separate: bool) -> str:
    """Run the command (eval at top level, so that ``cd``, assignments, ``export`` and
    function definitions persist), between RUN_LINE's check and frame. A backslash keeps agent
    aliases from rewriting a word. The command's fd 2 is the output pipe, or with
    ``separate`` the stderr pipe (redirections apply left to right, so it is copied before its
    own number is closed to the command)."""
    closed = " ".join(
        f"{fd}>&-"
        for fd in (fds.status, fds.command, *fds.snapshots, fds.messages, fds.output,
                   fds.stderr)
    )
    to_stderr = fds.stderr if separate else fds.output
    return f'\\builtin eval "$__dy_cmd" 2>&{to_stderr} {closed} </dev/null'



_SPARE_TEXTS = " ".join(f"{name}={shlex.quote(text)}" for name, text in {
    "__dy_F": f"( {_subshell_text('__dy_L')} )",
    "__dy_F2": f"( {_subshell_text('__dy_L2')} )",
    "__dy_T": TRIGGER_LINE.rstrip("\n"),
    "__dy_T2": TRIGGER_SEPARATE_LINE.rstrip("\n"),
    "__dy_SP": _spare_text(),
}.items())
"""The spares' read-only texts (the same in every shell): the subshells a trigger runs, the
trigger lines as a spare compares them, and the spare itself."""

_PROTOCOL_FUNCTIONS = ("__dy_parse __dy_check __dy_take __dy_pre __dy_post __dy_ping __dy_spre"
                       " __dy_eoff __dy_eon __dy_sgo __dy_rcset __dy_sframe __dy_sdone"
                       " __dy_spost")
_MUTABLE = "__dy_cmd= __dy_msg= __dy_chk=0 __dy_n= __dy_skip= __dy_xv= __dy_e=\n"
"""The protocol's variables that change per command, as a fresh shell starts them."""


def bootstrap_script(fds: ShellFds) -> str:
    """What a fresh shell reads first: options, the protocol's functions and variables.

    It first exits with :data:`TOO_OLD_STATUS` if bash is older than 4.4, which lacks the
    ``local -`` the syntax check depends on (there, ``set -n`` would stay on for good).
    The functions, the fd numbers and the control text are read-only: an agent's command
    cannot redefine or unset them (bash refuses with an error), and a restored snapshot,
    which lists them too, cannot either.
    """
    return (
        "(( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 404 )) || exit "
        f"{TOO_OLD_STATUS}\n"
        # bash's own stderr goes nowhere between commands (a command's fd 2 is set per
        # command, see RUN_LINE); the launcher's errors before this still reach the output.
        "exec 2>/dev/null\n"
        "set -m\nshopt -s expand_aliases\n__dy_rc=0 __dy_seq=0\n"
        # SIGINT trapped (not ignored: children get the default): a job that dies of SIGINT
        # (an interrupt) ends the command's list or loop, as Ctrl-C in a terminal does, and
        # the shell goes on; untrapped, a non-interactive bash exits as if sent SIGINT itself.
        "trap '\\builtin :' INT\n"
        "declare -r __dy_shopt0=$BASHOPTS\n"
        + CHECK_FUNCTION
        + _FUNCTIONS
        + f"readonly -f {_PROTOCOL_FUNCTIONS}\n"
        + fds.declare()
        + _MUTABLE
    )


def ping_line(nonce: str) -> str:
    """Answer with a ``ready`` frame."""
    return f"{{ \\__dy_ping {nonce}; }} 2>/dev/null\n"


def latest_state(snapshots: list[bytes]) -> bytes:
    """The newest complete snapshot among ``snapshots`` (b"" if none is complete)."""
    best, best_seq = b"", -1
    for state in snapshots:
        end = _STATE_END.search(state[-64:])
        if end is not None and int(end.group(1)) > best_seq:
            best, best_seq = state, int(end.group(1))
    return best


# What the protocol runs as a plain command name: a function by one of these names takes over
# every later command (bash finds functions before builtins). Dropped on a restore, so that such
# a function costs one timeout instead of every command after it. (An agent function named
# `unset` would keep them; POSIX mode, which looks up `unset` first, cannot be switched on and
# off again without changing the agent's shopt options.)
_UNSHADOW = "\\unset -f eval builtin local return\n"


def restore_line(fds: ShellFds) -> str:
    """Source the state in the command memfd (its lines for the protocol's read-only names fail
    quietly), then reset the protocol's per-command variables, which it may carry broken, and
    drop functions that shadow what the protocol runs on."""
    return (
        f"{{ \\builtin source /proc/self/fd/{fds.command}; }} >/dev/null 2>&1\n"
        + _MUTABLE
        + _UNSHADOW
    )
