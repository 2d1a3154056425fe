"""Shared fixtures: real git repositories, a real executor on a loopback port, the slow tier."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from task_executor.config import Settings
from task_executor.demo import DemoTask, make_demo_task

# Plugins installed beside the test-suite (hypothesis, benchmark, ...) would load into every graded
# pytest run and slow it down; graded runs in tests load only what they need.
from tests.images import task_images  # noqa: E402,F401 -- a fixture, shared by modules
from tests.processes import wait_until
from tests.xdist_workers import pytest_xdist_setupnodes  # noqa: E402,F401 -- workers' namespaces

FAST_PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


_OWN_BASETEMP = pytest.StashKey[Path]()
_WORKER_BASETEMP = pytest.StashKey[Path]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow")


def pytest_configure(config: pytest.Config) -> None:
    """The test session's own mounts (its in-process executors' views and workspaces) in a
    private mount namespace, as every ``task-executor serve`` keeps its own: in the host's
    table, another executor on the machine (another suite's, beside this one) copied them into
    its host view, and a workspace whose root it held could not be removed (EBUSY). Entered
    before any thread starts; where it cannot be (not root), the host's table it is. A
    pytest-xdist worker was started in one (tests/xdist_workers.py), and recognises it."""
    from task_executor.sandbox import executor_namespace

    if hasattr(config, "workerinput"):
        executor_namespace.recognise_inherited()
        # xdist gives each worker a directory in the controller's root (<root>/popen-gwN); what
        # its executors left mounted there is in its namespace alone, released before it ends.
        if config.option.basetemp:
            config.stash[_WORKER_BASETEMP] = Path(config.option.basetemp)
    elif os.geteuid() == 0:
        executor_namespace.enter_private()
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        # A temporary root of this run's own: pytest makes /tmp/pytest-of-<user> 0700 again at
        # every session's start (another suite on the machine, or each pytest-xdist worker), and
        # the sandbox uid must pass through it to reach an executor's base dir.
        base = Path(tempfile.gettempdir()) / f"dockyard-pytest-{os.getpid()}"
        config.option.basetemp = str(base)
        config.stash[_OWN_BASETEMP] = base


def pytest_unconfigure(config: pytest.Config) -> None:
    from task_executor.service.lifecycle import unmount_under

    worker_base = config.stash.get(_WORKER_BASETEMP, None)
    if worker_base is not None:
        unmount_under(worker_base)  # the controller removes the tree once every worker is gone
    base = config.stash.get(_OWN_BASETEMP, None)
    if base is not None:
        unmount_under(base)
        shutil.rmtree(base, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow tier: pass --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_mount_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Overlay mounts left under a test's tmp_path (a SIGKILLed executor leaves them, as a
    crash would) would make pytest's cleanup of old tmp directories fail in a later run."""
    from task_executor.service.lifecycle import unmount_under

    used = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    if used is not None:
        _searchable_by_the_sandbox(used)
    yield
    if used is not None:
        unmount_under(used)


@pytest.fixture(scope="session", autouse=True)
def _no_cgroup_outlives_the_suite() -> Iterator[None]:
    """Executors made in-process are never shut down; their (empty) per-executor cgroups would
    pile up under /sys/fs/cgroup, one per test. Only the groups this test session's executors
    made are removed: another process's executor (another test run on the machine) may have just
    made a group it has not joined yet, and an empty group is not an abandoned one."""
    import contextlib

    from task_executor.sandbox import cgroups

    made: set[Path] = set()
    original = cgroups.Groups.__init__

    def recording(self: cgroups.Groups, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.update(parent for _, parent in self.parents.values())

    cgroups.Groups.__init__ = recording  # type: ignore[method-assign]
    yield
    cgroups.Groups.__init__ = original  # type: ignore[method-assign]
    for parent in made:
        if parent.is_dir():
            for child in [*parent.iterdir(), parent]:
                if child.is_dir():
                    with contextlib.suppress(OSError):
                        child.rmdir()  # only an empty group goes: nothing that runs is touched


def _searchable_by_the_sandbox(path: Path) -> None:
    """pytest makes its temporary directories 0700; bubblewrap resolves bind sources as the
    unprivileged sandbox uid, so an executor's base dir in one needs its parents passable (not
    listable: o+x only). Production base dirs (/tmp/dockyard, /var/lib/...) are so already."""
    import os

    for directory in [path, *path.parents]:
        mode = directory.stat().st_mode
        if not mode & 0o001 and directory.stat().st_uid == os.geteuid():
            directory.chmod((mode & 0o7777) | 0o011)


@pytest.fixture
def connection_counter() -> Iterator[Any]:
    """A host-side counter sandboxed code can check in with (see tests.processes)."""
    from tests.processes import ConnectionCounter

    counter = ConnectionCounter()
    yield counter
    counter.close()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory both the test and sandboxed code can see (sandboxes get a private /tmp).

    Ask for it before the executor (first in the test's arguments): fixtures end in reverse
    order, so the executor, whose view may pin it (a hidden path), is gone before it is removed.
    """
    import shutil
    import tempfile

    from task_executor.service.lifecycle import unmount_under

    path = Path(tempfile.mkdtemp(prefix="dockyard-shared-", dir="/var/tmp"))
    path.chmod(0o777)
    yield path
    unmount_under(path)  # an executor based here leaves its runtime binds: never delete through
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def demo_task(tmp_path: Path) -> DemoTask:
    """The demo repository: a bug in calc.add, its gold fix, and held-out tests."""
    return make_demo_task(tmp_path / "demo-repo")


@dataclass
class RunningExecutor:
    url: str
    settings: Settings
    token: str | None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def request(self, method: str, path: str, **kwargs: object) -> requests.Response:
        headers = {**self.headers(), **kwargs.pop("headers", {})}  # type: ignore[dict-item]
        return requests.request(method, self.url + path, headers=headers, timeout=120, **kwargs)  # type: ignore[arg-type]

    def post(self, path: str, **kwargs: object) -> requests.Response:
        return self.request("POST", path, **kwargs)

    def get(self, path: str, **kwargs: object) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def put(self, path: str, **kwargs: object) -> requests.Response:
        return self.request("PUT", path, **kwargs)

    def delete(self, path: str, **kwargs: object) -> requests.Response:
        return self.request("DELETE", path, **kwargs)

    def submit(self, body: dict) -> requests.Response:
        body = {**body, "env": {**FAST_PYTEST_ENV, **body.get("env", {})}}
        return self.post("/task/submit", json=body)

    def work_dirs(self) -> list[Path]:
        """The workspaces left in the base directory, once the executor has removed every
        deleted session's (a DELETE answers first, its reclaimer removes it after)."""
        wait_until(lambda: self.get("/health").json()["load"]["sessions_removing"] == 0)
        return sorted((self.settings.base_dir / "work").glob("*"))


def serve_in_thread(
    app: Callable[..., Any], settings: Settings, host: str = "127.0.0.1"
) -> tuple[Any, Callable[[], None]]:
    """``app`` on the executor's own waitress server (``make_server``), on ``host`` port 0,
    polled by a thread; returns the server and a function that stops it (the listener with it:
    a server closed under a running loop kept listening, and a later bind could get its port)."""
    from task_executor.service.server import make_server

    server = make_server(app, settings, host=host, port=0)
    stopping = threading.Event()

    def poll_until_stopped() -> None:
        # Polling in short rounds lets stop() end the loop before any socket is closed under it.
        while not stopping.is_set():
            server.asyncore.loop(timeout=0.05, map=server._map, count=1,
                                 use_poll=server.adj.asyncore_use_poll)

    thread = threading.Thread(target=poll_until_stopped, daemon=True)
    thread.start()

    def stop() -> None:
        stopping.set()
        thread.join(timeout=10)
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=10)
        server.asyncore.close_all(server._map)  # the listener, open channels and the trigger

    return server, stop


def start_executor(
    settings: Settings, host: str = "127.0.0.1"
) -> tuple[RunningExecutor, Callable[[], None]]:
    """A real waitress server on ``host`` (its URL: 127.0.0.1), port 0, serving
    create_app(settings) in a thread."""
    from task_executor.service.app import create_app

    app = create_app(settings)
    server, stop_server = serve_in_thread(app, settings, host)
    url = f"http://127.0.0.1:{server.effective_port}"

    def stop() -> None:
        from task_executor.service.lifecycle import release_mounts, unmount_under

        stop_server()
        services = app.extensions["dockyard"]
        services.sessions.close_all()
        # As the executor's own shutdown does: nothing of it stays mounted (its view pinned the
        # directories it hides, and an `rm -rf` of the base dir would walk the host).
        release_mounts(services)
        unmount_under(settings.base_dir)
        if services.workspaces.groups is not None:  # and no cgroup: its own parent groups too
            services.workspaces.groups.remove_all()

    return RunningExecutor(url=url, settings=settings, token=settings.token), stop


@contextmanager
def module_executor(tmp_path_factory: pytest.TempPathFactory,
                    name: str) -> Iterator[RunningExecutor]:
    """One executor for every case of a module that only submits gradings, in a passable
    directory of its own; stopped and unmounted after."""
    from task_executor.service.lifecycle import unmount_under

    root = tmp_path_factory.mktemp(name)
    _searchable_by_the_sandbox(root)
    running, stop = start_executor(Settings(base_dir=root / "executor", threads=8,
                                            task_timeout=120))
    try:
        yield running
    finally:
        stop()
        unmount_under(root)


@pytest.fixture
def executor_factory(tmp_path: Path) -> Iterator[Callable[..., RunningExecutor]]:
    """Start executors with custom settings; every one is stopped after the test."""
    stops: list[Callable[[], None]] = []

    def factory(**overrides: object) -> RunningExecutor:
        base = tmp_path / f"executor-{len(stops)}"
        settings = Settings(base_dir=base, threads=8, task_timeout=120).with_overrides(**overrides)
        running, stop = start_executor(settings)
        stops.append(stop)
        return running

    yield factory
    for stop in stops:
        stop()


@pytest.fixture
def executor(executor_factory: Callable[..., RunningExecutor]) -> RunningExecutor:
    """A real executor on a loopback port, without a token."""
    return executor_factory()
