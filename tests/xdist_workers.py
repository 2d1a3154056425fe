"""pytest-xdist workers, each in a mount namespace of its own, made before its Python starts.

The test session keeps its in-process executors' mounts (host views, workspace tmpfs and
overlays, holders) in a private mount namespace (tests/conftest.py), as ``task-executor serve``
does. A worker cannot enter one itself: a mount namespace belongs to a thread, and execnet's
threads already run when the worker's conftest loads. Left in the host's table, one worker's
live workspaces were copied into the other worker's executors' namespaces, and removing them
failed (EBUSY). So the worker's interpreter is started under ``unshare --mount --propagation
slave`` where unshare works here (root), and as plain Python otherwise; the worker then
recognises the namespace it was given (``executor_namespace.recognise_inherited``).

Loaded by tests/conftest.py (its hook, re-exported there), or as ``-p tests.xdist_workers``.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Sequence
from functools import cache
from typing import Any

import pytest

UNSHARE = ("unshare", "--mount", "--propagation", "slave")


@cache
def worker_python() -> str:
    """The command a worker's interpreter runs as: this Python, under ``unshare`` where it works
    (tried once: without CAP_SYS_ADMIN, or without util-linux, a worker could not start)."""
    try:
        works = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30).returncode == 0
    except OSError:
        works = False
    return shlex.join([*UNSHARE, sys.executable] if works else [sys.executable])


@pytest.hookimpl(optionalhook=True)  # without pytest-xdist (-p no:xdist) the hook is unknown
def pytest_xdist_setupnodes(config: pytest.Config, specs: Sequence[Any]) -> None:
    """``-n N`` makes N plain ``popen`` specs; each gets the wrapped interpreter. A spec that
    names its own (``--tx popen//python=...``) or goes elsewhere is left as it was given."""
    for spec in specs:
        if spec.popen and not spec.python and not spec.via:
            spec.python = worker_python()
