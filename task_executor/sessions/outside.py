"""Files outside the working tree (``/tmp/x``, ``/root/tools/bin/foo``, ``/usr/local/...``) and
directory uploads, read and written *inside* the session's sandbox, as the sandbox user.

The executor never opens such a path itself: on the host it means something else (or nothing),
and whatever the session's code planted there (a symlink ``/tmp/x -> /etc``, a link to the host
path of the executor's base directory) would be followed by the executor's own privileges. So
each call starts a short-lived process in the workspace's sandbox (the same mounts the session's
shell sees: its tree, its ``/tmp``, its copy-on-write runtime directories, the host root
read-only, the executor's directories hidden) which reads, writes or extracts, and the kernel
resolves every path there exactly as it would for the session's own code. A write the sandbox
may not make is refused with 403 ``path_not_writable``.

Without a sandbox (no bubblewrap) there is no such user to act as: paths outside the tree stay
refused (403 ``path_outside_workspace``), and uploads with them.

Limits: ``/dev/shm`` and ``/run`` are private to each sandboxed process tree, so a file written
there is not the one the session's shell sees.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass

from task_executor.errors import Forbidden, InvalidRequest, NotFound
from task_executor.sandbox.confined import PathOutsideTree
from task_executor.workspaces.workspace import Workspace

HELPER_TIMEOUT_S = 60.0

_READ = r"""
p=$1
[ -e "$p" ] || exit 44
[ -d "$p" ] && exit 46
[ -f "$p" ] || exit 45
[ -r "$p" ] || exit 43
[ "$(stat -c %s -- "$p")" -le "$2" ] || exit 47
exec head -c "$(($2 + 1))" -- "$p"
"""
# head, not cat: the agent can swap the file for a larger one between the stat and the read
# (a sparse 20 GB file costs it nothing); one byte past the cap says it did.
_WRITE = r"""
p=$1
case $p in */) exit 46 ;; esac
d=${p%/*}
[ -d "${d:-/}" ] || mkdir -p -- "$d" 2>/dev/null || exit 43
[ -d "$p" ] && exit 46
if [ -e "$p" ] && [ ! -f "$p" ]; then exit 45; fi
{ cat > "$p"; } 2>/dev/null || exit 43
"""
_EXTRACT = r"""
d=$1
[ -d "$d" ] || mkdir -p -- "$d" 2>/dev/null || exit 43
[ -d "$d" ] || exit 45
tar -x -p --no-same-owner -C "$d" -f - >&2 || exit 42
"""


class PathNotWritable(Forbidden):
    code = "path_not_writable"


class PathNotReadable(Forbidden):
    code = "path_not_readable"


@dataclass(frozen=True)
class SandboxFiles:
    """File access in one session's sandbox."""

    workspace: Workspace
    deny_network: bool

    def read(self, path: str, cap: int) -> bytes:
        code, out, _ = self._run(_READ, [path, str(cap)], b"")
        if code == 0 and len(out) > cap:
            code = 47  # it grew past the cap after the size check
        if code != 0:
            _refuse(code, path, writing=False)
        return out

    def write(self, path: str, data: bytes) -> None:
        code, _, _ = self._run(_WRITE, [path], data)
        if code != 0:
            _refuse(code, path, writing=True)

    def extract(self, directory: str, tar: bytes) -> None:
        code, _, err = self._run(_EXTRACT, [directory], tar)
        if code == 42:
            raise PathNotWritable(
                f"the archive could not be extracted into {directory!r} as the sandbox user: "
                f"{_tidy(err)}")
        if code != 0:
            _refuse(code, directory, writing=True)

    def _run(self, script: str, args: list[str], data: bytes) -> tuple[int | None, bytes, bytes]:
        workspace = self.workspace
        if not workspace.factory.sandbox.active:
            raise PathOutsideTree("{path} is outside the working tree (no sandbox to reach it "
                                  "from)", args[0])
        proc = workspace.launcher(self.deny_network).popen(
            ["bash", "--noprofile", "--norc", "-c", script, "dockyard-file", *args],
            # The host's tools, from directories no layer of the workspace can write (a `cat`
            # the agent put first on its PATH would only lie to its own client, but still).
            cwd=str(workspace.path), env={**workspace.sandbox_env({}), "PATH": "/usr/bin:/bin"},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(data, timeout=HELPER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # Its own group: the wrapper, then bwrap, whose death ends its PID namespace.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise PathNotWritable(f"{args[0]!r}: the sandbox did not answer within "
                                  f"{HELPER_TIMEOUT_S:g} s (a FIFO?)") from None
        return proc.returncode, out, err


def _refuse(code: int | None, path: str, *, writing: bool) -> None:
    if code == 44:
        raise NotFound(f"{path!r} does not exist", code="file_not_found")
    if code == 45:
        raise InvalidRequest(f"{path!r} is not a regular file", code="not_a_regular_file")
    if code == 46:
        raise InvalidRequest(f"{path!r} is a directory", code="is_a_directory")
    if code == 47:
        raise InvalidRequest(f"{path!r} is too large to read", code="too_large")
    if writing:
        raise PathNotWritable(f"the sandbox may not write {path!r}")
    raise PathNotReadable(f"the sandbox may not read {path!r}")


def _tidy(err: bytes) -> str:
    return err.decode("utf-8", "replace").strip()[-2000:]
