"""How code under test is launched and contained: what the kernel allows (detected once), the
launcher that wraps every command of code under test, resource limits, running one command with
capped output, and the reaper that kills whatever a command left behind.

The bottom layer: imports nothing of the executor but the shared ``config`` / ``errors``.
"""
