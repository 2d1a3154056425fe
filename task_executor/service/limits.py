"""Process-wide settings the executor's children inherit, set where it may.

Each live session holds about ten file descriptors in the executor, so the soft open-files limit
(often 1,024) caps the number of sessions long before memory does (issue 24). The hard limit is
the one the administrator set; raising the soft one to it needs no privilege.

A signal the executor's process ignores is ignored by every command it starts, through bwrap, sh
and bash alike (a shell cannot undo an ignore it started with). A process started in the
background by a script (``nohup task-executor serve &``, a test run ``&``) ignores SIGINT and
SIGQUIT: an interrupt's SIGINT then did not stop ``sleep``, and the command was SIGKILLed (137,
not 130).
"""

from __future__ import annotations

import logging
import resource
import signal
import threading

log = logging.getLogger(__name__)


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one; return the effective (soft) limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit is no valid soft one (the kernel caps it at nr_open): keep it then.
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def stop_ignoring_signals() -> None:
    """SIGINT and SIGQUIT back to their defaults if this process ignores them (Python's
    KeyboardInterrupt for SIGINT). Only the main thread may: from another, a warning says what
    the commands will ignore."""
    ignored = [sig for sig in (signal.SIGINT, signal.SIGQUIT)
               if signal.getsignal(sig) == signal.SIG_IGN]
    if ignored and threading.current_thread() is not threading.main_thread():
        log.warning("this process ignores %s, and so will every command it runs (interrupt "
                    "kills instead): start it in the foreground",
                    ", ".join(sig.name for sig in ignored))
        return
    for sig in ignored:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    if ignored:
        log.info("%s no longer ignored: commands get them as usual",
                 ", ".join(sig.name for sig in ignored))
