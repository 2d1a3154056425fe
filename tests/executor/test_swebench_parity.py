"""``rules: "swebench"`` against the ``swebench`` package's own grading functions.

Every combination of statuses (PASSED, FAILED, ERROR, SKIPPED, XFAIL, not reported) for two
FAIL_TO_PASS and two PASS_TO_PASS tests, with exit status 0 and 1, then thousands of random
status maps (more tests, tests nobody asked for, truncated parametrised ids, other exit
statuses). Each is judged by ``swebench_rules.judge`` and by the harness: its
``get_eval_tests_report`` and ``get_resolution_status`` on the same map, and its whole
``get_eval_report`` on a test log that its pytest parser reads back into that map.

The package is heavy (docker, datasets, modal), so it is not a test dependency: this module is
skipped without it, and ``.ci/run`` runs it in a virtualenv of its own with the ``[swebench]``
extra (``pip install -e '.[swebench]'``).
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from task_executor.grading import swebench_rules

grading = pytest.importorskip("swebench.harness.grading", reason="needs the swebench package")
constants = pytest.importorskip("swebench.harness.constants")
types = pytest.importorskip("swebench.types")

STATUSES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", None)  # None: not reported


def harness_report(sm: dict[str, str], f2p: list[str], p2p: list[str], exit_code: int,
                   log: Path) -> dict:
    """The harness's ``get_eval_report`` on a log whose test section spells ``sm`` the way
    pytest's ``-rA`` summary does."""
    lines = [f"{status} {name}" for name, status in sm.items()]
    log.write_text("\n".join([constants.START_TEST_OUTPUT, *lines, constants.END_TEST_OUTPUT,
                              f"{constants.TEST_EXIT_CODE}: {exit_code}", ""]))
    spec = types.TestSpec(instance_id="i", image="", eval_script_list=[], repo="o/r",
                          version="0", FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p,
                          log_parser="parse_log_pytest", eval_type="pass_and_fail")
    prediction = {"instance_id": "i", "model_patch": "diff", "model_name_or_path": "m"}
    return grading.get_eval_report(spec, prediction, str(log), include_tests_status=True)["i"]


def check(sm: dict[str, str], f2p: list[str], p2p: list[str], exit_code: int, log: Path) -> None:
    gold = {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}
    theirs = grading.get_eval_tests_report(sm, gold)
    ours = swebench_rules.tests_report(sm, f2p, p2p)
    assert ours == {kind: theirs[kind] for kind in gold}, (sm, f2p, p2p)
    assert swebench_rules.resolution_status(ours) == grading.get_resolution_status(theirs)

    judged = swebench_rules.judge(sm, f2p, p2p, exit_code)
    report = harness_report(sm, f2p, p2p, exit_code, log)
    context = (sm, f2p, p2p, exit_code, report)
    assert report["patch_successfully_applied"] == (judged.problem is None), context
    assert report["resolved"] == judged.resolved, context
    if judged.problem is None:
        assert report["tests_status"]["FAIL_TO_PASS"] == judged.report["FAIL_TO_PASS"], context
        assert report["tests_status"]["PASS_TO_PASS"] == judged.report["PASS_TO_PASS"], context


def test_every_combination_of_statuses_for_two_f2p_and_two_p2p(tmp_path: Path) -> None:
    f2p, p2p = ["t.py::f1", "t.py::f2"], ["t.py::p1", "t.py::p2"]
    verdicts = set()
    for statuses in itertools.product(STATUSES, repeat=4):
        sm = {name: s for name, s in zip([*f2p, *p2p], statuses, strict=True) if s is not None}
        for exit_code in (0, 1):
            check(sm, f2p, p2p, exit_code, tmp_path / "log")
            verdicts.add(swebench_rules.judge(sm, f2p, p2p, exit_code).resolved)
    assert verdicts == {True, False}


def _random_case(rng: random.Random) -> tuple[dict[str, str], list[str], list[str], int]:
    names = [f"tests/test_{rng.choice('abc')}.py::test_{i}" for i in range(rng.randint(1, 12))]
    sm: dict[str, str] = {}
    for name in names:
        status = rng.choice(STATUSES)
        if status is not None:
            sm[name] = status
    required = list(names)
    for i in range(rng.randint(0, 3)):  # parametrised ids, some truncated in the test lists
        stem = f"tests/test_p.py::test_param{i}[x"
        for suffix in rng.sample(["a]", "b]", "c-d]"], rng.randint(0, 3)):
            sm[stem + suffix] = rng.choice(STATUSES[:-1])
        required.append(stem if rng.random() < 0.7 else stem + "a]")
    rng.shuffle(required)
    cut = rng.randint(0, len(required))
    exit_code = rng.choice((0, 0, 1, 2, 5))
    return sm, required[:cut] or required[:1], required[cut:], exit_code


def test_random_status_maps(tmp_path: Path) -> None:
    rng = random.Random(14)
    for _ in range(3000):
        check(*_random_case(rng), tmp_path / "log")
