"""The client's transport (``sandbox_client/transport.py``) against real loopback sockets: what it
keeps of urllib3's behaviour (kept-alive connections, a dropped idle connection replaced before
use, connect and read failures told apart, compressed bodies) and that a request leaves whole."""

from __future__ import annotations

import gzip
import os
import socket
import threading
import zlib
from collections.abc import Callable, Iterator

import pytest
import requests

from sandbox_client.client import _prepare
from sandbox_client.transport import ConnectFailed, WireAdapter
from tests.client.conftest import RawServer, closed_port

Reply = Callable[[bytes], bytes]


def read_one(conn: socket.socket, pending: bytearray) -> bytes | None:
    """One whole request (head and Content-Length body) from ``conn``; None at end of file."""
    while b"\r\n\r\n" not in pending:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        pending += chunk
    head, _, rest = bytes(pending).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        rest += chunk
    pending[:] = rest[length:]
    return head + b"\r\n\r\n" + rest[:length]


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@pytest.fixture
def serve() -> Iterator[Callable[..., RawServer]]:
    """``serve(reply, close_after=False)``: an HTTP/1.1 server on loopback answering each request
    with ``reply(request)``, keeping the connection open unless ``close_after``; it records the
    requests it read."""
    servers: list[RawServer] = []

    def make(reply: Reply, close_after: bool = False) -> RawServer:
        def handler(conn: socket.socket) -> None:
            pending = bytearray()
            while (request := read_one(conn, pending)) is not None:
                server.requests.append(request)  # type: ignore[attr-defined]
                conn.sendall(reply(request))
                if close_after:
                    conn.close()
                    server.closed.release()  # type: ignore[attr-defined]
                    return

        server = RawServer(handler)
        server.requests = []  # type: ignore[attr-defined]
        server.closed = threading.Semaphore(0)  # type: ignore[attr-defined]
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def send(adapter: WireAdapter, url: str, timeout: tuple[float, float] = (5.0, 30.0),
         **body: object) -> requests.Response:
    method = "POST" if body else "GET"
    return adapter.send(_prepare(method, url, {"User-Agent": "test"}, **body), timeout=timeout)


def test_one_kept_alive_connection_serves_calls_in_turn(serve):
    server = serve(lambda request: answer(b'{"ok": true}', "Content-Type: application/json"))
    with WireAdapter() as adapter:
        for n in range(5):
            response = send(adapter, f"{server.url}/session/s/exec", json={"n": n})
            assert response.status_code == 200 and response.json() == {"ok": True}
    assert server.connections == 1 and len(server.requests) == 5
    head, _, body = server.requests[4].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /session/s/exec HTTP/1.1\r\n")
    assert b"Content-Type: application/json" in head and body == b'{"n": 4}'


def test_an_idle_connection_the_server_closed_is_replaced_before_use(serve):
    # An executor that closes kept-alive connections it deems idle (waitress does, after its
    # channel timeout). Once the close is in (and not while it is on its way: that race is
    # any keep-alive client's, a lost connection the caller never replays), no call fails.
    server = serve(lambda request: answer(b"fine"), close_after=True)
    with WireAdapter() as adapter:
        for _ in range(3):
            assert send(adapter, server.url).content == b"fine"
            assert server.closed.acquire(timeout=30)
    assert server.connections == 3  # each call on a fresh connection


def test_connection_close_is_not_kept(serve):
    server = serve(lambda request: answer(b"x", "Connection: close"))
    with WireAdapter() as adapter:
        send(adapter, server.url)
        send(adapter, server.url)
    assert server.connections == 2


def test_a_refused_connect_is_a_connect_failure_and_nothing_was_sent():
    with WireAdapter() as adapter, pytest.raises(ConnectFailed):
        send(adapter, closed_port())


def test_a_silent_server_is_a_read_timeout(silent_server):
    with WireAdapter() as adapter, pytest.raises(requests.ReadTimeout):
        send(adapter, silent_server.url, timeout=(5.0, 0.3), json={})


def test_a_hang_up_after_the_request_is_a_lost_connection(hangup_server):
    with WireAdapter() as adapter, pytest.raises(requests.ConnectionError) as raised:
        send(adapter, hangup_server.url, json={})
    assert not isinstance(raised.value, ConnectFailed)  # it may have run: never replayed


@pytest.mark.parametrize(("coding", "encode"), [
    ("gzip", gzip.compress), ("deflate", zlib.compress),
    ("deflate", lambda data: zlib.compress(data)[2:-4]),  # raw deflate, as some servers send
])
def test_compressed_bodies_are_decoded(serve, coding, encode):
    server = serve(lambda request: answer(encode(b'{"a": 1}'), f"Content-Encoding: {coding}"))
    with WireAdapter() as adapter:
        assert send(adapter, server.url).json() == {"a": 1}


def test_an_undecodable_body_is_a_decoding_error(serve):
    server = serve(lambda request: answer(b"not gzip", "Content-Encoding: gzip"))
    with WireAdapter() as adapter, pytest.raises(requests.exceptions.ContentDecodingError):
        send(adapter, server.url)


def test_threads_share_the_pool_without_mixing_answers(serve):
    def echo(request: bytes) -> bytes:
        return answer(request.partition(b"\r\n\r\n")[2])

    server = serve(echo)
    failures: list[str] = []
    with WireAdapter(pool_maxsize=2) as adapter:
        def worker(n: int) -> None:
            for i in range(20):
                body = {"worker": n, "i": i}
                if send(adapter, server.url, json=body).json() != body:
                    failures.append(f"{n}/{i}")

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == [] and len(server.requests) == 80


def test_other_schemes_and_hostless_urls_are_refused():
    with WireAdapter() as adapter:
        with pytest.raises(requests.exceptions.InvalidSchema):
            send(adapter, "ftp://127.0.0.1/x")
        with pytest.raises(requests.exceptions.InvalidURL):
            send(adapter, "http:///path")


def test_a_dropped_adapter_closes_its_kept_connections(serve):
    # A client dropped without close(): its connections close with it, as urllib3's pools do,
    # instead of each raising ResourceWarning (an error in this suite) whenever it is collected.
    import gc
    import warnings

    server = serve(lambda request: answer(b"x"))
    adapter = WireAdapter()
    send(adapter, server.url)
    kept = next(iter(adapter._idle.values()))[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del adapter
        gc.collect()
    assert kept.sock is None  # closed
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


def test_connections_are_kept_past_fd_1024(serve):
    # A trainer's process with many files open: the kept connection's fd is above select()'s
    # limit, and must still be found alive and reused.
    server = serve(lambda request: answer(b"x"))
    padding = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with WireAdapter() as adapter:
            for _ in range(3):
                send(adapter, server.url)
            assert next(iter(adapter._idle.values()))[0].sock.fileno() > 1024
    finally:
        for fd in padding:
            os.close(fd)
    assert server.connections == 1
