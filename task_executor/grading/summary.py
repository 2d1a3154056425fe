"""The test runner's own last word, read from the output the executor captured out of process.

The reporter runs inside the test process, so code under test can rewrite what it records. The
runner's summary line (pytest's ``=== 3 failed, 2 passed in 0.12s ===``, unittest's
``Ran 5 tests`` / ``FAILED (failures=3)``) is written by the runner through the pipe the executor
drains: printing cannot take back a line already written, so a forger that rewrote the report
must also silence or forge this line to agree with it. That raises the bar; it is not a proof
(code in the test process can do anything the runner can), and ``consistency`` treats every
disagreement as "no consistent verdict", never as a pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PYTEST_TAIL = re.compile(r"^(?P<body>.+?) in \d+(?:\.\d+)?(?:s| seconds)(?: \(\d+:\d\d:\d\d\))?$")
_PART = re.compile(r"^(?P<count>\d+) (?P<word>[a-z][a-z ]*)$")
_UNITTEST_RAN = re.compile(r"^Ran (?P<count>\d+) tests? in \d+(?:\.\d+)?s$")
_UNITTEST_COUNT = re.compile(r"(failures|errors|unexpected successes)=(\d+)")


@dataclass(frozen=True)
class Summary:
    """A runner's final counts line."""

    line: str
    failures: int
    """Failed plus errored tests by the runner's own count."""


def _lines(output: str) -> list[str]:
    return [_ANSI.sub("", line).strip() for line in output.splitlines()]


def _is_failure_word(word: str) -> bool:
    # "failed", "error(s)", plugin categories such as "subtests failed"; never "xfailed".
    return word in ("failed", "error", "errors") or word.endswith((" failed", " errors"))


def pytest_summary(output: str) -> Summary | None:
    """The last pytest summary line in ``output`` (framed by ``=`` or, with ``-q``, bare)."""
    for line in reversed(_lines(output)):
        framed = line.strip("=").strip()
        match = _PYTEST_TAIL.match(framed)
        if match is None:
            continue
        parts = match.group("body").split(", ")
        if parts == ["no tests ran"]:
            return Summary(line=line, failures=0)
        counted = [_PART.match(part) for part in parts]
        if all(counted):
            failures = sum(int(m.group("count")) for m in counted
                           if m is not None and _is_failure_word(m.group("word")))
            return Summary(line=line, failures=failures)
    return None


def unittest_summary(output: str) -> Summary | None:
    """unittest's (and Django's) ``Ran N tests`` line and the verdict line after it, last pair."""
    lines = _lines(output)
    for index in range(len(lines) - 1, -1, -1):
        if _UNITTEST_RAN.match(lines[index]) is None:
            continue
        verdict = next((line for line in lines[index + 1 :] if line), "")
        if verdict.startswith("OK"):
            return Summary(line=f"{lines[index]} {verdict}", failures=0)
        if verdict.startswith("FAILED"):
            failures = sum(int(n) for _, n in _UNITTEST_COUNT.findall(verdict))
            return Summary(line=f"{lines[index]} {verdict}", failures=max(failures, 1))
        return None
    return None


def runner_summary(output: str, parser: str) -> Summary | None:
    """The summary line of the runner ``parser`` names (pytest; unittest for the others)."""
    return pytest_summary(output) if parser == "pytest" else unittest_summary(output)
