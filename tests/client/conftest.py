"""Fixtures for client tests: real sockets that misbehave, a mocked fleet, a sleep recorder.

Where the failure is about the network (refused, silent, hung up) the tests use real TCP sockets
on loopback; ``responses`` passes those URLs through and mocks only the well-behaved executors.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import responses

from sandbox_client import SandboxClient
from sandbox_client.protocol import template_key
from sandbox_client.routing import rendezvous_rank
from tests.loopback import LoopbackServer


def task_result(task_id: str = "t-1", status: str = "resolved", **extra: Any) -> dict[str, Any]:
    """A minimal valid TaskResult body."""
    resolved = {"resolved": True, "execution_error": None}.get(status, False)
    return {"task_id": task_id, "status": status, "resolved": resolved, **extra}


def task_spec(task_id: str = "t-1", **extra: Any) -> dict[str, Any]:
    """A minimal valid TaskSpec body."""
    return {"task_id": task_id, "repo": "/srv/repo", "base_commit": "abc123", **extra}


def ranked(order: list[str], spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """``spec`` (default: ``task_spec()``) with an env entry that makes its template key rank
    the executors exactly as ``order`` lists them (affinity routing tries them in that order)."""
    base = spec if spec is not None else task_spec()
    for salt in itertools.count():
        env = {**base.get("env", {}), "RANK_SALT": str(salt)}
        key = template_key(base["repo"], base["base_commit"], base.get("setup", []), env)
        if rendezvous_rank(key, order) == order:
            return {**base, "env": env}
    raise AssertionError("unreachable")  # pragma: no cover


def body_of(call: Any) -> dict[str, Any]:
    """The JSON body of a request recorded by ``responses``."""
    return json.loads(call.request.body)


class Sleeps:
    """Stands in for ``time.sleep``: records every wait instead of waiting."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def mocked() -> Iterator[responses.RequestsMock]:
    """``responses`` with passthrough for loopback URLs the test did not mock."""
    # The client's own adapter sends every request (sandbox_client/transport.py).
    with responses.RequestsMock(assert_all_requests_are_fired=False,
                                target="sandbox_client.transport.WireAdapter.send") as mock:
        yield mock


def closed_port() -> str:
    """A loopback URL nothing listens on: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def closed_port_url() -> str:
    """A loopback URL nothing listens on: connecting to it is refused."""
    return closed_port()


class RawServer(LoopbackServer):
    """A loopback TCP server whose handler decides what to do with each connection (on a
    thread of its own); connections still open are closed with the server."""

    def __init__(self, handler: Callable[[socket.socket], None]) -> None:
        self._handler = handler
        self.connections = 0
        self._open: list[socket.socket] = []
        super().__init__(self._dispatch)

    def _dispatch(self, conn: socket.socket) -> None:
        self.connections += 1
        self._open.append(conn)
        threading.Thread(target=self._handler, args=(conn,), daemon=True).start()

    def close(self) -> None:
        super().close()
        for conn in self._open:
            conn.close()


def read_request(conn: socket.socket) -> bytes:
    """Read until the end of the headers (bodies in these tests are small and come along);
    what was read, or b"" when the peer closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    return data


@pytest.fixture
def silent_server() -> Iterator[RawServer]:
    """Accepts and reads requests, never answers: every read times out."""

    def handler(conn: socket.socket) -> None:
        read_request(conn)

    server = RawServer(handler)
    yield server
    server.close()


@pytest.fixture
def hangup_server() -> Iterator[RawServer]:
    """Reads each request, then closes the connection without a reply (an executor killed
    mid-call)."""

    def handler(conn: socket.socket) -> None:
        read_request(conn)
        conn.close()

    server = RawServer(handler)
    yield server
    server.close()


@pytest.fixture
def make_client(sleeps: Sleeps) -> Iterator[Callable[..., SandboxClient]]:
    """Build clients with recorded sleeps and short timeouts; closes them after the test.

    They do not ask ``/health`` before a first call (``learn_capacity=False``) unless told: the
    tests that use them script every exchange; learning is tested in ``test_capacity.py``."""
    made: list[SandboxClient] = []

    def make(urls: list[str] | str, **kwargs: Any) -> SandboxClient:
        if "config" not in kwargs:
            kwargs.setdefault("timeout", (2.0, 5.0))
        kwargs.setdefault("learn_capacity", False)
        client = SandboxClient(urls, sleep=sleeps, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


# -- live executors ------------------------------------------------------------------------------


def graded_on(caplog: pytest.LogCaptureFixture) -> Counter[str]:
    """Executor URL of every task the client logged as graded."""
    return Counter(rec.args[-1] for rec in caplog.records if rec.msg.startswith("task %s: %s in"))


FAST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def answered(executor: Any, route: str, status: int) -> int:
    """Requests a live executor answered on ``route`` with ``status``, from its /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = executor.get("/metrics").text
    return int(sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "dockyard_http_requests_total"
        and sample.labels.get("route") == route and sample.labels.get("status") == str(status)
    ))


def demo_instance(demo: Any, instance_id: str, **overrides: Any) -> dict[str, Any]:
    """A SWE-bench instance record (test lists JSON-encoded, as SWE-bench stores them) for the
    demo repository; ``patch`` is the reference fix."""
    record = {
        "instance_id": instance_id,
        "repo": demo.repo,
        "base_commit": demo.base_commit,
        "patch": demo.gold_patch,
        "test_patch": demo.test_patch,
        "FAIL_TO_PASS": json.dumps(demo.fail_to_pass),
        "PASS_TO_PASS": json.dumps(demo.pass_to_pass),
        "env": dict(FAST_ENV),
    }
    record.update(overrides)
    return record


@pytest.fixture
def process_executors(tmp_path: Any) -> Iterator[Callable[[int], list[Any]]]:
    """Start real executor subprocesses (``python -m task_executor serve --port 0``), which a
    test may SIGKILL; all are stopped after the test."""
    from sandbox_client.cli.fleet import start_worker, stop_workers, wait_ready

    started: list[Any] = []

    def start(count: int, port: int = 0) -> list[Any]:
        """``count`` executors on ports of their own choosing, or one on ``port`` (to bring a
        killed executor back at its URL)."""
        assert port == 0 or count == 1
        workers = [
            start_worker(len(started) + i, "127.0.0.1", port, tmp_path / "fleet", None, 8)
            for i in range(count)
        ]
        started.extend(workers)
        with SandboxClient("http://127.0.0.1:1", timeout=(1.0, 3.0)) as probe:
            dead = wait_ready(workers, probe, 60.0, threading.Event())
        assert dead is None, dead.log_tail() if dead else ""
        return workers

    yield start
    stop_workers(started, grace=5.0)
    # A worker the test SIGKILLed left its sandboxes and overlay mounts behind, as a crashed
    # executor does; the next start on that directory would clean them, so do that here.
    from task_executor.service.lifecycle import clean_base_dir

    for base in sorted((tmp_path / "fleet").glob("worker-*")):
        clean_base_dir(base)
