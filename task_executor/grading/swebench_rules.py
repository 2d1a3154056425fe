"""SWE-bench's verdict rules (``rules: "swebench"``), as the harness of ``swebench`` 5.0.2 applies
them: ``get_logs_eval``'s checks, ``get_eval_tests_report`` and ``get_resolution_status`` for
``EvalType.PASS_AND_FAIL`` (every Python repository of SWE-bench).

Dockyard's own rule (``strict``, the default for training) counts only PASSED. The harness is
more lenient, and this reproduces it exactly (``tests/executor/test_swebench_parity.py`` checks it
against the package's own functions):

* a FAIL_TO_PASS test succeeds when PASSED or XFAIL (declared or not), and fails when FAILED,
  ERROR, SKIPPED or not reported;
* a PASS_TO_PASS test is maintained when PASSED, XFAIL or SKIPPED, and fails when FAILED, ERROR
  or not reported;
* a required id that is not reported but is a truncated parametrised id (more ``[`` than ``]``)
  takes the status of the reported ids it prefixes, when they agree on pass or fail;
* resolved means every FAIL_TO_PASS and PASS_TO_PASS test succeeded (``RESOLVED_FULL``); no test
  reported at all, or a non-zero exit status with no FAILED or ERROR among the reported tests,
  is no report (unresolved).

Statuses come from Dockyard's reporter, never from the log: where the harness's pytest log parser
loses a test (a skip summary line carries no test id; ``XPASS`` is not a status it knows), the
reporter still knows what happened (SKIPPED; PASSED). Apply failures and timeouts keep their
statuses (``patch_apply_failed``, ``timeout``); ``dockyard grade --rules swebench`` counts them
in ``error_ids``, where the harness puts them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .results import ReportedTests

PASSED, FAILED, SKIPPED, ERROR, XFAIL = "PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"
FULL, PARTIAL, NO = "RESOLVED_FULL", "RESOLVED_PARTIAL", "RESOLVED_NO"
_PASSING = (PASSED, XFAIL)

Report = dict[str, dict[str, list[str]]]


def status_map(run: ReportedTests, required: Iterable[str]) -> dict[str, str]:
    """SWE-bench's status map of a run: every reported test, and each required name the run
    knows by another name (unittest's aliases); an xfail, declared or not, is XFAIL."""
    statuses = {
        name: XFAIL if name in run.xfailed and state in (PASSED, SKIPPED) else state
        for name, state in run.states.items()
        if state != "MISSING"
    }
    for name in required:
        target = run.aliases.get(name)
        if name not in statuses and target in statuses:
            statuses[name] = statuses[target]
    return statuses


def resolve_case(case: str, sm: Mapping[str, str]) -> str | None:
    """The key of ``case`` in ``sm``; a truncated parametrised id matches the ids it prefixes
    when they agree on pass or fail."""
    if case in sm:
        return case
    if case.count("[") > case.count("]"):
        matches = [key for key in sm if key.startswith(case)]
        if matches and len({sm[key] in _PASSING for key in matches}) == 1:
            return matches[0]
    return None


def _passed(case: str, sm: Mapping[str, str]) -> bool:
    key = resolve_case(case, sm)
    return key is not None and sm[key] in _PASSING


def _maintained(case: str, sm: Mapping[str, str]) -> bool:
    key = resolve_case(case, sm)
    return _passed(case, sm) or (key is not None and sm[key] == SKIPPED)


def _failed(case: str, sm: Mapping[str, str]) -> bool:
    key = resolve_case(case, sm)
    return key is None or sm[key] in (FAILED, ERROR, SKIPPED)


def tests_report(sm: Mapping[str, str], fail_to_pass: list[str], pass_to_pass: list[str]) -> Report:
    """``get_eval_tests_report``: each required test as a success or a failure."""
    report: Report = {}
    for kind, tests, succeeded in (
        ("FAIL_TO_PASS", fail_to_pass, _passed),
        ("PASS_TO_PASS", pass_to_pass, _maintained),
    ):
        split: dict[str, list[str]] = {"success": [], "failure": []}
        for case in tests:
            if succeeded(case, sm):
                split["success"].append(case)
            elif _failed(case, sm):
                split["failure"].append(case)
        report[kind] = split
    return report


def _share(split: dict[str, list[str]]) -> float:
    total = len(split["success"]) + len(split["failure"])
    return 1 if total == 0 else len(split["success"]) / total


def resolution_status(report: Report) -> str:
    """``get_resolution_status``: FULL, PARTIAL (some FAIL_TO_PASS, every PASS_TO_PASS) or NO."""
    f2p, p2p = _share(report["FAIL_TO_PASS"]), _share(report["PASS_TO_PASS"])
    if f2p == 1 and p2p == 1:
        return FULL
    if 0 < f2p < 1 and p2p == 1:
        return PARTIAL
    return NO


@dataclass
class Judgement:
    """A run judged by SWE-bench's rules."""

    report: Report
    resolution: str = NO
    problem: tuple[str, str] | None = None
    """Why the harness would find no report (error code, message): the run is unresolved."""
    tests: dict[str, str] = field(default_factory=dict)

    @property
    def resolved(self) -> bool:
        return self.problem is None and self.resolution == FULL


def judge(
    sm: Mapping[str, str], fail_to_pass: list[str], pass_to_pass: list[str], exit_code: int
) -> Judgement:
    """The verdict of ``get_logs_eval`` + ``get_eval_report`` on a status map and exit status."""
    report = tests_report(sm, fail_to_pass, pass_to_pass)
    tests = dict(sm)
    for case in [*fail_to_pass, *pass_to_pass]:
        key = resolve_case(case, sm)
        tests[case] = sm[key] if key is not None else "MISSING"
    if not sm:
        problem = ("no_tests_reported", "the test run reported no tests")
        return Judgement(report, problem=problem, tests=tests)
    if exit_code != 0 and not any(status in (FAILED, ERROR) for status in sm.values()):
        problem = ("exit_status_mismatch",
                   f"test command exited {exit_code} but no reported test failed")
        return Judgement(report, problem=problem, tests=tests)
    return Judgement(report, resolution_status(report), tests=tests)
