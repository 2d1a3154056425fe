"""Whether a run was tampered with: its canaries, the reporter's integrity record, its code record.

All are read out of process, from what the run left: the canaries' states in the report (did
each come out as planted?), the code record (did each test that passed run its file's code?
``code_check``), and the integrity record (``reporter/dockyard_integrity.py``): a
``tamper`` line whenever a report found pytest's or unittest's entry points changed, and the
marks of those entry points at start and at the end, which must agree. A record missing from a
run that reported tests is itself a finding: the reporter writes it before any test code runs.
"""

from __future__ import annotations

from .canaries import Plan, check
from .code_check import code_problem
from .consistency import Problem, RunEvidence
from .results import ReportedTests

TESTS_FAILED = 1
"""The exit status of pytest, unittest and Django's runtests.py when tests failed."""


def exit_problem(plan: Plan, run: RunEvidence) -> Problem | None:
    """A run with failing canaries in it must exit as a run with failures does: any other
    status (0, or a forced 3) was decided by something other than the tests."""
    code = run.exit_code
    if not plan.planted or run.timed_out or code is None or code < 0 or code >= 128:
        return None  # killed: ``problems`` has it
    if code != TESTS_FAILED:
        return Problem("exit_status_mismatch", f"test command exited {code}, where a run with "
                       f"failing tests exits {TESTS_FAILED}")
    return None


def tampering(plan: Plan, report: ReportedTests, parser: str,
              crashed: bool = False) -> str | None:
    """What shows the run was tampered with, or None. Of a ``crashed`` run (no tests reported,
    or its session never finished) only what the record saw counts: its canaries and end marks
    are missing anyway, and the control judges that."""
    if report.tampered:
        return f"tampering seen while the tests ran: {report.tampered[0]}"
    if crashed:
        return None
    if found := _integrity(report, parser):
        return found
    if plan.code_files and (found := code_problem(report, plan.required, parser)):
        return found
    if plan.planted:
        return check(plan, report.states)
    return None


def _integrity(report: ReportedTests, parser: str) -> str | None:
    ran = report.sessions_finished if parser == "pytest" else bool(report.states)
    if not ran:
        return None  # no report to check (a crash, no tests): the control judges that run
    starts, finishes = report.integrity.get("start", []), report.integrity.get("finish", [])
    # pytest's end marks come before its session's end; unittest's at exit, which os._exit
    # skips (a run that exits so is judged by its exit status and the control, not here).
    if not starts or (parser == "pytest" and not finishes):
        return "the reporter's integrity record is missing " + (
            "its start" if not starts else "its end")
    first = starts[0]
    for marks in [*starts[1:], *finishes]:
        changed = sorted(k for k in first.keys() | marks.keys() if first.get(k) != marks.get(k))
        if changed:
            return f"the test runner's entry points changed while the tests ran: {changed[0]}"
    return None
