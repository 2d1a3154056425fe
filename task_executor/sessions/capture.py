"""Capturing what an agent changed in a session's tree, as one patch against base_commit.

New, deleted, renamed and binary files are included (``git add -A`` into a throwaway index, so
the agent's own index, commits or stashes change nothing); files ``.gitignore`` names are not.
Test-configuration files are left out of the patch and reported (Sandman A45: extraction with
``git add -A`` once picked up a planted test configuration file and passed a non-fix).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from task_executor.grading.diffs import split_patch
from task_executor.grading.testconfig import drop_test_config
from task_executor.workspaces.gitcmd import git


@dataclass
class CapturedPatch:
    patch: str
    excluded_files: list[str] = field(default_factory=list)


def capture_patch(
    tree: Path, base_commit: str, mirror: Path, artifacts: list[str] | None = None
) -> CapturedPatch:
    """The tree's changes against ``base_commit``, read through the executor's own mirror.

    git runs with the mirror as its repository and the session tree as its work tree, so nothing
    the agent did to the tree's ``.git`` (config with fsmonitor or filters, hooks, a deleted
    directory) is consulted; new objects go to a scratch directory, never into the mirror.
    """
    with tempfile.TemporaryDirectory(prefix="dockyard-capture-") as scratch:
        os.makedirs(os.path.join(scratch, "objects", "info"))
        env = {
            "GIT_DIR": str(mirror),
            "GIT_WORK_TREE": str(tree),
            "GIT_INDEX_FILE": os.path.join(scratch, "index"),
            "GIT_OBJECT_DIRECTORY": os.path.join(scratch, "objects"),
            "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(mirror / "objects"),
        }
        options = ["-c", "core.autocrlf=false", "-c", "core.fsmonitor=false",
                   "-c", "core.hooksPath=/dev/null", "-c", "core.bare=false"]
        git([*options, "read-tree", base_commit], cwd=tree, extra_env=env)
        excluded = [f":(exclude,literal){name}" for name in artifacts or []]
        git([*options, "add", "-A", "--", ".", *excluded], cwd=tree, extra_env=env)
        diff = git(
            [*options, "diff", "--cached", "--binary", "--no-color", "--no-ext-diff",
             "--find-renames", base_commit],
            cwd=tree,
            extra_env=env,
        ).stdout.decode("utf-8", "surrogateescape")
    preamble, sections = split_patch(diff)
    kept, excluded = drop_test_config(sections)
    return CapturedPatch(
        patch=preamble + "".join(section.text for section in kept), excluded_files=excluded
    )
