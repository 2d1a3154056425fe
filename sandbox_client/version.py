"""The installed distribution's version, for the ``--version`` of every console script (one
distribution, ``dockyard``, ships the executor, the client and the provisioner)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "dockyard"


def dockyard_version() -> str:
    """The version pip installed, or ``unknown`` when run from a tree nobody installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed)"
