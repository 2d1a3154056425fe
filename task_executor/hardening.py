"""Keeping the executor's bearer token out of other processes' reach through procfs.

procfs publishes a process's argv (``/proc/PID/cmdline``, readable by every uid) and its initial
environment (``/proc/PID/environ``, readable by its own uid), and a process of the same uid may
open ``/proc/PID/mem`` read-write or ptrace it. So, at start, the ``task-executor serve`` process:

1. makes itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``, before any token is read): its
   ``/proc`` entries then belong to root, and no other process without ``CAP_SYS_PTRACE`` -- the
   same uid included -- can ptrace it or open its environ, mem or maps. The flag resets on
   ``execve``, so the processes the executor starts are as dumpable as ever;
2. when the token came in argv (``--token``) or in the environment (``API_TOKEN``, or a path in
   ``API_TOKEN_FILE``), execs itself once more (:func:`reexec_without_token`; same pid, so
   supervisors and Kubernetes see one process) with those removed from argv and environment. A
   token given as a value travels to the new image through an inherited pipe named by the hidden
   ``--token-fd N`` flag, which the new image reads to the end and closes; a path from
   ``API_TOKEN_FILE`` travels as ``--token-file PATH`` (a path is no secret) and is read by the
   new image after its own prctl. An image started with ``--token-fd`` never re-execs, and the new
   argv and environment hold no token source at all, so there is no loop.

What remains: the first image's argv and environment are visible until its ``execve``
(milliseconds), as the supervisor made them; the new image is dumpable between its ``execve`` and
its prctl (interpreter start-up, before the package's heavy imports), when a same-uid process
could open the pipe through ``/proc/PID/fd`` -- stealing the token from it empties the pipe, and
an empty ``--token-fd`` is an error, so the executor then refuses to start rather than serve
without auth. ``--token-file`` avoids both windows. Root on the host sees everything, always.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

TOKEN_ENV = "API_TOKEN"
TOKEN_FILE_ENV = "API_TOKEN_FILE"
TOKEN_FLAG = "--token"
TOKEN_FILE_FLAG = "--token-file"
TOKEN_FD_FLAG = "--token-fd"

# Far above any real token, and below the 64 KiB pipe buffer, so the hand-over never blocks.
MAX_TOKEN_BYTES = 16 * 1024

_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4


class TokenError(ValueError):
    """A token source that cannot be used; the message is one line, fit for stderr."""


def make_undumpable() -> tuple[bool, str]:
    """``prctl(PR_SET_DUMPABLE, 0)`` on Linux: whether it took, and a line to log either way."""
    if not sys.platform.startswith("linux"):
        return False, f"not Linux ({sys.platform}): PR_SET_DUMPABLE skipped, /proc stays as is"
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError) as exc:
        return False, f"prctl unavailable ({exc}): the process stays dumpable"
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    if prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        return False, f"prctl(PR_SET_DUMPABLE, 0) failed: {os.strerror(error)}"
    if prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
        return False, "prctl(PR_SET_DUMPABLE, 0) did not take: the process stays dumpable"
    return True, "process made non-dumpable: its /proc entries are root's, ptrace is refused"


@dataclass(frozen=True)
class TokenSource:
    """Where the token is to be read from: a value, a file, or the hand-over pipe."""

    kind: str  # "value", "file" or "fd"
    origin: str  # the flag or variable it came from, for messages
    value: str = ""
    path: str = ""
    fd: int = -1


def choose_source(
    token: str | None,
    token_file: str | None,
    token_fd: int | None,
    environ: Mapping[str, str],
) -> TokenSource | None:
    """The one token source in effect: a flag beats the environment; two of a kind are an error.

    An empty ``API_TOKEN`` / ``API_TOKEN_FILE`` counts as unset (as every variable does)."""
    env_token = environ.get(TOKEN_ENV) or None
    env_file = environ.get(TOKEN_FILE_ENV) or None
    if token_fd is not None:
        others = [
            name
            for name, given in (
                (TOKEN_FLAG, token),
                (TOKEN_FILE_FLAG, token_file),
                (TOKEN_ENV, env_token),
                (TOKEN_FILE_ENV, env_file),
            )
            if given is not None
        ]
        if others:
            raise TokenError(f"{TOKEN_FD_FLAG} is internal and cannot be combined with {others[0]}")
        return TokenSource("fd", TOKEN_FD_FLAG, fd=token_fd)
    if token is not None and token_file is not None:
        raise TokenError(f"give {TOKEN_FLAG} or {TOKEN_FILE_FLAG}, not both")
    if token is not None:
        return TokenSource("value", TOKEN_FLAG, value=token)
    if token_file is not None:
        return TokenSource("file", TOKEN_FILE_FLAG, path=token_file)
    if env_token is not None and env_file is not None:
        raise TokenError(f"set {TOKEN_ENV} or {TOKEN_FILE_ENV}, not both")
    if env_token is not None:
        return TokenSource("value", TOKEN_ENV, value=env_token)
    if env_file is not None:
        return TokenSource("file", TOKEN_FILE_ENV, path=env_file)
    return None


SANDBOX_PRIVATE_TOPS = ("/tmp", "/run", "/var/run", "/proc", "/dev")
"""Top-level directories every sandbox has its own of: a file below them is out of its sight."""


def token_file_exposure(path: str, hidden: Sequence[str]) -> str | None:
    """Why code under test could read the token file at ``path``, or None when it cannot.

    Sandboxes see the host read-only, but for ``hidden`` paths (the base directory, the
    executor's own) and their private /tmp and /run. Root inside a sandbox holds no capability
    outside, so it reads what any other uid may: a file that is world-readable (0644, as a
    Kubernetes Secret volume makes by default) below directories anyone may pass."""
    real = os.path.realpath(path)
    if any(real == top or real.startswith(top.rstrip("/") + "/")
           for top in (*SANDBOX_PRIVATE_TOPS, *(os.path.realpath(h) for h in hidden))):
        return None
    try:
        mode = os.stat(real).st_mode
        blocked = [parent for parent in _parents(real)
                   if not os.stat(parent).st_mode & stat.S_IXOTH]
    except OSError:
        return None  # unreadable to us too: load_token says so
    if not mode & stat.S_IROTH or blocked:
        return None
    return (f"the token file {path} is readable by code under test (mode "
            f"{stat.S_IMODE(mode):04o}, and every directory above it may be passed): make it 0600 "
            f"(Kubernetes: defaultMode: 0400 on the Secret volume), or keep it in a directory "
            f"others cannot pass (0700)")


def _parents(path: str) -> list[str]:
    parents, current = [], os.path.dirname(path)
    while current not in ("/", ""):
        parents.append(current)
        current = os.path.dirname(current)
    return [*parents, "/"]


def load_token(source: TokenSource | None) -> str | None:
    """The token itself (read from the file or the pipe, which is then closed), checked."""
    if source is None:
        return None
    if source.kind == "fd":
        try:
            return _checked(_read_fd(source.fd).decode("utf-8"), source)
        except UnicodeDecodeError:
            raise TokenError(f"the token from {TOKEN_FD_FLAG} is not UTF-8") from None
    if source.kind == "file":
        return _checked(_read_file(source), source)
    return _checked(source.value, source)


def _checked(token: str, source: TokenSource) -> str:
    where = f"{source.origin} {source.path}" if source.kind == "file" else source.origin
    if token == "":
        raise TokenError(f"the token from {where} is empty")
    try:
        size = len(token.encode("utf-8"))
    except UnicodeEncodeError:  # undecodable bytes in argv or the environment
        raise TokenError(f"the token from {where} is not UTF-8") from None
    if size > MAX_TOKEN_BYTES:
        raise TokenError(f"the token from {where} is longer than {MAX_TOKEN_BYTES} bytes")
    if any(c in token for c in "\r\n\0"):
        raise TokenError(f"the token from {where} holds a line break or NUL (one line expected)")
    return token


def _read_file(source: TokenSource) -> str:
    """A Kubernetes Secret mounted as a file: its text, one trailing newline stripped."""
    try:
        with open(source.path, "rb") as f:
            data = f.read(MAX_TOKEN_BYTES + 3)
    except OSError as exc:
        raise TokenError(
            f"cannot read the token file {source.path!r} ({source.origin}): {exc.strerror or exc}"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TokenError(f"the token file {source.path!r} ({source.origin}) is not UTF-8") from None
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


def _read_fd(fd: int) -> bytes:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        raise TokenError(f"{TOKEN_FD_FLAG} {fd} is not an open file descriptor") from None
    try:
        if not stat.S_ISFIFO(mode):
            raise TokenError(f"{TOKEN_FD_FLAG} {fd} is not a pipe")
        os.set_inheritable(fd, False)  # never into a child, even for the instant it is open
        chunks = []
        size = 0
        while size <= MAX_TOKEN_BYTES:
            chunk = os.read(fd, MAX_TOKEN_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def needs_reexec(token: str | None, token_fd: int | None, environ: Mapping[str, str]) -> bool:
    """Whether the token (or a pointer to it) sits in argv or the environment of this image.

    Never for an image started with ``--token-fd``: that is the re-exec'd one."""
    if token_fd is not None:
        return False
    return token is not None or TOKEN_ENV in environ or TOKEN_FILE_ENV in environ


def strip_token_flag(args: Sequence[str]) -> list[str]:
    """``args`` without ``--token VALUE`` / ``--token=VALUE``; everything else exactly as given.

    Abbreviations of ``--token`` are ambiguous with ``--token-file`` / ``--token-fd``, so argparse
    refuses them; the caller re-parses the result to make sure nothing else moved."""
    kept: list[str] = []
    skip_next = False
    for index, arg in enumerate(args):
        if skip_next:
            skip_next = False
        elif arg == "--":
            kept.extend(args[index:])
            break
        elif arg == TOKEN_FLAG:
            skip_next = True
        elif not arg.startswith(TOKEN_FLAG + "="):
            kept.append(arg)
    return kept


def interpreter_command() -> list[str]:
    """How this interpreter was started, up to the program's own arguments (``python -m
    task_executor``, or ``python /path/to/task-executor`` for the console script, interpreter
    flags included), with ``sys.executable`` first; ``python -m task_executor`` if unknown."""
    if not sys.executable:
        raise TokenError(
            "cannot re-exec to hide the token: the interpreter's path is unknown (empty "
            "sys.executable); start it by absolute path, or use --token-file"
        )
    original = list(getattr(sys, "orig_argv", None) or [])
    program_args = sys.argv[1:]
    head = len(original) - len(program_args)
    if head >= 1 and original[head:] == program_args:
        return [sys.executable, *original[1:head]]
    return [sys.executable, "-m", "task_executor"]


def scrubbed_environ(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}


def reexec_argv(args: Sequence[str], source: TokenSource | None, fd: int | None) -> list[str]:
    """The program arguments of the new image: the token flag gone, its hand-over appended."""
    new = strip_token_flag(args)
    if source is not None and source.kind == "value":
        assert fd is not None
        new += [TOKEN_FD_FLAG, str(fd)]
    elif source is not None and source.origin == TOKEN_FILE_ENV:
        new.append(f"{TOKEN_FILE_FLAG}={source.path}")  # "=": a path may start with "-"
    return new


def reexec_without_token(
    args: Sequence[str],
    source: TokenSource | None,
    environ: Mapping[str, str],
    check: Callable[[list[str]], None] = lambda new_args: None,
) -> None:
    """Replace this image (same pid) by one whose argv and environment hold no token.

    ``check`` sees the new program arguments first and may raise to refuse them. Never returns:
    ``execve`` replaces the process or raises OSError; the caller must not go on serving."""
    command = interpreter_command()
    fd = None
    if source is not None and source.kind == "value":
        token = _checked(source.value, source)
        read_end, write_end = os.pipe()
        try:
            os.write(write_end, token.encode("utf-8"))  # < pipe buffer
        finally:
            os.close(write_end)
        os.set_inheritable(read_end, True)
        fd = read_end
    try:
        new_args = reexec_argv(args, source, fd)
        check(new_args)
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        os.execve(command[0], command + new_args, scrubbed_environ(environ))
    finally:
        if fd is not None:
            os.close(fd)
