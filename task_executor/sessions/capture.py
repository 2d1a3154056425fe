"""Capturing what an agent changed in a session's tree, as one patch against base_commit.

New, deleted, renamed and binary files are included (``git add -A`` into a throwaway index, so
the agent's own index, commits or stashes change nothing); files ``.gitignore`` names are not.
Test-configuration files are left out of the patch and reported (Sandman A45: extraction with
``git add -A`` once picked up a planted test configuration file and passed a non-fix).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from task_executor.grading.diffs import split_patch
from task_executor.grading.testconfig import drop_test_config
from task_executor.workspaces.treegit import run_in_tree
from task_executor.workspaces.workspace import Workspace


@dataclass
class CapturedPatch:
    patch: str
    excluded_files: list[str] = field(default_factory=list)


_CAPTURE = r"""
g read-tree "$DY_BASE" 2>>"$DY_SCRATCH/errors" || exit 5
mapfile -d '' -t excluded < "$DY_SCRATCH/excluded"
g add -A -- . "${excluded[@]}" 2>>"$DY_SCRATCH/errors" || exit 6
g diff --cached --binary --no-color --no-ext-diff --find-renames "$DY_BASE" \
    > "$DY_SCRATCH/patch" 2>>"$DY_SCRATCH/errors" || exit 7
"""


class CaptureFailed(Exception):
    """git could not read the tree (the message carries its error)."""


def capture_patch(workspace: Workspace) -> CapturedPatch:
    """The tree's changes against ``base_commit``, read through the executor's own mirror.

    git runs inside the workspace's sandbox with the mirror (read-only) as its repository and the
    tree as its work tree, so nothing the agent did to the tree's ``.git`` (config with
    fsmonitor or filters, hooks, a deleted directory) is consulted, and a symlink or FIFO in the
    tree is read as what it is, never followed on the host; new objects go to a scratch
    directory, never into the mirror.
    """
    excluded = b"".join(
        f":(exclude,literal){name}".encode("utf-8", "surrogateescape") + b"\0"
        for name in workspace.artifacts
    )
    outcome = run_in_tree(workspace, _CAPTURE, inputs={"excluded": excluded},
                          outputs=("patch", "errors"), env={"DY_BASE": workspace.base_commit})
    if outcome.exit_code != 0 or "patch" not in outcome.files:
        errors = outcome.files.get("errors", b"").decode("utf-8", "replace")
        raise CaptureFailed(f"capturing the diff failed ({outcome.exit_code}): {errors[-2000:]}")
    diff = outcome.files["patch"].decode("utf-8", "surrogateescape")
    preamble, sections = split_patch(diff)
    kept, dropped = drop_test_config(sections)
    return CapturedPatch(
        patch=preamble + "".join(section.text for section in kept), excluded_files=dropped
    )
