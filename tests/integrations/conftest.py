"""Fixtures for the adapters' tests: the demo task as a trainer's dataset row, a client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sandbox_client import SandboxClient
from task_executor.demo import DemoTask
from tests.conftest import FAST_PYTEST_ENV, RunningExecutor


def task_row(task: DemoTask, task_id: str = "demo") -> dict[str, Any]:
    """The demo task as a dataset row would carry it (SWE-bench keys, no patch)."""
    return {
        "instance_id": task_id,
        "repo": task.repo,
        "base_commit": task.base_commit,
        "test_patch": task.test_patch,
        "FAIL_TO_PASS": task.fail_to_pass,
        "PASS_TO_PASS": task.pass_to_pass,
        "env": dict(FAST_PYTEST_ENV),
    }


@pytest.fixture
def client(executor: RunningExecutor) -> Iterator[SandboxClient]:
    with SandboxClient(executor.url) as made:
        yield made
