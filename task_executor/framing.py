"""The status frame: how the persistent shell tells the executor that a command ended, and how.

After each command the shell writes one line to a pipe of its own (never the command's output
pipe, and closed for the command itself, so nothing the command prints can forge or split it)::

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

FrameKind = Literal["ran", "refused", "ready"]

FRAME_PRINTF = "DY1 %s %s %s END\\n"
"""The ``printf`` format the shell writes a frame with: nonce, kind, status."""

MAX_FRAME_BYTES = 128
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

    @property
    def received(self) -> int:
        """Bytes received so far."""
        return len(self._buf)

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
        self._frame = Frame(kind=kind.decode("ascii"), status=code)  # type: ignore[arg-type]
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
