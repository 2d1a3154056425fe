"""Per-test states from the reporter's file, and the verdict they add up to.

The reporter (``reporter/dockyard_report.py``) writes JSON lines from inside the test process;
nothing here looks at the test command's output. The exit status of the test command is then
cross-checked against those states: a runner that says "failed" while every reported test passed
(or the reverse) means something other than the tests decided the outcome, and that run alone
gives no verdict (``consistency`` decides whose fault it is).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_client.protocol import TestState
from task_executor.sandbox.confined import ConfinedTree, Refusal

log = logging.getLogger(__name__)

_BAD = ("FAILED", "ERROR")


@dataclass
class ReportedTests:
    """What the reporter saw: per-test states and the names they may be asked for by."""

    states: dict[str, TestState] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    xfailed: set[str] = field(default_factory=set)
    """Tests whose outcome was an expected failure, declared or not (SWE-bench's XFAIL)."""
    sessions_started: int = 0
    sessions_finished: int = 0
    """pytest sessions the reporter saw start and finish (a start without a finish: it died)."""
    failures_in_session: int = 0
    """Failed or errored reports (collection included) since the last session started: what
    pytest's own summary line counts as failed plus errors."""
    tampered: list[str] = field(default_factory=list)
    """What the reporter's integrity record found changed in the runner while it ran."""
    integrity: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    """The integrity record's marks of the runner's entry points, by event (start, finish)."""
    code: list[dict] = field(default_factory=list)
    """The code record (``reporter/dockyard_code.py``): what each test file defines, and
    what each test's call ran; judged by ``code_check``."""
    called: set[str] = field(default_factory=set)
    """Tests whose function was called in the reporting process (a pytest call phase, not a
    pytest-xdist worker's; a unittest pass or xfail)."""

    def lookup(self, name: str) -> TestState:
        key = name if name in self.states else self.aliases.get(name)
        return self.states[key] if key is not None else "MISSING"

    @property
    def any_failed(self) -> bool:
        return any(state in _BAD for state in self.states.values())


def _pytest_state(phases: dict[str, dict]) -> TestState:
    setup, call, teardown = phases.get("setup"), phases.get("call"), phases.get("teardown")
    if call is not None and call["outcome"] == "failed":
        return "FAILED"
    for phase in (setup, teardown):
        if phase is not None and phase["outcome"] == "failed":
            return "ERROR"
    for phase in (setup, call):
        if phase is not None and phase["outcome"] == "skipped":
            declared_xfail = phase.get("wasxfail") and phase.get("xfail_marked")
            return "PASSED" if declared_xfail else "SKIPPED"
    if call is not None and call["outcome"] == "passed":
        return "PASSED"
    return "ERROR" if setup is not None else "MISSING"


_UNITTEST_STATES: dict[str, TestState] = {
    "passed": "PASSED",
    "xfailed": "PASSED",
    "failed": "FAILED",
    "error": "ERROR",
    "skipped": "SKIPPED",
}
# Severity decides between several outcomes of one test (subtests, duplicate names).
_SEVERITY = {"MISSING": 0, "PASSED": 1, "SKIPPED": 2, "FAILED": 3, "ERROR": 4}


MAX_REPORT_BYTES = 64 * 1024 * 1024
"""A report is a few JSON lines per test; past this it is not a report but an attack on memory."""


def read_report(directory: Path | ConfinedTree, name: str) -> ReportedTests:
    """The report file ``name`` in ``directory`` (the workspace's temporary directory), parsed.

    Code under test can write that directory: the report may have been replaced by a symlink
    to a host file, a FIFO, a device or a huge file. It is read through ``sandbox.confined``
    (no symlink followed, nothing but a regular file opened, nothing blocks); anything but a
    regular file of sane size reads as no report at all.
    """
    try:
        if isinstance(directory, ConfinedTree):
            data = directory.read_bytes(name, MAX_REPORT_BYTES)
        else:
            with ConfinedTree(directory) as tree:
                data = tree.read_bytes(name, MAX_REPORT_BYTES)
    except Refusal as refusal:
        if refusal.code != "file_not_found":
            log.warning("test report ignored: %s", refusal)
        return ReportedTests()
    return parse_report(data)


def parse_report(data: bytes) -> ReportedTests:
    """Parse the reporter's JSON lines; a malformed line is ignored, not trusted."""
    run = ReportedTests()
    phases: dict[str, dict[str, dict]] = {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict):
            continue
        kind = record.get("kind")
        test_id = str(record.get("id", ""))
        if kind == "test" and record.get("outcome") != "rerun":
            by_phase = phases.setdefault(test_id, {})
            earlier = by_phase.get(str(record.get("when")))
            if earlier is not None and earlier.get("outcome") == "failed" != record.get(
                    "outcome"):
                # pytest reports each phase of a test once: a later "passed" for a phase that
                # failed was written by something else (into the reporter's own file).
                run.tampered.append(f"two outcomes for one test phase: {test_id}")
            by_phase[str(record.get("when"))] = record
            if record.get("when") == "call" and not record.get("remote"):
                run.called.add(test_id)
            run.failures_in_session += record.get("outcome") == "failed"
        elif kind == "collect":
            run.states[test_id or "<collection>"] = "ERROR"
            run.failures_in_session += 1
        elif kind == "session" and record.get("event") == "start":
            run.sessions_started += 1
            run.failures_in_session = 0
        elif kind == "session" and record.get("event") == "finish":
            run.sessions_finished += 1
        elif kind == "tamper":
            run.tampered.append(str(record.get("what"))[:200])
        elif kind == "integrity" and isinstance(record.get("marks"), dict):
            marks = {str(k): str(v) for k, v in record["marks"].items()}
            run.integrity.setdefault(str(record.get("event")), []).append(marks)
        elif kind == "code":
            run.code.append(record)
        elif kind == "unittest":
            if record.get("outcome") in ("passed", "xfailed"):
                run.called.add(test_id)
            if record.get("outcome") == "xfailed":
                run.xfailed.add(test_id)
            state = _UNITTEST_STATES.get(str(record.get("outcome")), "ERROR")
            previous = run.states.get(test_id, "MISSING")
            if _SEVERITY[state] >= _SEVERITY[previous]:
                run.states[test_id] = state
            for alias in record.get("aliases") or []:
                run.aliases.setdefault(str(alias), test_id)
    for test_id, by_phase in phases.items():
        run.states[test_id] = _pytest_state(by_phase)
        if any(phase.get("outcome") == "skipped" and phase.get("wasxfail")
               for phase in by_phase.values()):
            run.xfailed.add(test_id)
    return run


def exit_status_conflict(run: ReportedTests, exit_code: int) -> str | None:
    """Why the test command's exit status contradicts the reported tests, or None if it agrees."""
    if exit_code == 0 and run.any_failed:
        failed = sorted(name for name, state in run.states.items() if state in _BAD)
        return f"test command exited 0 but reported failures: {', '.join(failed[:5])}"
    if exit_code != 0 and not run.any_failed:
        if not run.states:
            return f"test command exited {exit_code} and reported no tests"
        return f"test command exited {exit_code} but no reported test failed"
    return None
