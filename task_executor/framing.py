"""The protocol between the executor and its persistent shell: control lines in, frames out.

**In.** The executor writes the command's text into a memfd the shell holds (after
:data:`~task_executor.syntax.CHECK_PREFIX`), then one control line (:func:`run_line`) on the
shell's stdin. The line makes the shell read the text, check it (:mod:`task_executor.syntax`),
``eval`` it at top level (so ``cd``, assignments, ``export`` and function definitions persist)
with stdin ``/dev/null`` and the protocol's fds closed, write the frame, and only then save a
snapshot of its state (``declare -p``, ``declare -f``, ``alias -p``, ``shopt -p``): the answer
goes out while the shell writes the snapshot, and the next control line waits in the pipe until
it is done. Snapshots alternate between two memfds and end with a numbered line
(:data:`STATE_END_PRINTF`), so a shell killed halfway through one (a forged frame is answered
with a kill at once) leaves the previous snapshot whole; :func:`latest_state` picks the newest
complete one. :func:`bootstrap_script` defines the shell functions this needs;
:func:`restore_line` makes a fresh shell ``source`` a saved snapshot.

**Out.** After each command the shell writes one line to a pipe of its own (never the command's
output pipe, and closed for the command itself, so nothing the command prints can forge or
split it; only a subshell forked into the background keeps bash's saved copy of the fd, which
is why the executor watches the shell's exit on a pidfd rather than waiting for the pipe's end
of file)::

    DY1 <nonce> <kind> <status> END\\n

``nonce`` is 32 hex digits chosen per command by the executor, so a stale frame (from a command
that was given up on) or a forged one cannot be taken for the current command's. ``kind`` is
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
from dataclasses import dataclass
from typing import Literal

from task_executor.syntax import CHECK_FUNCTION

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

    def assign(self) -> str:
        return (
            f"__dy_sfd={self.status} __dy_cfd={self.command} __dy_mfd={self.messages}"
            f" __dy_pfd=({self.snapshots[0]} {self.snapshots[1]})\n"
        )


# Builtins are called through `builtin` so that agent functions named printf, read... cannot
# hijack the frame; errexit cannot fire in __dy_post (`|| builtin true`). Job control (`set -m`)
# gives every job of a command its own process group.
_FUNCTIONS = r"""
__dy_ret() { return "$1"; }
__dy_pre() {
  IFS= builtin read -r -d '' -u "$__dy_cfd" __dy_cmd
  __dy_cmd=${__dy_cmd#*$'\n'}
  if ! __dy_check "/proc/self/fd/$__dy_cfd" "/proc/self/fd/$__dy_mfd"; then
    __dy_rc=2
    builtin printf '@FRAME@' "$1" refused 2 >&"$__dy_sfd"
    return 1
  fi
  # Under `set -x`, trace the command but not the `eval` line that runs it: tracing goes off
  # here and back on as the command's first statement.
  if [[ $- == *x* ]]; then builtin set +x; __dy_cmd=$'set -x\n'$__dy_cmd; fi
}
__dy_post() {
  __dy_rc=$1 __dy_cmd= __dy_msg=
  builtin printf '@FRAME@' "$2" ran "$1" >&"$__dy_sfd"
  (( ++__dy_seq )) || builtin true
  { builtin declare -p; builtin declare -f; builtin alias -p; builtin shopt -p
    builtin printf '@STATE_END@' "$__dy_seq"
  } >|"/proc/self/fd/${__dy_pfd[__dy_seq % 2]}" || builtin true
}
__dy_ping() { builtin printf '@FRAME@' "$1" ready 0 >&"$__dy_sfd"; }
""".replace("@FRAME@", FRAME_PRINTF).replace("@STATE_END@", STATE_END_PRINTF)


TOO_OLD_STATUS = 97
"""The status a fresh shell exits with when it is older than bash 4.4."""


def bootstrap_script(fds: ShellFds) -> str:
    """What a fresh shell reads first: options, the protocol's functions, the fd numbers.

    It first exits with :data:`TOO_OLD_STATUS` if bash is older than 4.4, which lacks the
    ``local -`` the syntax check depends on (there, ``set -n`` would stay on for good).
    """
    return (
        "(( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 404 )) || exit "
        f"{TOO_OLD_STATUS}\n"
        "set -m\nshopt -s expand_aliases\n__dy_rc=0 __dy_cmd= __dy_msg= __dy_chk=0 __dy_seq=0\n"
        + CHECK_FUNCTION
        + _FUNCTIONS
        + fds.assign()
    )


# Backslashes keep agent aliases from rewriting the control lines; the 2>/dev/null groups keep
# the protocol's own steps out of a `set -x` trace.
def run_line(nonce: str, fds: ShellFds) -> str:
    """Check and run the command in the command memfd; frame its status."""
    closed = " ".join(
        f"{fd}>&-" for fd in (fds.status, fds.command, *fds.snapshots, fds.messages)
    )
    closed += " </dev/null"
    return (
        f'{{ \\__dy_pre {nonce}; }} 2>/dev/null && {{ {{ \\__dy_ret "$__dy_rc"; }} 2>/dev/null; '
        f'\\eval "$__dy_cmd" {closed}; {{ \\__dy_post "$?" {nonce}; }} 2>/dev/null; }}\n'
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


def restore_line(fds: ShellFds) -> str:
    """Source the state in the command memfd, then set the fd numbers (the state has old ones)."""
    return f"{{ \\builtin source /proc/self/fd/{fds.command}; }} >/dev/null 2>&1\n" + fds.assign()
