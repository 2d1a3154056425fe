"""Whether one test run gives a verdict, and whose fault it is when it does not.

A run gives a verdict when its three witnesses agree: the reporter's records (inside the test
process), the runner's summary line in the captured output, and the exit status (both seen by the
executor out of process); and when it ran to the end and reported every required test. Anything
else is a *problem*, and a problem alone says nothing about whose fault it is: the agent's patch
may have crashed the run, or the task may be broken (test command not found, runner missing,
test ids the runner never reports).

``attribute`` decides by the **control**: the same template, test patch and test command without
the agent's patch. If the control is consistent, the task works and the agent's run is
``unresolved`` (its own problem as ``error_code``); only if the control fails too is it
``execution_error``, with a code that names what is broken in the task.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .results import ReportedTests, exit_status_conflict
from .summary import Summary, runner_summary

SUMMARY_MISSING = "summary_missing"

_RUNNER_MISSING = re.compile(r"No module named '?(pytest|django)'?\b|ModuleNotFoundError: No "
                             r"module named '?(pytest|django)'?\b")
_IDS_NOT_FOUND = re.compile(r"^ERROR: (file or directory )?not found: ", re.M)
_COMMAND_NOT_FOUND = re.compile(r"command not found$|can't open file |: not found$", re.M)
_TAIL_BYTES = 4096


@dataclass(frozen=True)
class Problem:
    """Why a run gives no consistent verdict: a machine-readable code and what was seen."""

    code: str
    message: str


@dataclass(frozen=True)
class RunEvidence:
    """One run of the test command: the reporter's records and what the executor saw outside."""

    report: ReportedTests
    exit_code: int | None
    timed_out: bool
    parser: str
    summary: Summary | None
    fault: str | None
    """What the output says is broken in the task (one of ``TASK_FAULT_CODES``), if anything."""
    tail: str
    """The end of the output, for the log of a grading that cites this run."""

    @classmethod
    def of(cls, report: ReportedTests, exit_code: int | None, timed_out: bool, parser: str,
           output: str) -> RunEvidence:
        return cls(report=report, exit_code=exit_code, timed_out=timed_out, parser=parser,
                   summary=runner_summary(output, parser), fault=_fault(exit_code, output),
                   tail=output[-_TAIL_BYTES:])


def _fault(exit_code: int | None, output: str) -> str | None:
    if exit_code in (126, 127) or _COMMAND_NOT_FOUND.search(output):
        return "test_command_not_found"
    if _RUNNER_MISSING.search(output):
        return "test_runner_missing"
    if _IDS_NOT_FOUND.search(output):
        return "test_ids_not_found"
    return None


def problems(run: RunEvidence, required: Sequence[str]) -> list[Problem]:
    """Everything that keeps ``run`` from giving a verdict on its own (empty: it gives one)."""
    found: list[Problem] = []
    report, code = run.report, run.exit_code
    if run.timed_out:
        return [Problem("timeout", "the tests ran past the wall clock")]
    if code is None or code < 0 or code >= 128:
        found.append(Problem("tests_crashed", f"the test process was killed (exit status {code})"))
    elif report.sessions_started > report.sessions_finished:
        found.append(Problem("tests_crashed", "the pytest session never finished: the test "
                             f"process died mid-run (exit status {code})"))
    if not report.states:
        found.append(Problem("no_tests_reported",
                             f"the test command exited {code} and reported no tests"))
    elif code is not None and (conflict := exit_status_conflict(report, code)):
        found.append(Problem("exit_status_mismatch", conflict))
    # pytest's summary is checked whenever the reporter saw a session (it ran, with the plugin);
    # unittest's whenever any test was reported.
    if report.sessions_started if run.parser == "pytest" else report.states:
        found += _summary_problems(run)
    missing = [name for name in required if report.lookup(name) == "MISSING"]
    if missing:
        shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
        found.append(Problem("required_tests_missing",
                             f"{len(missing)} required tests not reported: {shown}"))
    return found


def _summary_problems(run: RunEvidence) -> list[Problem]:
    runner = "pytest" if run.parser == "pytest" else "unittest"
    if run.summary is None:
        return [Problem(SUMMARY_MISSING, f"{runner}'s summary line is missing from the output")]
    if run.parser == "pytest":
        recorded = run.report.failures_in_session
        agree = run.summary.failures == recorded
    else:
        recorded = sum(state in ("FAILED", "ERROR") for state in run.report.states.values())
        agree = (run.summary.failures > 0) == run.report.any_failed
    if agree:
        return []
    return [Problem("report_mismatch", f"{runner}'s summary {run.summary.line!r} counts "
                    f"{run.summary.failures} failed or errored, the reporter {recorded}")]


@dataclass(frozen=True)
class Attribution:
    """The verdict on a run that gives none by itself: ``status`` with ``code`` and ``message``,
    or ``status`` None when the control shows the run's only problems are the task's way."""

    status: str | None
    code: str = ""
    message: str = ""


def attribute(own: list[Problem], control: RunEvidence, required: Sequence[str]) -> Attribution:
    """Whose fault the ``own`` problems of the agent's run are, judged by the control run."""
    theirs = problems(control, required)
    # A command that never prints the runner's summary (pytest -qq, output sent elsewhere) prints
    # none without the agent's patch either: that check does not apply to this task.
    if any(p.code == SUMMARY_MISSING for p in theirs):
        own = [p for p in own if p.code != SUMMARY_MISSING]
        theirs = [p for p in theirs if p.code != SUMMARY_MISSING]
    if not own:
        return Attribution(status=None)
    if not theirs:
        return Attribution("unresolved", own[0].code, f"{own[0].message} (the tests run "
                           "consistently without the agent's patch, so the patch caused it)")
    if control.fault is not None:
        code = control.fault
    elif theirs[0].code == "required_tests_missing":
        code = "test_ids_not_found"
    else:
        code = f"control_{theirs[0].code}"
    return Attribution("execution_error", code, "the task is broken: without the agent's patch "
                       f"the tests fail to give a verdict too ({theirs[0].message}); the agent's "
                       f"run: {own[0].message}")
