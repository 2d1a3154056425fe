"""The process limits a dense executor runs into, raised where it may (issue 24).

Each live session holds about ten file descriptors in the executor, so the soft open-files limit
(often 1,024) caps the number of sessions long before memory does. The hard limit is the one the
administrator set; raising the soft one to it needs no privilege.
"""

from __future__ import annotations

import resource


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one; return the effective (soft) limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit is no valid soft one (the kernel caps it at nr_open): keep it then.
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft
