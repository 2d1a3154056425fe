"""The tests' own loopback servers stop listening when closed (see tests.loopback): a stale one
answered a later test's executor requests (``BadStatusLine('1')`` in CI)."""

from __future__ import annotations

import socket

import pytest

from tests.client.conftest import RawServer
from tests.loopback import LoopbackServer
from tests.processes import ConnectionCounter


def _refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.settimeout(10)
            connection.recv(16)
    except ConnectionRefusedError:
        return True
    return False


def test_a_closed_counter_no_longer_answers() -> None:
    counter = ConnectionCounter()
    with socket.create_connection(("127.0.0.1", counter.port), timeout=10) as check_in:
        assert check_in.recv(16) == b"0"  # the accepting thread is back in accept() after this
    counter.close()
    # A close() alone left the socket listening under the blocked accept(): this got b"1".
    assert _refused(counter.port)
    assert counter.count == 1


@pytest.mark.parametrize("make", [lambda: RawServer(lambda conn: conn.close()),
                                  lambda: LoopbackServer(lambda conn: conn.close())])
def test_a_closed_server_no_longer_accepts(make) -> None:  # type: ignore[no-untyped-def]
    server = make()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as first:
        assert first.recv(16) == b""  # accepted and closed by the handler
    server.close()
    assert _refused(server.port)
