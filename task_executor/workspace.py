"""Working trees: a private checkout of a repository at a commit, for one task or session.

This is the one small interface the rest of the executor uses (``create``, ``Workspace.destroy``);
how the tree is made is this module's business. Today it is a ``git clone --shared`` of the local
mirror (objects borrowed through alternates, nothing shared that a task can write to).
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from .gitcmd import git
from .mirrors import MirrorCache

WORKSPACE_MODE = "git-clone"


@dataclass
class Workspace:
    """A checked-out tree at ``base_commit``; ``destroy`` removes every byte of it."""

    path: Path
    root: Path
    base_commit: str
    mirror: Path

    def destroy(self) -> None:
        remove_tree(self.root)


def remove_tree(path: Path) -> None:
    """Remove a directory even when the code under test made parts of it read-only."""

    def make_writable_and_retry(function, failed_path, _exc_info):  # type: ignore[no-untyped-def]
        try:
            os.chmod(os.path.dirname(failed_path), 0o700)
            os.chmod(failed_path, 0o700)
        except OSError:
            pass
        try:
            function(failed_path)
        except OSError:
            pass

    if path.exists() or path.is_symlink():
        shutil.rmtree(path, onerror=make_writable_and_retry)
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)


class WorkspaceFactory:
    """Makes workspaces under ``root`` from the mirrors in ``mirrors``."""

    mode = WORKSPACE_MODE

    def __init__(self, root: Path, mirrors: MirrorCache) -> None:
        self.root = root
        self.mirrors = mirrors
        self.root.mkdir(parents=True, exist_ok=True)

    def create(self, repo: str, base_commit: str, name: str = "repo") -> Workspace:
        """A fresh tree of ``repo`` at ``base_commit`` (RepoError when either is unknown)."""
        mirror, sha = self.mirrors.resolve(repo, base_commit)
        holder = self.root / f"ws-{uuid.uuid4().hex[:16]}"
        holder.mkdir()
        path = holder / name
        try:
            git(["clone", "--quiet", "--shared", "--no-checkout", str(mirror), str(path)])
            git(["checkout", "--quiet", "--detach", sha], cwd=path)
        except BaseException:
            remove_tree(holder)
            raise
        return Workspace(path=path, root=holder, base_commit=sha, mirror=mirror)
