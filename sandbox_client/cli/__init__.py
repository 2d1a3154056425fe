"""The ``dockyard`` command line: grading SWE-bench-format files (``grade``, its report and
progress), ``preflight`` of tasks before training, and ``fleet`` (local executors, reaping pods).

Built on the library (client, protocol, reward mapping, provisioner); nothing in the library
imports it.
"""

from .main import main

__all__ = ["main"]
