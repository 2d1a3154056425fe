"""The waitress server the executor runs on (:func:`make_server`): its own settings (its loop
polls with ``poll()``, which takes any fd number), worker threads woken most-recently-idle
first, and its own error answers in the protocol's JSON.

**Workers** (:class:`LifoTaskDispatcher`).

waitress wakes its idle workers in the order they went idle (``threading.Condition`` is FIFO),
so with 32 threads and one trainer driving one session, each request lands on the thread that
has slept the longest: its stack and the objects it touches are cold by then, and on a VM its
vCPU may be too. Waking the thread that went idle last keeps a few threads hot and the rest
asleep; the pool still grows to every thread under concurrent load, and the queue of requests
itself stays first in, first out. (On this project's 2-core VM newest first took 0.15-0.25 ms
off an exec round trip, side by side with waitress's order: ``scripts/bench/bench_ab.py``,
figures in ``scripts/bench/README.md``.)

**Errors waitress answers itself** (:class:`JsonErrorTask`): a request it refuses before the app
sees it (a body over ``max_request_body_size``, a bad ``Content-Length``, an unknown
``Transfer-Encoding``, headers too large) gets ``{"error": {"code", "message"}}`` like every
other error, not waitress's plain text; the code is the reason phrase in snake case, as for the
app's own HTTP errors (``request_entity_too_large``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from waitress import create_server
from waitress.channel import HTTPChannel
from waitress.task import ErrorTask, ThreadedTaskDispatcher

from sandbox_client.protocol import ErrorDetail, ErrorResponse
from task_executor.config import Settings
from task_executor.errors import http_error_code


class LifoCondition:
    """The part of ``threading.Condition`` that waitress's dispatcher uses (``wait()`` without a
    timeout, ``notify``, ``notify_all``), except that ``notify`` wakes the newest waiter.

    Every method is called with ``lock`` held, as with ``threading.Condition``.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._waiters: list[threading.Lock] = []  # a stack: the newest waiter last

    def wait(self) -> None:
        waiter = threading.Lock()
        waiter.acquire()
        self._waiters.append(waiter)
        self._lock.release()
        try:
            waiter.acquire()  # until a notify releases it
        finally:
            self._lock.acquire()

    def notify(self, n: int = 1) -> None:
        while self._waiters and n > 0:
            self._waiters.pop().release()
            n -= 1

    def notify_all(self) -> None:
        self.notify(len(self._waiters))


class LifoTaskDispatcher(ThreadedTaskDispatcher):
    """waitress's ``ThreadedTaskDispatcher`` with :class:`LifoCondition` as its idle-worker
    condition; everything else (start, stop, shutdown, the task queue) is waitress's own."""

    def __init__(self) -> None:
        super().__init__()
        self.queue_cv = LifoCondition(self.lock)  # type: ignore[assignment]


class JsonErrorTask(ErrorTask):
    """waitress's error answer, with the protocol's JSON error body."""

    def execute(self) -> None:
        error = self.request.error
        detail = ErrorDetail(
            code=http_error_code(error.reason), message=f"{error.reason}: {error.body}"
        )
        body = ErrorResponse(error=detail).model_dump_json().encode()
        self.status = f"{error.code} {error.reason}"
        self.response_headers.append(("Content-Type", "application/json"))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class JsonErrorChannel(HTTPChannel):
    error_task_class = JsonErrorTask


def make_server(
    app: Callable[..., Any], settings: Settings, host: str | None = None, port: int | None = None
) -> Any:
    """The waitress server for ``app`` as ``task-executor serve`` runs it (tests start theirs
    with it too); ``host`` and ``port`` override the settings'."""
    dispatcher = LifoTaskDispatcher()
    dispatcher.set_thread_count(settings.threads)
    server = create_server(
        app,
        _dispatcher=dispatcher,  # waitress's own hook for a dispatcher of the caller's
        host=settings.host if host is None else host,
        port=settings.port if port is None else port,
        threads=settings.threads,
        # Above this, waitress refuses the body before reading it (JsonErrorTask answers); the
        # app's own limit (MAX_CONTENT_LENGTH) answers bodies just over max_body_bytes.
        max_request_body_size=settings.max_body_bytes + 1024,
        # Waitress's default (100) is below what one busy trainer keeps open (a pooled connection
        # per live session and per grading), and a connection over it waits unanswered.
        connection_limit=max(100, 4 * (settings.max_sessions + settings.threads)),
        ident="dockyard",
        # poll(), not waitress's default select(): select() raises ValueError on any fd of 1024
        # or more, which a dense executor reaches (about 10 fds per live session), and the
        # serving loop died on the next new connection (issue 24).
        asyncore_use_poll=True,
    )
    server.channel_class = JsonErrorChannel
    return server
