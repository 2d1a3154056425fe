"""Fixtures shared by the session feature tests of issue 25 (exec modes, shells, files, finish):
one executor per test module, and a fresh session on the demo task per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from task_executor.demo import DemoTask, make_demo_task
from tests.conftest import RunningExecutor, module_executor
from tests.executor.test_sessions_api import _start


@pytest.fixture(scope="module")
def shared_executor(tmp_path_factory: pytest.TempPathFactory,
                    request: pytest.FixtureRequest) -> Iterator[RunningExecutor]:
    """One executor for every case of the requesting module."""
    with module_executor(tmp_path_factory, request.module.__name__.rsplit(".", 1)[-1]) as running:
        yield running


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> DemoTask:
    """The demo task, made once per module (sessions only read its repository)."""
    return make_demo_task(tmp_path_factory.mktemp("task") / "repo")


@pytest.fixture
def session(shared_executor: RunningExecutor, task: DemoTask) -> Iterator[str]:
    """A fresh session, closed after the test."""
    sid = _start(shared_executor, task)
    yield sid
    shared_executor.delete(f"/session/{sid}")
