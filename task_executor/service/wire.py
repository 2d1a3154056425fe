"""JSON answers every client can parse: no string holds a lone surrogate.

File names, test ids and paths come from trees and test runs, where they are bytes; the executor
keeps bytes that are not UTF-8 as lone surrogates (``surrogateescape``). Python's encoder would
write those as ``\\udcXX`` escapes, valid JSON syntax that strict parsers (pydantic's, the
client's) refuse, and the whole answer, a verdict with it, would be lost. So every such string
is shown with its undecodable bytes escaped (``caf\\xe9.txt``) instead. Patches never need this:
finish captures them as UTF-8 (GIT binary patches where the bytes are not).
"""

from __future__ import annotations

from typing import Any

from flask.json.provider import DefaultJSONProvider

from sandbox_client.protocol import is_utf8


def printable(value: Any) -> Any:
    """``value`` with every string (dict keys too) that is not UTF-8 shown with ``\\xNN``."""
    if isinstance(value, str):
        if is_utf8(value):
            return value
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {printable(key): printable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [printable(item) for item in value]
    return value


class WireJSONProvider(DefaultJSONProvider):
    """Flask's JSON provider, writing only strings that are valid Unicode."""

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        return super().dumps(printable(obj), **kwargs)
