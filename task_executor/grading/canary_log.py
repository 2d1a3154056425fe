"""The test output as the agent may see it: no canary named, no canary counted.

The executor judges the raw output; what it hands back is scrubbed: every line naming a canary
goes, with the pytest or unittest failure section it heads, and the runner's summary counts are
put back to the task's own tests (pytest's ``2 failed, 6 passed`` for a run whose only failures
were the canaries planted to fail reads ``5 passed``; unittest's ``Ran 6 tests`` / ``FAILED
(failures=2)`` reads ``Ran 3 tests`` / ``OK``). The counts are adjusted only when the canaries came
out as planted: a tampered run's log stays as the runner printed it, names aside.
"""

from __future__ import annotations

import re

_PYTEST_HEAD = re.compile(r"^_{3,} .* _{3,}\s*$")
_PYTEST_END = re.compile(r"^(_{3,} .* _{3,}|={3,}.*)\s*$")
_PYTEST_HEADER = re.compile(r"^={3,} (FAILURES|ERRORS|short test summary info|PASSES) ={3,}\s*$")
_RULE = re.compile(r"^={20,}\s*$")
_DASHES = re.compile(r"^-{20,}\s*$")
_UNITTEST_END = re.compile(r"^(={20,}|-{20,})\s*$")
_PYTEST_COUNTS = re.compile(r"^(?P<lead>=* ?)(?P<body>\d+ [a-z]+(?:, \d+ [a-z]+)*)"
                            r"(?P<tail> in \d+(?:\.\d+)?s.*)$")
_RAN = re.compile(r"^Ran (\d+) tests?( in .*)$")
_FAILED = re.compile(r"^FAILED \((.*)\)\s*$")


def scrub(text: str, names: list[str], counts: tuple[int, int] | None) -> str:
    """``text`` without the canaries ``names``; with ``counts`` (failed, passed canaries), the
    summary lines without them too."""
    kept: list[str] = []
    section: re.Pattern[str] | None = None  # the end of the section being dropped
    rule_to_skip = False
    for line in text.splitlines(keepends=True):
        if any(name in line for name in names):
            if _PYTEST_HEAD.match(line):
                section = _PYTEST_END
            elif line.startswith(("FAIL:", "ERROR:")) and kept and _RULE.match(kept[-1]):
                kept.pop()  # the ===== over a unittest failure section
                section, rule_to_skip = _UNITTEST_END, True
            continue
        if section is not None:
            if rule_to_skip and _DASHES.match(line):
                rule_to_skip = False  # the ----- under the section's FAIL: line
                continue
            if not section.match(line):
                continue
            section = None
        kept.append(line)
    # A pytest section whose every line was a canary's leaves its header alone: it goes too.
    kept = [line for index, line in enumerate(kept)
            if not (_PYTEST_HEADER.match(line) and index + 1 < len(kept)
                    and _PYTEST_HEADER.match(kept[index + 1]))]
    if counts is not None:
        kept = _uncounted(kept, *counts)
    return "".join(kept)


def _uncounted(lines: list[str], failed: int, passed: int) -> list[str]:
    out: list[str] = []
    for line in lines:
        body, ending = line.rstrip("\r\n"), line[len(line.rstrip("\r\n")):]
        if match := _PYTEST_COUNTS.match(body):
            body = match.group("lead") + _pytest_body(match.group("body"), failed, passed) + \
                match.group("tail")
        elif match := _RAN.match(body):
            body = f"Ran {max(0, int(match.group(1)) - failed - passed)} tests{match.group(2)}"
        elif match := _FAILED.match(body):
            body = _unittest_verdict(match.group(1), failed)
        out.append(body + ending)
    return out


def _pytest_body(body: str, failed: int, passed: int) -> str:
    parts = []
    for part in body.split(", "):
        count, word = part.split(" ", 1)
        left = int(count) - (failed if word == "failed" else passed if word == "passed" else 0)
        if left > 0:
            parts.append(f"{left} {word}")
    return ", ".join(parts) or "no tests ran"


def _unittest_verdict(inside: str, failed: int) -> str:
    counts = dict(part.split("=", 1) for part in inside.split(", ") if "=" in part)
    failures = max(0, int(counts.get("failures", "0")) - failed)
    if failures:
        counts["failures"] = str(failures)
    else:
        counts.pop("failures", None)
    rest = [k for k in counts if k != "skipped" and counts[k] != "0"]
    if not rest:
        skipped = f" (skipped={counts['skipped']})" if "skipped" in counts else ""
        return f"OK{skipped}"
    return "FAILED (" + ", ".join(f"{k}={v}" for k, v in counts.items()) + ")"
