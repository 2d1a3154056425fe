"""The code record: honest tests of every shape keep their verdicts; its judge reads records.

Tests that are decorated (a ``functools.wraps`` wrapper, ``mock.patch``, a wrapper calling the
test several times and skipping the calls it rejects, as hypothesis does), nested in classes,
asynchronous (``IsolatedAsyncioTestCase``), fed by fixtures, or methods of a ``TestCase`` run
by pytest are called through something other than the runner, or not as plain functions: the
gold patch must still be ``resolved`` and the empty patch plainly ``unresolved`` (no
``tampered``), through a real executor. The judge (``code_check``) is also tested on the
records a reporter writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from task_executor.demo import DemoTask, diff_of, make_demo_task
from task_executor.grading.code_check import code_problem
from task_executor.grading.results import parse_report
from tests.conftest import RunningExecutor, module_executor

SHAPES = '''import functools
import unittest
from unittest import mock

import pytest

from calc import add, mul


class Unsatisfied(Exception):
    pass


def examples(*cases):
    """Calls the test once per case and skips a case it rejects, as hypothesis's @given
    does with ``assume``."""
    def decorate(function):
        def run():
            for case in cases:
                try:
                    function(*case)
                except Unsatisfied:
                    continue
        return run
    return decorate


def logged(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)
    return wrapper


@logged
def test_add():
    assert add(2, 3) == 5


@mock.patch("calc.mul", lambda a, b: a * b)
def test_add_patched():
    assert add(-1, 1) == 0


class TestOuter:
    class TestInner:
        def test_add_nested(self):
            assert add(1, 1) == 2


class AsyncTests(unittest.IsolatedAsyncioTestCase):
    async def test_add_async(self):
        self.assertEqual(add(1, 2), 3)


class PlainTests(unittest.TestCase):
    def test_add_method(self):
        self.assertEqual(add(2, 2), 4)


@pytest.fixture
def two():
    return 2


def test_add_fixture(two):
    assert add(two, two) == 4


@examples((3, 3), (1, 2), (2, 1))
def test_add_commutes(a, b):
    if a == b:
        raise Unsatisfied  # the first call stops here: a later one runs to its end
    assert add(a, b) == add(b, a)


def test_mul():
    assert mul(3, 4) == 12
'''
FILE = "tests/test_shapes.py"


@pytest.fixture(scope="module")
def shared_executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningExecutor]:
    with module_executor(tmp_path_factory, "code-record") as running:
        yield running


@pytest.fixture(scope="module")
def shapes_task(tmp_path_factory: pytest.TempPathFactory) -> DemoTask:
    task = make_demo_task(tmp_path_factory.mktemp("shapes") / "repo")
    f2p = [f"{FILE}::{name}" for name in (
        "test_add", "test_add_patched", "TestOuter::TestInner::test_add_nested",
        "AsyncTests::test_add_async", "PlainTests::test_add_method", "test_add_fixture",
        "test_add_commutes")]
    return DemoTask(repo=task.repo, base_commit=task.base_commit, gold_patch=task.gold_patch,
                    test_patch=diff_of(Path(task.repo), {FILE: SHAPES}), fail_to_pass=f2p,
                    pass_to_pass=[f"{FILE}::test_mul"])


def test_honest_tests_of_every_shape_keep_their_verdicts(shared_executor: RunningExecutor,
                                                         shapes_task: DemoTask) -> None:
    gold = shared_executor.submit(shapes_task.request("shapes-gold",
                                                      shapes_task.gold_patch)).json()
    assert (gold["status"], gold["error_code"]) == ("resolved", None), (
        gold["error"], gold["log"][-3000:])
    assert gold["canaries"] > 3  # clones of the decorated and fixture-fed tests among them
    empty = shared_executor.submit(shapes_task.request("shapes-empty", "")).json()
    assert (empty["status"], empty["error_code"]) == ("unresolved", None), empty["error"]


def _report(*lines: str) -> bytes:
    return "\n".join(lines).encode()


EXPECTED = ('{"kind": "code", "event": "expected", "files": {"t/test_a.py": "checked"}, '
            '"functions": {"t/test_a.py": {"test_a": ["aaa"], "K.test_b": ["bbb"]}}}')
PASSED_A = [f'{{"kind": "test", "id": "t/test_a.py::test_a", "when": "{when}", '
            f'"outcome": "passed"}}' for when in ("setup", "call", "teardown")]


def test_the_judge_wants_a_record_for_each_required_test_that_passed() -> None:
    ran = ('{"kind": "code", "event": "ran", "id": "t/test_a.py::test_a", "file": "t/test_a.py",'
           ' "qualname": "test_a", "hash": "aaa", "direct": true, "returned": null}')
    report = parse_report(_report(EXPECTED, *PASSED_A, ran))
    assert code_problem(report, ["t/test_a.py::test_a"], "pytest") is None
    report = parse_report(_report(EXPECTED, *PASSED_A))
    assert "never ran" in (code_problem(report, ["t/test_a.py::test_a"], "pytest") or "")
    for wrong, why in ((ran.replace('"aaa"', '"zzz"'), "does not define"),
                       (ran.replace('"aaa"', "null"), "not its code"),
                       (ran.replace('"direct": true', '"direct": false'), "raised inside")):
        report = parse_report(_report(EXPECTED, *PASSED_A, wrong))
        assert why in (code_problem(report, ["t/test_a.py::test_a"], "pytest") or ""), wrong
    # A test that failed gained nothing by what ran inside it (a decorated clone that raised).
    failed = [line.replace('"call", "outcome": "passed"', '"call", "outcome": "failed"')
              for line in PASSED_A]
    raised = ran.replace('"direct": true', '"direct": false').replace('"returned": null',
                                                                       '"returned": false')
    assert code_problem(parse_report(_report(EXPECTED, *failed, raised)),
                        ["t/test_a.py::test_a"], "pytest") is None


def test_the_judge_reads_a_changed_file_or_no_record_as_tampering() -> None:
    changed = EXPECTED.replace('"checked"', '"changed"')
    report = parse_report(_report(changed, *PASSED_A))
    assert "changed before the tests ran" in (code_problem(report, [], "pytest") or "")
    report = parse_report(_report(*PASSED_A))
    assert "code record is missing" in (code_problem(report, [], "pytest") or "")


def test_the_judge_leaves_tests_no_checked_file_defines_alone() -> None:
    """A test defined elsewhere (imported into the test file, made by a factory) has no
    record to hold: it is not judged."""
    other = [line.replace("test_a.py::test_a", "test_a.py::test_imported") for line in PASSED_A]
    report = parse_report(_report(EXPECTED, *other))
    assert code_problem(report, ["t/test_a.py::test_imported"], "pytest") is None


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoTask:
    return make_demo_task(tmp_path_factory.mktemp("demo") / "repo")


def test_the_code_record_holds_where_canaries_cannot_go(shared_executor: RunningExecutor,
                                                        demo: DemoTask) -> None:
    """A command in shell syntax, run from another directory, takes no canaries; the code
    record still reads the test files (from the tree's root, not the command's directory) and
    sees the FAIL_TO_PASS tests' code swapped. The gold patch resolves under it."""
    from tests.executor.test_tampering_redteam import SWAP_KNOWN_CODE, _appended

    command = "cd tests && python -m pytest -p no:cacheprovider --rootdir=.. test_calc.py"
    body = {**demo.request("cd-swap", _appended(demo, SWAP_KNOWN_CODE)), "test_command": command}
    result = shared_executor.submit(body).json()
    assert result["canaries"] == 0 and "shell syntax" in result["canaries_skipped"]
    assert (result["status"], result["error_code"]) == ("unresolved", "tampered"), (
        result["error"], result["log"][-2000:])
    assert "ran code its file does not define" in result["error"]
    gold = shared_executor.submit({**body, "task_id": "cd-gold", "patch": demo.gold_patch}).json()
    assert (gold["status"], gold["error_code"]) == ("resolved", None), gold["error"]
