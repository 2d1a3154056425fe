"""Capturing what an agent changed in a session's tree, as one patch against base_commit.

New, deleted, renamed and binary files are included (``git add -A`` into a throwaway index, so
the agent's own index, commits or stashes change nothing); files ``.gitignore`` names are not.
Test-configuration files are left out of the patch and reported (Sandman A45: extraction with
``git add -A`` once picked up a planted test configuration file and passed a non-fix).

The patch is always valid UTF-8 text, so it survives JSON and every consumer that stores patches
as strings (SWE-bench's ``model_patch``), and still carries every byte: a file whose diff is not
UTF-8 (latin-1 contents) is diffed again as a GIT binary patch (base85 of the exact bytes, which
``git apply`` applies and SWE-bench's harness applies with it), and file names that are not
UTF-8 come C-quoted by git (``"caf\\351.txt"``). Only what no git patch can carry as text is
left out and listed in ``excluded_files``: a symlink whose target is not UTF-8, or a file the
agent's own ``.gitattributes`` forces to a text diff.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sandbox_client.protocol import is_utf8
from task_executor.grading.diffs import split_patch
from task_executor.grading.testconfig import drop_test_config
from task_executor.workspaces.treegit import literal_pathspecs, run_in_tree
from task_executor.workspaces.workspace import Workspace


@dataclass
class CapturedPatch:
    patch: str
    excluded_files: list[str] = field(default_factory=list)


_STAGE = r"""
g read-tree "$DY_BASE" 2>>"$DY_SCRATCH/errors" || exit 5
mapfile -d '' -t excluded < "$DY_SCRATCH/excluded"
g add -A -- . "${excluded[@]}" 2>>"$DY_SCRATCH/errors" || exit 6
"""
_CAPTURE = _STAGE + r"""
g diff --cached --binary --no-color --no-ext-diff --find-renames "$DY_BASE" \
    > "$DY_SCRATCH/patch" 2>>"$DY_SCRATCH/errors" || exit 7
"""
# The same files again, every one as binary (renames as a deletion and an addition: a binary
# rename may pair differently); only the paths whose text diff is not UTF-8 are asked for.
_CAPTURE_BINARY = _STAGE + r"""
mapfile -d '' -t only < "$DY_SCRATCH/only"
printf '* binary\n' > "$DY_SCRATCH/attributes"
g -c core.attributesFile="$DY_SCRATCH/attributes" diff --cached --binary --no-color \
    --no-ext-diff --no-renames "$DY_BASE" -- "${only[@]}" \
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
    preamble, sections = split_patch(_diff(workspace, _CAPTURE, {"excluded": excluded}))
    kept, dropped = drop_test_config(sections)
    undecodable = [section for section in kept if not is_utf8(section.text)]
    if undecodable:
        only = literal_pathspecs(sorted({p for section in undecodable for p in section.paths}))
        _, binary = split_patch(
            _diff(workspace, _CAPTURE_BINARY, {"excluded": excluded, "only": only})
        )
        kept = [section for section in kept if is_utf8(section.text)]
        kept += [section for section in binary if is_utf8(section.text)]
        kept.sort(key=lambda section: min(section.paths))  # git's order: by path
        dropped = sorted({*dropped, *(p for s in binary if not is_utf8(s.text) for p in s.paths)})
    return CapturedPatch(
        patch=preamble + "".join(section.text for section in kept), excluded_files=dropped
    )


def _diff(workspace: Workspace, script: str, inputs: dict[str, bytes]) -> str:
    outcome = run_in_tree(workspace, script, inputs=inputs, outputs=("patch", "errors"),
                          env={"DY_BASE": workspace.base_commit})
    if outcome.exit_code != 0 or "patch" not in outcome.files:
        errors = outcome.files.get("errors", b"").decode("utf-8", "replace")
        raise CaptureFailed(f"capturing the diff failed ({outcome.exit_code}): {errors[-2000:]}")
    return outcome.files["patch"].decode("utf-8", "surrogateescape")
