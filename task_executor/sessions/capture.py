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
agent's own ``.gitattributes`` forces to a text diff. So are FIFOs, sockets and devices (no git
patch holds one).

Whatever the agent did to its tree, capture gives an answer: what the tree's owner can make
readable is made readable first (``git add -A`` refuses an unreadable file and silently skips an
unreadable directory); a tree git still cannot read is ``CaptureFailed``, the agent's doing,
which its finish turns into a verdict, as is a tree too large to read within
:data:`CAPTURE_TIMEOUT_S` (finish stops every process of the session first, so nothing but the
tree decides how long the step takes, or whether it can start). Only a step the sandbox never
started (or one killed from outside) is ``CaptureUnavailable`` (503, retryable): the executor's
failure must never become a verdict.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field

from sandbox_client.protocol import is_utf8
from task_executor.errors import Unavailable
from task_executor.grading.diffs import split_patch
from task_executor.grading.testconfig import drop_test_config
from task_executor.workspaces.treegit import WorkspaceFull, literal_pathspecs, run_in_tree
from task_executor.workspaces.workspace import Workspace


@dataclass
class CapturedPatch:
    patch: str
    excluded_files: list[str] = field(default_factory=list)


# One walk of the tree (its .git left alone), in the same step: directories the owner may not
# list or enter get u+rx and are walked in turn (as many rounds as such directories nest: one
# walk of each part of the tree in all), files it may not read get u+r -- never u+x, which git
# would record as a mode change -- and FIFOs, sockets and devices are listed, to be left out.
_PREPARE = r"""
: > "$DY_SCRATCH/special"
printf '.\0' > "$DY_SCRATCH/roots"
depth=0
while [ -s "$DY_SCRATCH/roots" ]; do
    find -files0-from "$DY_SCRATCH/roots" -mindepth "$depth" \( -path ./.git -prune \) -o \
        \( -type d ! -perm -u=rx -printf 'd%p\0' -prune \) -o \
        \( -type f ! -perm -u=r -exec chmod u+r -- {} + \) -o \
        \( ! -type d ! -type f ! -type l -printf 's%p\0' \) > "$DY_SCRATCH/found" 2>/dev/null
    mapfile -d '' -t found < "$DY_SCRATCH/found"
    : > "$DY_SCRATCH/roots"
    for entry in "${found[@]}"; do
        case $entry in
            d*) printf '%s\0' "${entry:1}" >> "$DY_SCRATCH/roots" ;;
            *) printf '%s\0' "${entry:3}" >> "$DY_SCRATCH/special" ;;
        esac
    done
    xargs -0 -r chmod u+rx -- < "$DY_SCRATCH/roots" 2>/dev/null
    depth=1
done
"""
_STAGE = _PREPARE + r"""
g read-tree "$DY_BASE" 2>>"$DY_SCRATCH/errors" || exit 5
mapfile -d '' -t excluded < "$DY_SCRATCH/excluded"
mapfile -d '' -t special < "$DY_SCRATCH/special"
g add -A -- . "${excluded[@]}" "${special[@]/#/:(exclude,literal)}" \
    2>>"$DY_SCRATCH/errors" || exit 6
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
_TREE_FAULTS = {3: "entering the tree", 5: "reading the base", 6: "indexing the tree",
                7: "diffing the tree"}
"""Exit statuses only the scripts give, each after git (or cd) failed on what the tree holds."""


CAPTURE_TIMEOUT_S = 300.0
"""How long one capture step may take once started. A tree a real fix leaves is read in well
under a second; millions of files made to outlast this are the agent's doing, and a verdict."""


class CaptureFailed(Exception):
    """git could not read the tree, even after making it readable: the agent's doing (the
    message carries git's error, no host path)."""


class CaptureUnavailable(Unavailable):
    """The capture step never ran (the sandbox failed to start it, or it timed out before it
    began), or was killed from outside: the executor's failure, not the agent's; the session
    is kept, finish may be retried."""

    code = "capture_unavailable"


