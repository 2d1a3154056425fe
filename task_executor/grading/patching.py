"""Applying the agent patch (test configuration left out) and force-applying the gold test patch.

Order matters for reward integrity: the agent patch goes first, minus the files that configure the
test run; then every file the gold test patch touches is put back to its base_commit state (or
removed, when the test patch creates it) and the test patch is applied on top. Whatever the agent
did to the held-out tests or the test configuration, the tests that run are the canonical ones.

The tree is the agent's: git and patch run on it inside the workspace's sandbox
(``workspaces.treegit``), and the executor's own reads and writes of it go through the confined
file API, so a planted symlink, FIFO or git config acts on nothing outside the workspace.
"""

from __future__ import annotations

import logging
import stat
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from task_executor.sandbox.confined import ConfinedTree, TooLarge
from task_executor.workspaces.gitcmd import git
from task_executor.workspaces.treegit import APPLY_FUNCTION, literal_pathspecs, run_in_tree
from task_executor.workspaces.workspace import Workspace

from .diffs import split_patch, touched_paths
from .testconfig import (
    MAX_SECTIONED_BYTES,
    SECTIONED_FILES,
    drop_test_config,
    is_forbidden_path,
    restore_test_sections,
)

log = logging.getLogger(__name__)


class PatchFailed(Exception):
    """A patch did not apply; the message carries the tools' output."""


class AgentPatchFailed(PatchFailed):
    """The agent's patch does not apply to base_commit (the agent's failure: reward 0)."""


class TestPatchFailed(PatchFailed):
    """The gold test patch does not apply after the agent's (the task's, or a test path the
    agent's patch made unresettable; the grader tells which)."""


class PatchStepFailed(Exception):
    """The sandboxed patch step never began its work (bubblewrap or the launcher failed, the
    tree was missing): nobody's verdict, an infrastructure fault."""


PATCH_STEP_TIMEOUT_S = 300.0
"""The most one patch step may take (less when the task's wall clock has less left)."""


@dataclass
class AgentPatchOutcome:
    applied: bool
    excluded_files: list[str] = field(default_factory=list)


# After the agent patch: every path the test patch touches goes (with any parent directory the
# agent replaced by a symlink or a file, which would send writes elsewhere), then the paths that
# exist at base_commit come back from it, then the test patch applies. In the sandbox, as the
# workspace: rm never follows a link out of the tree, and a planted file acts on nothing outside.
_RESET_TEST_PATHS = r"""
mapfile -d "" -t paths < "$DY_SCRATCH/test-paths"
for path in "${paths[@]}"; do
    prefix= rest=$path
    while [[ $rest == */* ]]; do
        prefix=${prefix:+$prefix/}${rest%%/*} rest=${rest#*/}
        [ -e "$prefix" ] || [ -L "$prefix" ] || break
        if [ -L "$prefix" ] || [ ! -d "$prefix" ]; then
            rm -f -- "$prefix" 2>>"$DY_SCRATCH/errors" || exit 4
            break
        fi
    done
    if [ -e "$path" ] || [ -L "$path" ]; then
        rm -rf -- "$path" 2>>"$DY_SCRATCH/errors" || exit 4
    fi
done
"""


# What the step's script says of itself. bubblewrap exits 1 when it cannot set the sandbox up,
# the launcher 125: so the script's own failures use codes neither produces, the step proves it
# began (``StepOutcome.started``), and the script marks in the scratch directory that the agent's
# patch applied (a step killed after that mark, by the timeout or the kernel, died on the test
# patch; before it, on the agent's).
_AGENT_FAILED, _RESET_FAILED, _TEST_FAILED = 11, 14, 15
_AGENT_APPLIED = "agent-applied"
_TREE_UNREACHABLE = 3  # the prelude's


