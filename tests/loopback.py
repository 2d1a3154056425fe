"""Loopback TCP servers the tests start in a thread, and stop for good.

Closing a listening socket does not stop a thread blocked in ``accept()`` on it: the call holds
the socket, which goes on listening, and Linux's ``bind(("127.0.0.1", 0))`` with SO_REUSEADDR
(waitress sets it) may hand the same port to a later test's executor. That later executor's
client then reached a stale test server: ``BadStatusLine('1')`` (a connection counter's reply)
or ``RemoteDisconnected`` (a hang-up server) on a request to a healthy executor, once in a while
in a full run. :meth:`LoopbackServer.close` shuts the socket down first, which wakes the
``accept()``, and waits for the thread to end.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


class LoopbackServer:
    """A TCP listener on 127.0.0.1 (an ephemeral port) whose thread hands each accepted
    connection to ``handle`` (which owns it, and runs on the accepting thread unless it starts
    one of its own)."""

    def __init__(self, handle: Callable[[socket.socket], None], backlog: int = 16) -> None:
        self._handle = handle
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(backlog)
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._sock.accept()
            except OSError:  # shut down by close()
                return
            self._handle(connection)

    def close(self) -> None:
        """Stop listening now: no connection is accepted after this returns."""
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() (EINVAL)
        except OSError:
            pass
        self._sock.close()
        self._thread.join()
