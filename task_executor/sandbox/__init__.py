"""How code under test is launched and contained: what the kernel allows (detected once), the
launcher that wraps every command of code under test, resource limits, running one command with
capped output, the reaper that kills whatever a command left behind, and confined file access to
the trees code under test controls (``confined``: the kernel resolves paths inside them).

The bottom layer: imports nothing of the executor but the shared ``config`` / ``errors``.
"""