def _apply_both(workspace: Workspace, agent_patch: str | None, test_patch: str | None,
                test_paths: list[str], at_base: list[str], timeout: float) -> None:
    """Apply the agent patch, then reset the test patch's paths and force-apply it, in one
    sandboxed step (git, then GNU patch with fuzz, as SWE-bench's harness does)."""
    inputs: dict[str, bytes] = {}
    script = APPLY_FUNCTION
    if agent_patch is not None:
        inputs["agent.diff"] = agent_patch.encode("utf-8", "surrogateescape")
        script += f'apply_patch "$DY_SCRATCH/agent.diff" || exit {_AGENT_FAILED}\n'
    script += f': > "$DY_SCRATCH/{_AGENT_APPLIED}"\n'
    if test_patch is not None:
        inputs["test.diff"] = test_patch.encode("utf-8", "surrogateescape")
        inputs["test-paths"] = b"".join(p.encode("utf-8", "surrogateescape") + b"\0"
                                        for p in test_paths)
        # What the agent patch's attempts printed is not the test patch's error.
        script += ': > "$DY_SCRATCH/errors"\n' + _RESET_TEST_PATHS
        if at_base:
            inputs["checkout"] = literal_pathspecs(at_base)
            script += (
                'mapfile -d "" -t paths < "$DY_SCRATCH/checkout"\n'
                'g read-tree "$DY_BASE" && g checkout "$DY_BASE" -- "${paths[@]}" '
                f'2>>"$DY_SCRATCH/errors" || exit {_RESET_FAILED}\n'
            )
        script += f'apply_patch "$DY_SCRATCH/test.diff" || exit {_TEST_FAILED}\n'
    outcome = run_in_tree(workspace, script, inputs=inputs,
                          outputs=("errors", _AGENT_APPLIED), timeout=timeout,
                          env={"DY_BASE": workspace.base_commit})
    if outcome.exit_code == 0 and _AGENT_APPLIED in outcome.files:
        return
    errors = outcome.files.get("errors", b"").decode("utf-8", "replace").strip()
    told = (errors or outcome.output.strip())[-4000:]
    if not outcome.started:
        # What bubblewrap said names host paths: the log gets it, the result does not.
        log.error("the patch step's sandbox did not start (exit status %s): %s",
                  outcome.exit_code, outcome.output.strip()[-2000:])
        raise PatchStepFailed(f"the patch step's sandbox did not start (exit status "
                              f"{outcome.exit_code}; the executor's log has its output)")
    if outcome.exit_code == _TREE_UNREACHABLE:  # a fresh tree, no code of the agent's ran yet
        raise PatchStepFailed("the patch step could not enter the tree")
    if outcome.timed_out:
        told = f"applying took longer than {timeout:.0f} s"
    elif outcome.exit_code not in (_AGENT_FAILED, _RESET_FAILED, _TEST_FAILED):
        told = f"the patch step died (exit status {outcome.exit_code}): {told}"
    if _AGENT_APPLIED not in outcome.files:
        raise AgentPatchFailed(told or "patch does not apply")
    if outcome.exit_code == _RESET_FAILED:
        raise TestPatchFailed(f"restoring test files to base failed: {errors[-2000:]}")
    raise TestPatchFailed(told or "patch does not apply")


def _show_at(workspace: Workspace, path: str) -> str | None:
    """A file's content at base_commit, read from the executor's mirror (never the tree)."""
    proc = git(["--git-dir", str(workspace.mirror), "show", f"{workspace.base_commit}:{path}"],
               check=False)
    if proc.returncode != 0:
        return None
    return proc.stdout.decode("utf-8", "surrogateescape")


def _existing_at_base(workspace: Workspace, paths: list[str]) -> list[str]:
    """Those of ``paths`` that exist at the base commit: one ``ls-tree`` for them all (paths
    taken literally; ``-t``: a directory shown even when a path below it is listed too), else,
    if git refuses a path there (one that leaves the tree), one lookup per path."""
    mirror, base = str(workspace.mirror), workspace.base_commit
    listed = git(["--literal-pathspecs", "--git-dir", mirror, "ls-tree", "-z", "-t",
                  "--name-only", base, "--", *paths], check=False)
    if listed.returncode == 0:
        found = {name.decode("utf-8", "surrogateescape")
                 for name in listed.stdout.split(b"\0") if name}
        return [path for path in paths if path in found]
    return [path for path in paths
            if git(["--git-dir", mirror, "cat-file", "-e", f"{base}:{path}"],
                   check=False).returncode == 0]


