"""What a template's setup left in its tree: the environment, as opposed to the agent's work."""

from __future__ import annotations

from pathlib import Path

from .gitcmd import git


def setup_artifacts(tree: Path) -> list[str]:
    """What setup left in a fresh tree (a virtualenv, build output, files it edited).

    These are the environment, not the agent's work: a captured patch leaves them out (and the
    grading tree, made from the same template, has them already).
    """
    untracked = git(["ls-files", "-z", "--others", "--exclude-standard", "--directory"], cwd=tree)
    modified = git(["diff", "--name-only", "-z"], cwd=tree)
    names = (untracked.stdout + modified.stdout).decode("utf-8", "surrogateescape").split("\0")
    return sorted({name.rstrip("/") for name in names if name})
