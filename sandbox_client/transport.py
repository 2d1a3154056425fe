"""The client's HTTP transport: requests' adapter interface, sent over ``http.client``.

Every call of :class:`~sandbox_client.client.SandboxClient` goes through
:meth:`WireAdapter.send`, as it went through ``requests.adapters.HTTPAdapter.send`` before: the
same prepared request in, the same ``requests.Response`` and ``requests`` exceptions out, so the
client's error classification (``client._transport_error``) and the tests' ``responses`` mocks
(pointed at this method) are unchanged. What changes is the cost. urllib3 and requests' adapter
added 0.6 ms to a call that costs 2.2 ms over ``http.client`` on the executor's fastest route
(scripts/bench/README.md, "The subshell off the critical path"); an agent's shell command is
such a call, thousands of times per rollout.

What it keeps from urllib3, because the client relies on it:

- kept-alive connections per executor, at most ``pool_maxsize`` idle ones each, shared by
  threads; an idle connection the executor closed meanwhile is dropped before it is used
  (readable while idle means end of file), so a request is never written into a dead socket
  that was known to be dead;
- connect and read timeouts apart: a connect that fails or times out raises
  :class:`ConnectFailed` (the request never left: safe to send elsewhere), anything after it
  ``requests.ReadTimeout`` or ``requests.ConnectionError`` (the request may have run: never
  replayed, see ``RemoteSession.exec``);
- ``gzip``/``deflate`` bodies decoded (a proxy may compress), an undecodable one
  ``ContentDecodingError``.

Headers and body leave in one ``send`` (``http.client`` joins them for a bytes body). No proxies,
no redirects, no cookies: the client calls executors directly and never needs them.
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
import weakref
import zlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from requests.structures import CaseInsensitiveDict

_Key = tuple[str, str, int]


class ConnectFailed(requests.ConnectionError):
    """The connection could not be made (refused, unreachable, timed out): nothing was sent."""


class WireAdapter(HTTPAdapter):
    """``HTTPAdapter`` whose :meth:`send` speaks ``http.client`` over pooled connections."""

    def __init__(self, pool_maxsize: int = 10) -> None:
        super().__init__(max_retries=0)
        self._maxsize = max(1, pool_maxsize)
        self._idle: dict[_Key, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        # As urllib3's pools do: kept connections are closed when the adapter is collected
        # unclosed (a client dropped without close()), not left to raise ResourceWarning.
        weakref.finalize(self, _close_all, self._idle)

    def send(  # type: ignore[override]
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float, float] | None = None,
        verify: bool | str = True,
        cert: Any = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        url = request.url or ""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise requests.exceptions.InvalidSchema(f"no transport for {url!r}", request=request)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise requests.exceptions.InvalidURL(str(exc), request=request) from exc
        if not parts.hostname:
            raise requests.exceptions.InvalidURL(f"no host in {url!r}", request=request)
        connect_s, read_s = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        key = (parts.scheme, parts.hostname, port)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        conn = self._take(key)
        if conn is None:
            conn = self._connect(key, connect_s, verify, request)
        try:
            assert conn.sock is not None
            conn.sock.settimeout(read_s)
            conn.request(request.method or "GET", target, body=_body(request.body),
                         headers=dict(request.headers))
            answer = conn.getresponse()
            data = answer.read()
        except TimeoutError as exc:  # socket.timeout
            conn.close()
            raise requests.ReadTimeout(exc, request=request) from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise requests.ConnectionError(exc, request=request) from exc
        if answer.will_close:
            conn.close()
        else:
            self._give_back(key, conn)
        return _response(request, answer, data)

    def __enter__(self) -> WireAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            _close_all(self._idle)
        super().close()

    def _take(self, key: _Key) -> http.client.HTTPConnection | None:
        """An idle connection to ``key`` that is still open, or None."""
        while True:
            with self._lock:
                pool = self._idle.get(key)
                if not pool:
                    return None
                conn = pool.pop()
            if not _dropped(conn):
                return conn
            conn.close()

    def _give_back(self, key: _Key, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            pool = self._idle.setdefault(key, [])
            if len(pool) < self._maxsize:
                pool.append(conn)
                return
        conn.close()

    @staticmethod
    def _connect(
        key: _Key, timeout: float | None, verify: bool | str, request: requests.PreparedRequest
    ) -> http.client.HTTPConnection:
        scheme, host, port = key
        conn: http.client.HTTPConnection
        if scheme == "https":
            context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
            if verify is False:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.connect()
            assert conn.sock is not None
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, ssl.SSLError) as exc:
            conn.close()
            raise ConnectFailed(exc, request=request) from exc
        return conn


def _close_all(idle: dict[_Key, list[http.client.HTTPConnection]]) -> None:
    """Close and forget every kept connection (the dict stays: the finalizer holds it)."""
    for connections in idle.values():
        for conn in connections:
            conn.close()
    idle.clear()


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection was closed by the other end (readable while idle: the end of
    file, or bytes nobody asked for)."""
    sock = conn.sock
    if sock is None:
        return True
    # poll, not select: a trainer's process often holds more than 1,024 fds, which select()
    # refuses (every kept connection would then look dropped, and none would be reused).
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


def _body(body: Any) -> bytes | None:
    if body is None or isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return bytes(body)


def _response(
    request: requests.PreparedRequest, answer: http.client.HTTPResponse, data: bytes
) -> requests.Response:
    response = requests.Response()
    response.status_code = answer.status
    response.reason = answer.reason
    response.headers = CaseInsensitiveDict(answer.getheaders())
    response.url = request.url or ""
    response.request = request
    response.encoding = requests.utils.get_encoding_from_headers(response.headers)
    coding = response.headers.get("Content-Encoding", "").strip().lower()
    if coding in ("gzip", "deflate"):
        data = _decoded(data, coding, request)
    response._content = data
    response._content_consumed = True
    return response


def _decoded(data: bytes, coding: str, request: requests.PreparedRequest) -> bytes:
    """A gzip or deflate body decoded (deflate zlib-wrapped or raw, as urllib3 takes it)."""
    forms = [16 + zlib.MAX_WBITS] if coding == "gzip" else [zlib.MAX_WBITS, -zlib.MAX_WBITS]
    for wbits in forms:
        try:
            return zlib.decompress(data, wbits)
        except zlib.error as exc:
            failure = exc
    raise requests.exceptions.ContentDecodingError(failure, request=request) from failure
