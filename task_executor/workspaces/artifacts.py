"""What a template's setup left in its tree: the environment, as opposed to the agent's work."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .gitcmd import git


def setup_artifacts(tree: Path, mirror: Path, commit: str) -> list[str]:
    """What setup left in a fresh tree (a virtualenv, build output, files it edited).

    These are the environment, not the agent's work: a captured patch leaves them out (and the
    grading tree, made from the same template, has them already). git reads the executor's
    mirror and a scratch index made from ``commit``, never the tree's own ``.git`` (which setup
    could have rewritten: an fsmonitor there would run as the executor).
    """
    with tempfile.TemporaryDirectory(prefix="dockyard-artifacts-") as scratch:
        env = {"GIT_DIR": str(mirror), "GIT_WORK_TREE": str(tree),
               "GIT_INDEX_FILE": os.path.join(scratch, "index")}
        options = ["-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
                   "-c", "core.bare=false"]
        git([*options, "read-tree", commit], cwd=tree, extra_env=env)
        untracked = git([*options, "ls-files", "-z", "--others", "--exclude-standard",
                         "--directory"], cwd=tree, extra_env=env)
        modified = git([*options, "diff", "--name-only", "-z"], cwd=tree, extra_env=env)
    names = (untracked.stdout + modified.stdout).decode("utf-8", "surrogateescape").split("\0")
    return sorted({name.rstrip("/") for name in names if name})
