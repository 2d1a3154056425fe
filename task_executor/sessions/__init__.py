"""Multi-turn shell sessions: the session manager (start, exec, files, snapshot, fork, finish),
the persistent bash runner with its framing and syntax check, byte-exact file access and the
capture of an agent's changes as one patch.

May import grading (finish grades the captured patch), workspaces, sandbox and the shared
``config`` / ``errors``; never Flask, never ``service``.
"""