def capture_patch(workspace: Workspace, exclude_paths: Sequence[str] = ()) -> CapturedPatch:
    """The tree's changes against ``base_commit``, read through the executor's own mirror.

    git runs inside the workspace's sandbox with the mirror (read-only) as its repository and the
    tree as its work tree, so nothing the agent did to the tree's ``.git`` (config with
    fsmonitor or filters, hooks, a deleted directory) is consulted, and a symlink or FIFO in the
    tree is read as what it is, never followed on the host; new objects go to a scratch
    directory, never into the mirror.

    ``exclude_paths`` (fnmatch patterns relative to the tree; a pattern naming a directory
    covers what is below it) leave files out of the patch; they are listed in
    ``excluded_files``.
    """
    excluded = b"".join(
        f":(exclude,literal){name}".encode("utf-8", "surrogateescape") + b"\0"
        for name in workspace.artifacts
    )
    text, special = _diff(workspace, _CAPTURE, {"excluded": excluded})
    preamble, sections = split_patch(text)
    kept, dropped = drop_test_config(sections)
    undecodable = [section for section in kept if not is_utf8(section.text)]
    if undecodable:
        only = literal_pathspecs(sorted({p for section in undecodable for p in section.paths}))
        text, _ = _diff(workspace, _CAPTURE_BINARY, {"excluded": excluded, "only": only})
        _, binary = split_patch(text)
        kept = [section for section in kept if is_utf8(section.text)]
        kept += [section for section in binary if is_utf8(section.text)]
        kept.sort(key=lambda section: min(section.paths))  # git's order: by path
        dropped = sorted({*dropped, *(p for s in binary if not is_utf8(s.text) for p in s.paths)})
    if exclude_paths:
        wanted = [not any(_excluded(p, exclude_paths) for p in s.paths) for s in kept]
        unwanted = [section for section, keep in zip(kept, wanted, strict=True) if not keep]
        kept = [section for section, keep in zip(kept, wanted, strict=True) if keep]
        dropped = sorted({*dropped, *(p for section in unwanted for p in section.paths)})
    return CapturedPatch(
        patch=preamble + "".join(section.text for section in kept),
        excluded_files=sorted({*dropped, *special}),
    )


def _excluded(path: str, patterns: Sequence[str]) -> bool:
    """Whether ``path`` or a directory above it matches one of ``patterns``."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatchcase(prefix, pattern.strip("/"))
               for prefix in prefixes for pattern in patterns)


def _diff(workspace: Workspace, script: str, inputs: dict[str, bytes]) -> tuple[str, list[str]]:
    """(the patch, the special files left out of it)."""
    try:
        outcome = run_in_tree(workspace, script, inputs=inputs,
                              outputs=("patch", "errors", "special"),
                              env={"DY_BASE": workspace.base_commit}, timeout=CAPTURE_TIMEOUT_S,
                              own_group=True)
    except WorkspaceFull as exc:
        raise CaptureFailed(f"the tree's changes could not be captured: {exc}") from None
    if outcome.exit_code == 0 and "patch" in outcome.files:
        special = [name.decode("utf-8", "surrogateescape")
                   for name in outcome.files.get("special", b"").split(b"\0") if name]
        return outcome.files["patch"].decode("utf-8", "surrogateescape"), special
    errors = _without_host_paths(outcome.files.get("errors", b"").decode("utf-8", "replace"),
                                 workspace)
    if outcome.started and outcome.timed_out:
        # Nothing of the session runs by now (finish stopped it): only the tree takes this long.
        raise CaptureFailed(f"the tree's changes could not be captured within "
                            f"{CAPTURE_TIMEOUT_S:g} s (too many files to read)")
    if outcome.started and outcome.exit_code in _TREE_FAULTS:
        raise CaptureFailed(f"the tree's changes could not be captured "
                            f"({_TREE_FAULTS[outcome.exit_code]}): {errors.strip()[-2000:]}")
    # bwrap's own exit 1, the wrapper's 125, a timeout, a kill: nothing the tree decided.
    why = "timed out" if outcome.exit_code is None else f"exited {outcome.exit_code}"
    raise CaptureUnavailable(
        f"the capture step {why} before git could run"
        if not outcome.started else f"the capture step {why}", retry_after=5)


def _without_host_paths(text: str, workspace: Workspace) -> str:
    """git's errors as the agent may see them: unsandboxed, they name host paths."""
    for host, shown in ((workspace.root, "<workspace>"), (workspace.mirror, "<repository>")):
        text = text.replace(str(host), shown)
    return text
