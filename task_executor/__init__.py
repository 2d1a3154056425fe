"""Dockyard task executor: grades agent patches in fresh working trees and hosts shell sessions.

The packages are layers, each importing only those below it, so the folder reads as the
architecture:

    service/     the HTTP side (Flask app, waitress server, routes, metrics, lifecycle)
    sessions/    multi-turn shells: session manager, shell runner, framing, files, capture
    grading/     one patch to one verdict: grader, patching, diffs, test config, results
    workspaces/  trees at a commit: workspace factory, templates, mirrors, git and fs helpers
    sandbox/     how code under test is launched and contained: launcher, limits, reaper

``config`` (the settings object) and ``errors`` (the error tree) import nothing of the executor
and are shared by every layer; ``cli`` and ``demo`` are entry points above them all. Nothing below
``service/`` imports Flask.
"""

__version__ = "0.1.0"
