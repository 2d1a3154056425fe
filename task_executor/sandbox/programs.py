"""The host programs code under test is started with, by absolute path."""

from __future__ import annotations

import functools
import os
import shutil

TRUSTED_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@functools.cache
def host_program(name: str) -> str | None:
    """The absolute path of a program the executor starts code under test with.

    Never looked up on the task's PATH at launch: subprocess would search it relative to the
    command's cwd, the agent's tree, and a relative entry ('.', or an empty one) would run an
    ``sh`` the agent committed -- as root, on the host, before any sandbox exists.
    """
    found = shutil.which(name, path=TRUSTED_PATH)
    return os.path.realpath(found) if found else None
