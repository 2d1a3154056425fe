"""git and GNU patch on a workspace's tree, run inside the workspace's sandbox, never on the host.

A tree belongs to code under test: any file in it may be a symlink to a host file, a FIFO, or a
``.git/config`` naming an fsmonitor command. Run on the host as the executor, ``git apply``,
``git checkout`` or ``patch`` would follow, block or execute them with the executor's privileges.
Run here they act with the workspace's own credentials on the workspace's own view (the host
read-only, nothing of the executor visible), so the worst a planted file does is fail the step.

Git reads only what the executor controls: the repository is the executor's mirror (bound
read-only at ``REPO_MOUNT``), the index and new objects go to a private scratch directory (bound
for this one run, not shared with the session's shell), hooks are off and no user or system
config is read. What the step prints is collected in files there, read back through the confined
file API.
"""

from __future__ import annotations

import errno
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from task_executor.sandbox.command import run_command
from task_executor.sandbox.confined import ConfinedTree
from task_executor.sandbox.isolation import REPO_MOUNT, Bind

from .fsutil import remove_tree
from .gitcmd import git_env

if TYPE_CHECKING:
    from .workspace import Workspace, WorkspaceFactory

SCRATCH_MOUNT = "/run/dockyard/scratch"

# Shared by every script: git on the mirror with the tree as work tree, nothing else consulted.
# The step starts in its scratch directory, not in the tree: the tree's root is its code's to
# chmod (000), and the owner may always enter it again, where bwrap could not (exit 1).
# Its first line proves the step started: bwrap exits 1 on its own setup failures and the
# wrapper 125, statuses a script's own may share, so the exit status alone cannot tell "the
# sandbox failed" (the executor's fault) from "git failed on the tree".
STARTED = "started"
_PRELUDE = r"""
: > "$DY_SCRATCH/started" || exit 125
set -u
export GIT_DIR="$DY_REPO" GIT_WORK_TREE="$DY_TREE" GIT_INDEX_FILE="$DY_SCRATCH/index"
export GIT_OBJECT_DIRECTORY="$DY_SCRATCH/objects"
export GIT_ALTERNATE_OBJECT_DIRECTORIES="$DY_REPO/objects"
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME=/dev/null
g() { git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.autocrlf=false \
          -c core.bare=false -c safe.directory='*' "$@"; }
cd "$DY_TREE" 2>/dev/null || { chmod u+rx -- "$DY_TREE" && cd "$DY_TREE"; } \
    2>>"$DY_SCRATCH/errors" || exit 3
"""

# Apply one patch file: git, then git ignoring whitespace, then GNU patch with fuzz (as
# SWE-bench's harness does). A failed attempt leaves no half: git apply checks every hunk before
# it writes anything (no --check run first: a process less), patch gets a dry run.
APPLY_FUNCTION = r"""
apply_patch() {
    for opts in "" "--ignore-whitespace --recount"; do
        g apply --whitespace=nowarn $opts "$1" 2>>"$DY_SCRATCH/errors" && return 0
    done
    if command -v patch >/dev/null; then
        set -- "$1" --batch --fuzz=5 -p1 --forward --no-backup-if-mismatch
        if patch "${@:2}" --dry-run -i "$1" >>"$DY_SCRATCH/errors" 2>&1; then
            patch "${@:2}" -i "$1" >>"$DY_SCRATCH/errors" 2>&1 && return 0
        fi
    fi
    return 1
}
"""


class WorkspaceFull(Exception):
    """The workspace's tmpfs has no room for a step's scratch files: what its code wrote
    filled it (the message names no host path)."""


@dataclass(frozen=True)
class StepOutcome:
    exit_code: int | None
    files: dict[str, bytes]
    """The scratch files the step was asked to hand back (missing ones are absent)."""
    output: str
    started: bool
    """Whether the script itself ran (its first line did): False means the sandbox failed."""
    timed_out: bool = False


def run_in_tree(
    workspace: Workspace,
    script: str,
    *,
    inputs: dict[str, bytes] | None = None,
    outputs: tuple[str, ...] = ("errors",),
    env: dict[str, str] | None = None,
    timeout: float = 300.0,
    max_output_bytes: int = 256 * 1024 * 1024,
    own_group: bool = False,
) -> StepOutcome:
    """Run ``script`` (bash, after the git prelude) on the workspace's tree in its sandbox.

    ``inputs`` are written to the scratch directory first (patches, path lists); ``outputs`` are
    read back from it afterwards. With ``own_group`` the step runs in a cgroup of its own with
    a workspace's limits, not in the workspace's (see below).
    """
    factory = workspace.factory
    # In the workspace's own tmpfs, apart from its /tmp (which the session's shell shares).
    scratch = workspace.rw / f"scratch-{uuid.uuid4().hex[:12]}"
    # A session's group may be full of what its code left (tmpfs inodes and pages stay charged
    # to it when every process is gone), and finish's capture launched there was OOM-killed at
    # once, a 503 at every retry. (A fresh tree's steps need no group of their own: a few ms.)
    group = None
    if own_group and factory.groups is not None:
        group = factory.groups.create(f"step-{scratch.name}")
    try:
        _make_scratch(scratch, inputs or {}, factory)
        if factory.sandbox.active:
            paths = {"DY_REPO": REPO_MOUNT, "DY_TREE": workspace.visible_path,
                     "DY_SCRATCH": SCRATCH_MOUNT}
            launcher = workspace.launcher(False, binds=(
                Bind(workspace.mirror, REPO_MOUNT, writable=False),
                Bind(scratch, SCRATCH_MOUNT),
            ), chdir=SCRATCH_MOUNT, group=group)
        else:
            paths = {"DY_REPO": str(workspace.mirror), "DY_TREE": str(workspace.path),
                     "DY_SCRATCH": str(scratch)}
            launcher = workspace.launcher(False, group=group)
        # The host's git and patch, from directories no layer of the workspace can write.
        full_env = {**git_env(), "PATH": "/usr/bin:/bin", **paths,
                    **(env or {})}
        outcome = run_command(_PRELUDE + script, cwd=str(scratch), env=full_env,
                              timeout=timeout, launcher=launcher)
        files = {}
        with ConfinedTree(scratch) as view:
            started = view.exists(STARTED)
            for name in outputs:
                if view.exists(name):
                    files[name] = view.read_bytes(name, max_output_bytes)
        return StepOutcome(exit_code=outcome.exit_code, files=files, output=outcome.output,
                           started=started, timed_out=outcome.timed_out)
    finally:
        remove_tree(scratch)
        if group is not None:
            factory.release_group(group)


def _make_scratch(scratch: Path, inputs: dict[str, bytes], factory: WorkspaceFactory) -> None:
    """The step's scratch directory with its inputs, given to the sandbox uid; WorkspaceFull
    when the workspace's tmpfs has no room (no inode or block left: its code's doing)."""
    try:
        scratch.mkdir(mode=0o700)
        (scratch / "objects" / "info").mkdir(parents=True)  # git's, made here: an exec less
        for made in (scratch, scratch / "objects", scratch / "objects" / "info"):
            factory.hand_over(made)
        for name, data in inputs.items():
            (scratch / name).write_bytes(data)
            factory.hand_over(scratch / name)  # (no chown -R: a process less per step)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise WorkspaceFull("the workspace's disk is full (no room for the step's "
                                "scratch files)") from None
        raise


def literal_pathspecs(paths: list[str]) -> bytes:
    """NUL-separated ``:(literal)`` pathspecs, for ``xargs -0`` (names may hold anything)."""
    return b"".join(f":(literal){p}".encode("utf-8", "surrogateescape") + b"\0" for p in paths)

