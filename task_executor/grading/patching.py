"""Applying the agent patch (test configuration left out) and force-applying the gold test patch.

Order matters for reward integrity: the agent patch goes first, minus the files that configure the
test run; then every file the gold test patch touches is put back to its base_commit state (or
removed, when the test patch creates it) and the test patch is applied on top. Whatever the agent
did to the held-out tests or the test configuration, the tests that run are the canonical ones.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from task_executor.workspaces.gitcmd import git, git_env
from task_executor.workspaces.workspace import remove_tree

from .diffs import split_patch, touched_paths
from .testconfig import (
    SECTIONED_FILES,
    drop_test_config,
    is_forbidden_path,
    restore_test_sections,
)


class PatchFailed(Exception):
    """A patch did not apply; the message carries the tools' output."""


@dataclass
class AgentPatchOutcome:
    applied: bool
    excluded_files: list[str] = field(default_factory=list)


def _apply(worktree: Path, patch_text: str) -> None:
    """Apply a patch with git, falling back to GNU patch with fuzz as SWE-bench's harness does.

    Each attempt is checked first so a failed attempt never leaves a half-applied tree behind.
    """
    with tempfile.NamedTemporaryFile("wb", suffix=".diff", delete=False) as handle:
        # newline-exact: a CRLF patch must reach git byte for byte.
        handle.write(patch_text.encode("utf-8", "surrogateescape"))
        patch_file = handle.name
    errors = []
    try:
        for args in (
            ["apply", "--whitespace=nowarn"],
            ["apply", "--whitespace=nowarn", "--ignore-whitespace", "--recount"],
        ):
            check = git([*args, "--check", patch_file], cwd=worktree, check=False)
            if check.returncode == 0:
                git([*args, patch_file], cwd=worktree)
                return
            errors.append(check.stderr.decode("utf-8", "replace").strip())
        if shutil.which("patch"):
            base = ["patch", "--batch", "--fuzz=5", "-p1", "--forward", "--no-backup-if-mismatch"]
            dry = _run_patch([*base, "--dry-run", "-i", patch_file], worktree)
            if dry.returncode == 0:
                real = _run_patch([*base, "-i", patch_file], worktree)
                if real.returncode == 0:
                    return
                errors.append(real.stdout.decode("utf-8", "replace").strip())
            else:
                errors.append(dry.stdout.decode("utf-8", "replace").strip())
    finally:
        Path(patch_file).unlink(missing_ok=True)
    raise PatchFailed("\n".join(e for e in errors if e)[-4000:] or "patch does not apply")


def _run_patch(args: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        args, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, env=git_env(), timeout=300
    )


def _show_at(worktree: Path, commit: str, path: str) -> str | None:
    proc = git(["show", f"{commit}:{path}"], cwd=worktree, check=False)
    if proc.returncode != 0:
        return None
    return proc.stdout.decode("utf-8", "surrogateescape")


def apply_agent_patch(worktree: Path, base_commit: str, patch_text: str) -> AgentPatchOutcome:
    """Apply the agent's patch minus test configuration; raise PatchFailed if it does not apply."""
    if not patch_text.strip():
        return AgentPatchOutcome(applied=False)
    preamble, sections = split_patch(patch_text)
    if not sections:
        raise PatchFailed("the patch contains no file changes (not a unified diff)")
    kept, excluded = drop_test_config(sections)
    sectioned = {p for section in kept for p in section.paths if Path(p).name in SECTIONED_FILES}
    if kept:
        _apply(worktree, preamble + "".join(section.text for section in kept))
    for path in sorted(sectioned):
        if _restore_sections(worktree, base_commit, path):
            excluded.append(path)
    return AgentPatchOutcome(applied=True, excluded_files=sorted(set(excluded)))


def _restore_sections(worktree: Path, base_commit: str, path: str) -> bool:
    """Put the test-configuring sections of setup.cfg / pyproject.toml back; True if changed."""
    target = worktree / path
    base = _show_at(worktree, base_commit, path)
    patched = target.read_bytes().decode("utf-8", "surrogateescape") if target.exists() else None
    if patched is None:
        if base is None:
            return False
        restored, changed = restore_test_sections(Path(path).name, base, "")
        if not changed:
            return False
        target.write_bytes(restored.encode("utf-8", "surrogateescape"))
        return True
    restored, changed = restore_test_sections(Path(path).name, base or "", patched)
    if changed:
        target.write_bytes(restored.encode("utf-8", "surrogateescape"))
    return changed


def force_apply_test_patch(worktree: Path, base_commit: str, test_patch: str) -> None:
    """Reset every file the test patch touches to base_commit, then apply it; PatchFailed if not."""
    if not test_patch.strip():
        return
    paths = sorted(touched_paths(test_patch))
    at_base = []
    for path in paths:
        if is_forbidden_path(path):
            raise PatchFailed(f"test patch touches {path}")
        _clear_planted_parents(worktree, base_commit, path)
        exists = git(["cat-file", "-e", f"{base_commit}:{path}"], cwd=worktree, check=False)
        if exists.returncode == 0:
            at_base.append(path)
        else:
            _remove_path(worktree / path)
    if at_base:
        for path in at_base:
            _remove_path(worktree / path)  # a symlink or directory planted in its place, too
        git(["checkout", base_commit, "--", *(f":(literal){p}" for p in at_base)], cwd=worktree)
    _apply(worktree, test_patch)


def _clear_planted_parents(worktree: Path, base_commit: str, path: str) -> None:
    """A parent directory replaced by a symlink or a file would send writes outside the tree."""
    current = worktree
    for part in Path(path).parts[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            current.unlink()
            relative = current.relative_to(worktree).as_posix()
            tree = git(["cat-file", "-e", f"{base_commit}:{relative}"], cwd=worktree, check=False)
            if tree.returncode == 0:
                git(["checkout", base_commit, "--", f":(literal){relative}"], cwd=worktree)
            return


def _remove_path(target: Path) -> None:
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        remove_tree(target)
