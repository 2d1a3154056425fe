"""Where an adapter's session comes from: one given, or one started from a task on a client.

Both the mini-swe-agent and the SWE-ReX adapters accept a ``RemoteSession`` the caller owns, a
``SandboxClient`` (which may route through an image ``Pool``) to start one on, or executor URLs
and a token to build that client from. What the adapter started, it closes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..client import SandboxClient
from ..session import RemoteSession


@dataclass
class OpenedSession:
    """A session and whether the adapter owns it (and the client it made for it)."""

    session: RemoteSession
    owns_session: bool
    own_client: SandboxClient | None

    def close(self) -> None:
        """Close what the adapter made (idempotent; a finished session is already closed)."""
        try:
            if self.owns_session:
                self.session.close()
        finally:
            if self.own_client is not None:
                self.own_client.close()
                self.own_client = None


def open_session(
    task: Mapping[str, Any] | None,
    *,
    session: RemoteSession | None = None,
    client: SandboxClient | None = None,
    urls: str | Sequence[str] | None = None,
    token: str | None = None,
) -> OpenedSession:
    """The caller's ``session``, else a new one for ``task`` (a ``SessionStartSpec`` mapping) on
    ``client``, else on a client made from ``urls``/``token`` (None: the environment's)."""
    if session is not None:
        return OpenedSession(session, owns_session=False, own_client=None)
    if not task:
        raise ValueError("a session or a task to start one for (repo, base_commit, ...) is needed")
    own = None if client is not None else SandboxClient(urls, token)
    try:
        started = (client or own).start_session(dict(task))  # type: ignore[union-attr]
    except BaseException:
        if own is not None:
            own.close()
        raise
    return OpenedSession(started, owns_session=True, own_client=own)

