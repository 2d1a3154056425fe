"""Canaries into the tree, and the digests of the test files whose code the reporter checks.

Both happen after the patch step, before the tests run: the test patch's files then hold the
gold test patch over base (the agent's bytes for those paths were reset first) and no code of
the agent's has run yet, so what is read here is canonical. Files are read and written through
``ConfinedTree`` (no symlink followed, regular files only), bounded in size.
"""

from __future__ import annotations

import hashlib
import logging

from task_executor.sandbox.confined import ConfinedTree, Refusal
from task_executor.workspaces.workspace import Workspace

from .canaries import Plan

log = logging.getLogger(__name__)

MAX_TEST_FILE_BYTES = 4 * 1024 * 1024
"""A test file past this gets no canaries and no code check."""
MAX_CHECKED_FILES = 64


def plant(workspace: Workspace, plan: Plan) -> bool:
    """Put the plan's canaries in their files (``Plan.place``); False, with nothing written,
    when a file cannot take them (gone, not a regular file, too large)."""
    texts: dict[str, bytes] = {}
    try:
        with ConfinedTree(workspace.path) as tree:
            for path in plan.paths():
                source = tree.read_bytes(path, MAX_TEST_FILE_BYTES).decode(
                    "utf-8", "surrogateescape")
                texts[path] = plan.place(path, source).encode("utf-8", "surrogateescape")
            for path, data in texts.items():
                tree.write_bytes(path, data, owner=workspace.factory.sandbox.owner)
    except Refusal as refusal:
        log.info("no canaries: %s", refusal)
        return False
    return True


def digests(workspace: Workspace, paths: list[str]) -> dict[str, str]:
    """{path: SHA-256} of those of the test patch's Python files that are regular files of a
    readable size, as the tests will find them."""
    found: dict[str, str] = {}
    with ConfinedTree(workspace.path) as tree:
        for path in paths[:MAX_CHECKED_FILES]:
            try:
                found[path] = hashlib.sha256(
                    tree.read_bytes(path, MAX_TEST_FILE_BYTES)).hexdigest()
            except Refusal:
                continue
    return found
