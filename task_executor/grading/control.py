"""Control runs: the task's tests without the agent's patch, run once per task and kept.

A control is keyed by everything that decides its outcome and nothing the agent controls: the
template key (repository source, commit sha, setup, environment), the test patch, the test command
and parser, egress and the wall clock. The agent's patch is never part of it, and the control runs
in a fresh workspace of the template, whose copy-on-write layers no grading can write through; so
no patch can choose the control its own run is judged by.

The first grading that needs a key runs it; gradings that need the same key meanwhile wait for that
run instead of starting their own (``OnceCache``). A run that raised (an infrastructure fault) is
not kept: the next grading that needs it tries again.
"""

from __future__ import annotations

import hashlib
import json

from .consistency import RunEvidence
from .once import OnceCache


def control_key(template: str, test_patch: str, command: str, parser: str, deny_network: bool,
                timeout: float) -> str:
    material = json.dumps([template, test_patch, command, parser, deny_network, timeout])
    return hashlib.sha256(material.encode("utf-8", "surrogateescape")).hexdigest()[:32]


class ControlCache(OnceCache[RunEvidence]):
    """Control runs by ``control_key``; a grading of the empty patch is ``offer``ed as one."""
