"""The client builds its requests itself (``client._prepare``) instead of through
``requests.Request(...).prepare()``; for every body it sends, the request on the wire must be the
one requests would have made."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from sandbox_client.client import _prepare

BASE = "http://10.0.0.7:9090/session/ab%2Fcd"
HEADERS = {"User-Agent": "dockyard-client/1", "Authorization": "Bearer t0k"}


@pytest.mark.parametrize(("method", "path", "send"), [
    ("POST", "/exec", {"json": {"command": "echo 'hi' \u00e9", "env": {"A": "1"}, "n": 2.5}}),
    ("POST", "/reset", {}),
    ("DELETE", "", {}),
    ("GET", "", {}),
    ("GET", "/file", {"params": {"path": "a b/c&d=é?.py"}}),
    ("PUT", "/file", {"params": {"path": "x.bin"}, "data": b"\x00\xffbytes",
                      "headers": {"Content-Type": "application/octet-stream"}}),
    ("POST", "/upload", {"params": {"path": "/root/tools"}, "data": b"",
                         "headers": {"Content-Type": "application/x-tar"}}),
])
def test_the_request_is_the_one_requests_would_make(method: str, path: str,
                                                     send: dict[str, Any]) -> None:
    extra = send.pop("headers", {})
    ours = _prepare(method, BASE + path, {**HEADERS, **extra}, **send)
    theirs = requests.Request(method, BASE + path, headers={**HEADERS, **extra}, **send).prepare()
    assert (ours.method, ours.url, ours.body) == (theirs.method, theirs.url, theirs.body)
    assert dict(ours.headers) == dict(theirs.headers)


def test_nan_is_refused_as_requests_refuses_it() -> None:
    with pytest.raises(ValueError):
        _prepare("POST", BASE, HEADERS, json={"timeout": float("nan")})
