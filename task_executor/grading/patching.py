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

import stat
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from task_executor.sandbox.confined import ConfinedTree, Refusal
from task_executor.workspaces.gitcmd import git
from task_executor.workspaces.treegit import APPLY_FUNCTION, literal_pathspecs, run_in_tree
from task_executor.workspaces.workspace import Workspace

from .diffs import split_patch, touched_paths
from .testconfig import (
    SECTIONED_FILES,
    drop_test_config,
    is_forbidden_path,
    restore_test_sections,
)

MAX_CONFIG_BYTES = 16 * 1024 * 1024


class PatchFailed(Exception):
    """A patch did not apply; the message carries the tools' output."""


@dataclass
class AgentPatchOutcome:
    applied: bool
    excluded_files: list[str] = field(default_factory=list)


def _apply(workspace: Workspace, patch_text: str, checkout: list[str] | None = None) -> None:
    """Apply a patch in the sandbox (git, then GNU patch with fuzz, as SWE-bench's harness does),
    after restoring ``checkout`` paths to base_commit; PatchFailed with the tools' output."""
    inputs = {"patch.diff": patch_text.encode("utf-8", "surrogateescape")}
    script = APPLY_FUNCTION
    if checkout:
        inputs["checkout"] = literal_pathspecs(checkout)
        script += (
            'mapfile -d "" -t paths < "$DY_SCRATCH/checkout"\n'
            'g read-tree "$DY_BASE" && g checkout "$DY_BASE" -- "${paths[@]}" '
            '2>>"$DY_SCRATCH/errors" || exit 4\n'
        )
    script += 'apply_patch "$DY_SCRATCH/patch.diff" || exit 1\n'
    outcome = run_in_tree(workspace, script, inputs=inputs,
                          env={"DY_BASE": workspace.base_commit})
    if outcome.exit_code == 0:
        return
    errors = outcome.files.get("errors", b"").decode("utf-8", "replace").strip()
    if outcome.exit_code == 4:
        raise PatchFailed(f"restoring test files to base failed: {errors[-2000:]}")
    raise PatchFailed((errors or outcome.output.strip())[-4000:] or "patch does not apply")


def _show_at(workspace: Workspace, path: str) -> str | None:
    """A file's content at base_commit, read from the executor's mirror (never the tree)."""
    proc = git(["--git-dir", str(workspace.mirror), "show", f"{workspace.base_commit}:{path}"],
               check=False)
    if proc.returncode != 0:
        return None
    return proc.stdout.decode("utf-8", "surrogateescape")


def _exists_at_base(workspace: Workspace, path: str) -> bool:
    return git(["--git-dir", str(workspace.mirror), "cat-file", "-e",
                f"{workspace.base_commit}:{path}"], check=False).returncode == 0


def apply_agent_patch(workspace: Workspace, patch_text: str) -> AgentPatchOutcome:
    """Apply the agent's patch minus test configuration; raise PatchFailed if it does not apply."""
    if not patch_text.strip():
        return AgentPatchOutcome(applied=False)
    preamble, sections = split_patch(patch_text)
    if not sections:
        raise PatchFailed("the patch contains no file changes (not a unified diff)")
    kept, excluded = drop_test_config(sections)
    sectioned = {p for section in kept for p in section.paths
                 if PurePosixPath(p).name in SECTIONED_FILES}
    if kept:
        _apply(workspace, preamble + "".join(section.text for section in kept))
    for path in sorted(sectioned):
        if _restore_sections(workspace, path):
            excluded.append(path)
    return AgentPatchOutcome(applied=True, excluded_files=sorted(set(excluded)))


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
            if stat.S_ISREG(info.st_mode):
                patched = tree.read_bytes(path, MAX_CONFIG_BYTES).decode(
                    "utf-8", "surrogateescape")
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


def force_apply_test_patch(workspace: Workspace, test_patch: str) -> None:
    """Reset every file the test patch touches to base_commit, then apply it; PatchFailed if not."""
    if not test_patch.strip():
        return
    paths = sorted(touched_paths(test_patch))
    at_base = []
    with ConfinedTree(workspace.path, no_symlinks=True) as tree:
        for path in paths:
            if is_forbidden_path(path):
                raise PatchFailed(f"test patch touches {path}")
            try:
                _clear_planted_parents(tree, path)
                if tree.exists(path):
                    tree.remove(path)  # a symlink or directory planted in its place, too
            except Refusal as exc:
                raise PatchFailed(f"test patch path {path}: {exc}") from exc
            if _exists_at_base(workspace, path):
                at_base.append(path)
        # Parents cleared above that exist at base come back with the files under them.
    _apply(workspace, test_patch, checkout=at_base)


def _clear_planted_parents(tree: ConfinedTree, path: str) -> None:
    """A parent directory replaced by a symlink or a file would send writes elsewhere: remove
    it (git then restores what base_commit had there)."""
    parts = PurePosixPath(path).parts[:-1]
    for depth in range(1, len(parts) + 1):
        prefix = "/".join(parts[:depth])
        if not tree.exists(prefix):
            return
        if not stat.S_ISDIR(tree.lstat(prefix).st_mode):
            tree.remove(prefix)
            return