def apply_patches(workspace: Workspace, patch_text: str, test_patch: str,
                  timeout: float = PATCH_STEP_TIMEOUT_S) -> AgentPatchOutcome:
    """Apply the agent's patch minus test configuration, then force the gold test patch
    (AgentPatchFailed, TestPatchFailed; PatchStepFailed when the sandbox never ran the step),
    in one sandboxed step for both (a launch costs milliseconds), within ``timeout`` seconds,
    with the test-configuring sections of setup.cfg / pyproject.toml put back afterwards in the
    files the test patch leaves alone."""
    agent_text, agent_outcome, sectioned = None, AgentPatchOutcome(applied=False), set()
    if patch_text.strip():
        preamble, sections = split_patch(patch_text)
        if not sections:
            raise AgentPatchFailed("the patch contains no file changes (not a unified diff)")
        kept, excluded = drop_test_config(sections)
        sectioned = {p for section in kept for p in section.paths
                     if PurePosixPath(p).name in SECTIONED_FILES}
        if kept:
            agent_text = preamble + "".join(section.text for section in kept)
        agent_outcome = AgentPatchOutcome(applied=True, excluded_files=excluded)
    test_text, test_paths, at_base = None, [], []
    if test_patch.strip():
        test_text, test_paths = test_patch, sorted(touched_paths(test_patch))
        for path in test_paths:
            if is_forbidden_path(path):
                raise TestPatchFailed(f"test patch touches {path}")
        # Parents cleared in the tree that exist at base come back with the files under them.
        at_base = _existing_at_base(workspace, test_paths)
    if agent_text is not None or test_text is not None:
        _apply_both(workspace, agent_text, test_text, test_paths, at_base, timeout)
    reset = set(test_paths)
    for path in sorted(sectioned):
        # A file the test patch touches is base + test patch now: its sections are canonical.
        if path in reset or _restore_sections(workspace, path):
            agent_outcome.excluded_files.append(path)
    agent_outcome.excluded_files = sorted(set(agent_outcome.excluded_files))
    return agent_outcome


def _restore_sections(workspace: Workspace, path: str) -> bool:
    """Put the test-configuring sections of setup.cfg / pyproject.toml back; True if changed.

    A patched file that is not a regular file (the patch made it a symlink) is replaced by its
    base content outright: its test sections are the base's either way.
    """
    name = PurePosixPath(path).name
    base = _show_at(workspace, path)
    with ConfinedTree(workspace.path) as tree:
        patched: str | None = None
        planted = False
        if tree.exists(path):
            info = tree.lstat(path)
            if stat.S_ISREG(info.st_mode) and info.st_size <= MAX_SECTIONED_BYTES:
                try:
                    patched = tree.read_bytes(path, MAX_SECTIONED_BYTES).decode(
                        "utf-8", "surrogateescape")
                except TooLarge:  # it grew after the lstat: the agent's, not read
                    planted = True
                    tree.remove(path)
            else:
                planted = True
                tree.remove(path)
        if patched is None:
            if base is None:
                return planted
            restored, changed = restore_test_sections(name, base, "")
            if changed or planted:
                tree.write_bytes(path, restored.encode("utf-8", "surrogateescape"),
                                 owner=workspace.factory.sandbox.owner)
            return changed or planted
        restored, changed = restore_test_sections(name, base or "", patched)
        if changed:
            tree.write_bytes(path, restored.encode("utf-8", "surrogateescape"),
                             owner=workspace.factory.sandbox.owner)
        return changed
