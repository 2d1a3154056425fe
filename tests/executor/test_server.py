"""The executor's waitress server (task_executor.server): its workers, most-recently-idle first,
and its own error answers, on a real server."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sandbox_client.protocol import ErrorResponse
from task_executor.config import Settings
from task_executor.service import server as server_module
from task_executor.service.server import LifoCondition
from tests.conftest import serve_in_thread

THREADS = 8


def test_notify_wakes_the_newest_waiter_and_notify_all_the_rest() -> None:
    lock = threading.Lock()
    condition = LifoCondition(lock)
    woke: list[str] = []
    threads = []
    for name in ("first", "second", "third"):
        waiting = threading.Event()

        def wait(name: str = name, waiting: threading.Event = waiting) -> None:
            with lock:
                waiting.set()
                condition.wait()  # releases the lock once it is on the stack
                woke.append(name)

        thread = threading.Thread(target=wait)
        thread.start()
        threads.append(thread)
        assert waiting.wait(5)
        with lock:  # taken only when the waiter has released it inside wait()
            pass
    with lock:
        condition.notify()
    threads[2].join(5)
    assert woke == ["third"]
    with lock:
        condition.notify_all()
    for thread in threads:
        thread.join(5)
    assert woke[0] == "third" and sorted(woke[1:]) == ["first", "second"]


@contextmanager
def serving(app: Callable[..., Any], tmp_path: Path) -> Iterator[http.client.HTTPConnection]:
    """``app`` on the executor's own waitress server, and a connection to it."""
    server, stop = serve_in_thread(app, Settings(base_dir=tmp_path, threads=THREADS))
    connection = http.client.HTTPConnection("127.0.0.1", server.effective_port, timeout=10)
    try:
        yield connection
    finally:
        connection.close()
        stop()
    assert not server.task_dispatcher.threads  # every worker ended


def thread_name_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [threading.current_thread().name.encode()]


def get(connection: http.client.HTTPConnection, path: str = "/") -> str:
    connection.request("GET", path)
    reply = connection.getresponse()
    assert reply.status == 200
    return reply.read().decode()


def idle_workers(server: Any) -> int:
    return len(server.task_dispatcher.queue_cv._waiters)


@pytest.mark.parametrize("wake", ["newest_first", "waitress_fifo"])
def test_sequential_requests_stay_on_the_thread_that_went_idle_last(
    tmp_path: Path, wake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # waitress's own dispatcher wakes the thread idle the longest: 30 requests one after the
    # other go round all 8 threads, each one cold (the control). Each request is sent once every
    # worker is back in the idle queue: a loaded machine may deliver an answer before the worker
    # that sent it gets there, and another would take the next request. So the order of waking
    # decides alone.
    if wake == "waitress_fifo":
        monkeypatch.setattr(server_module, "LifoCondition", threading.Condition)
    server, stop = serve_in_thread(thread_name_app, Settings(base_dir=tmp_path, threads=THREADS))
    connection = http.client.HTTPConnection("127.0.0.1", server.effective_port, timeout=10)
    served_by = []
    try:
        for _ in range(30):
            while len(server.task_dispatcher.queue_cv._waiters) < THREADS:
                time.sleep(0.01)  # no deadline: the workers are there, only slow to get back
            served_by.append(get(connection))
    finally:
        connection.close()
        stop()
    if wake == "newest_first":
        assert set(served_by) == {served_by[0]}, served_by
    else:
        assert len(set(served_by)) == THREADS, served_by


def test_concurrent_requests_still_get_every_thread(tmp_path: Path) -> None:
    # Each request waits at a barrier that opens only when all 8 are inside the app at once.
    barrier = threading.Barrier(THREADS, timeout=10)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        barrier.wait()
        return thread_name_app(environ, start_response)

    with serving(app, tmp_path) as first:
        port = first.port

        def one_request(_: int) -> str:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
            try:
                return get(connection)
            finally:
                connection.close()

        with ThreadPoolExecutor(THREADS) as pool:
            served_by = set(pool.map(one_request, range(THREADS)))
    assert len(served_by) == THREADS


def raw_exchange(port: int, request: bytes) -> tuple[str, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in header_lines)
    return status, {k.lower(): v for k, v in headers.items()}, body


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", "400", "bad_request"),
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n",
            "413",
            "request_entity_too_large",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
            "501",
            "not_implemented",
        ),
    ],
    ids=["bad content-length", "body over the limit", "unknown transfer-encoding"],
)
def test_requests_waitress_refuses_get_the_protocols_json_error(
    tmp_path: Path, request_bytes: bytes, status: str, code: str
) -> None:
    # These never reach the app; waitress answered them in plain text.
    with serving(thread_name_app, tmp_path) as connection:
        line, headers, body = raw_exchange(connection.port, request_bytes)
    assert line.split(" ")[1] == status
    assert headers["content-type"] == "application/json"
    error = ErrorResponse.model_validate_json(body).error
    assert error.code == code and error.message
