"""The frameworks' own test suites, vendored at pinned versions, run against the adapters.

Each directory is collected only where its framework is installed (CI gives them a virtualenv
of their own: scripts/ci/frameworks.sh); elsewhere it is left out, not failed. Sessions are
started on one real executor per test run, on the demo repository.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# mini-swe-agent prints a banner and reads a global .env on import unless told not to.
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

collect_ignore = [
    name for name, module in (("minisweagent", "minisweagent"), ("swerex", "swerex"))
    if importlib.util.find_spec(module) is None
]


@pytest.fixture(scope="session")
def dockyard_sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], object]]:
    """Start a session on the demo repository (a real executor, waitress on 127.0.0.1);
    every session started is closed at the end of the run."""
    from sandbox_client import SandboxClient
    from task_executor.demo import make_demo_task
    from tests.conftest import module_executor

    repo: Path = tmp_path_factory.mktemp("framework-repo") / "repo"
    task = make_demo_task(repo)
    with module_executor(tmp_path_factory, "framework-executor") as running, \
            SandboxClient(running.url) as client:
        started: list[object] = []

        def start() -> object:
            session = client.start_session({"repo": task.repo, "base_commit": task.base_commit})
            started.append(session)
            return session

        yield start
        for session in started:
            session.close()  # type: ignore[attr-defined]
