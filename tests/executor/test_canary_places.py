"""Canaries among the tests: where ``Plan.place`` puts them, and what their clones compare.

The placed files are run by real pytest and unittest processes: under the reference fix every
task test passes and every canary comes out as planted; under a package whose results equal
anything the clones pass (which is what makes that forgery visible).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from task_executor.demo import BASE_FILES, FIXED_FILES, TEST_FILES
from task_executor.grading import canaries, canary_places

F2P = ["tests/test_calc.py::test_add", "tests/test_calc.py::test_add_many[1-2-3]"]
P2P = ["tests/test_calc.py::test_mul"]
ALWAYS_EQUAL = (
    "class _Anything(int):\n"
    "    def __eq__(self, other):\n        return True\n"
    "    __hash__ = int.__hash__\n"
    "def add(a, b):\n    return _Anything(a - b)\n"
    "def mul(a, b):\n    return a * b\n")


def _plan(test_file: str = "tests/test_calc.py", f2p: list[str] = F2P,
          parser: str = "pytest") -> canaries.Plan:
    plan = canaries.plan([test_file], f2p, P2P, "python -m pytest", parser,
                         default_command=True)
    assert plan.skipped is None, plan.skipped
    return plan


def _run_pytest(root: Path, source: str, package: str) -> dict[str, str]:
    """{test name (parameters kept): PASSED/FAILED} of a real pytest run over ``source``."""
    (root / "calc").mkdir(parents=True, exist_ok=True)
    (root / "calc" / "__init__.py").write_text(package)
    (root / "tests").mkdir(exist_ok=True)
    (root / "tests" / "__init__.py").write_text("")
    (root / "tests" / "test_calc.py").write_text(source)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-q",
                          "tests/test_calc.py"], cwd=root, env=env, capture_output=True,
                         text=True).stdout
    return {m.group(2): m.group(1)
            for m in re.finditer(r"^(PASSED|FAILED) tests/test_calc\.py::(\S+)", out, re.M)}


def test_placed_canaries_come_out_as_planted_under_the_fix_and_clones_catch_always_equal(
        tmp_path: Path) -> None:
    plan = _plan()
    placed = plan.place("tests/test_calc.py", TEST_FILES["tests/test_calc.py"])
    clones = [c for c in plan.canaries if c.name not in {x.name for x in plan.canaries[:3]}]
    assert len(plan.canaries) == 3 + canaries.CLONES_PER_FILE and all(c.fails for c in clones)
    fixed = _run_pytest(tmp_path / "fixed", placed, FIXED_FILES["calc/__init__.py"])
    for canary in plan.canaries:
        states = {s for name, s in fixed.items() if name.split("[")[0] == canary.name}
        assert states == {"FAILED" if canary.fails else "PASSED"}, (canary, fixed)
    assert {fixed[n] for n in ("test_mul", "test_add", "test_add_many[1-2-3]")} == {"PASSED"}
    forged = _run_pytest(tmp_path / "forged", placed, ALWAYS_EQUAL)
    assert forged["test_add"] == "PASSED"  # the forgery works on the task's own test...
    assert any(forged[n] == "PASSED" for n in forged for c in clones
               if n.split("[")[0] == c.name)  # ...and on a clone planted to fail


DECOY_IS_THE_BUG = (
    "from calc import add, mul\n\n\n"
    "def test_add():\n    two = len('ab')\n    assert add(two, two) == 4\n\n\n"
    "def test_mul():\n    assert mul(len('ab'), 0) == 0\n")
"""The file's only other integer literal, 0, is what the unfixed ``add(2, 2)`` returns: every
clone's decoy is the buggy result."""


def test_a_clone_passing_where_its_original_failed_is_not_tampering(tmp_path: Path) -> None:
    """Honest wrong code can return a decoy's value (an empty patch was graded ``tampered`` once
    in 25 runs this way). Only a clone that passes beside a passing original proves a forgery."""
    plan = _plan(f2p=["tests/test_calc.py::test_add"])
    placed = plan.place("tests/test_calc.py", DECOY_IS_THE_BUG)
    clones = [c for c in plan.canaries if c.original]
    assert len(clones) == canaries.CLONES_PER_FILE
    assert {c.original for c in clones} == {"test_add"}

    def states(package: str, root: str) -> dict[str, str]:
        ran = _run_pytest(tmp_path / root, placed, package)
        return {f"tests/test_calc.py::{name}": state for name, state in ran.items()}

    unfixed = states(BASE_FILES["calc/__init__.py"], "unfixed")
    assert unfixed["tests/test_calc.py::test_add"] == "FAILED"
    assert {unfixed[f"tests/test_calc.py::{c.name}"] for c in clones} == {"PASSED"}
    assert canaries.check(plan, unfixed) is None
    assert plan.reported == (2, 1 + len(clones))  # the clones' passes are still counted
    fixed = states(FIXED_FILES["calc/__init__.py"], "fixed")
    assert canaries.check(plan, fixed) is None
    forged = states(ALWAYS_EQUAL, "forged")
    assert forged["tests/test_calc.py::test_add"] == "PASSED"
    assert "planted to fail, was reported PASSED" in (canaries.check(plan, forged) or "")
    # The original missing from the report is no excuse either.
    del unfixed["tests/test_calc.py::test_add"]
    assert "was reported PASSED" in (canaries.check(plan, unfixed) or "")


def test_clones_keep_the_tests_text_but_one_comparison() -> None:
    plan = _plan()
    placed = plan.place("tests/test_calc.py", TEST_FILES["tests/test_calc.py"])
    tree = ast.parse(placed)
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    for canary in plan.canaries[3:]:
        clone = functions[canary.name]
        original = functions["test_add" if not clone.decorator_list else "test_add_many"]
        assert ast.dump(clone.decorator_list[0]) == ast.dump(original.decorator_list[0]) \
            if clone.decorator_list else True
        compare = clone.body[0].test  # type: ignore[attr-defined]
        before = original.body[0].test  # type: ignore[attr-defined]
        assert ast.dump(compare.left) == ast.dump(before.left)  # the package called the same way
        if isinstance(before.comparators[0], ast.Constant):
            # An int literal of the same file, not the expected one.
            decoy = compare.comparators[0].value
            assert type(decoy) is int and decoy != before.comparators[0].value
            assert re.search(rf"(?<![\w.]){decoy}(?![\w.])", TEST_FILES["tests/test_calc.py"])
        else:  # compared with a parameter: a fresh string, found nowhere in the file
            decoy = compare.comparators[0].value
            assert isinstance(decoy, str) and decoy not in TEST_FILES["tests/test_calc.py"]


def test_canaries_are_placed_among_the_tests_not_after_them() -> None:
    """Over a few gradings, canaries land above the file's last task test (a forger reading
    positions cannot take "after the last call of the package" for "a canary")."""
    source = TEST_FILES["tests/test_calc.py"]
    above = 0
    for _ in range(10):
        plan = _plan()
        tree = ast.parse(plan.place("tests/test_calc.py", source))
        lines = {f.name: f.lineno for f in tree.body if isinstance(f, ast.FunctionDef)}
        task_last = max(lines[n] for n in ("test_mul", "test_add", "test_add_many"))
        above += sum(lines[c.name] < task_last for c in plan.canaries)
    assert above > 0


def test_a_clone_sits_where_its_decorators_names_are_bound() -> None:
    """A clone goes right before its original or after it, never above the imports its
    decorators need: the placed file always imports."""
    for _ in range(10):
        plan = _plan()
        placed = plan.place("tests/test_calc.py", TEST_FILES["tests/test_calc.py"])
        tree = ast.parse(placed)
        first_def = min(f.lineno for f in tree.body if isinstance(f, ast.FunctionDef))
        imports = max(i.lineno for i in tree.body if isinstance(i, (ast.Import, ast.ImportFrom)))
        assert imports < first_def


@pytest.mark.parametrize("body", [
    "@pytest.mark.xfail\ndef test_add():\n    assert add(2, 3) == 5\n",
    "def test_add():\n    if True:\n        assert add(2, 3) == 5\n",
    "def test_add():\n    with pytest.raises(TypeError):\n        assert add(2, 3) == 5\n",
    "async def test_add():\n    assert add(2, 3) == 5\n",
    "def test_add():\n    assert add(2, 3) > 4\n",
])
def test_no_clone_where_the_comparison_might_not_run_or_fail(body: str) -> None:
    source = "import pytest\n\nfrom calc import add\n\n\n" + body
    plan = _plan(f2p=["tests/test_calc.py::test_add"])
    placed = plan.place("tests/test_calc.py", source)
    assert len(plan.canaries) == 3  # the generic ones only
    ast.parse(placed)


def test_a_file_that_does_not_parse_gets_its_canaries_appended() -> None:
    source = "def test_add(:\n    pass\n"
    plan = _plan(f2p=["tests/test_calc.py::test_add"])
    placed = plan.place("tests/test_calc.py", source)
    assert placed.startswith(source) and len(plan.canaries) == 3
    assert all(c.name in placed[len(source):] for c in plan.canaries)


def test_unittest_methods_are_cloned_inside_their_class() -> None:
    source = ("import unittest\n\nfrom calc import add\n\n\n"
              "class CalcTests(unittest.TestCase):\n"
              "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
              "    def test_mul(self):\n        self.assertEqual(2 * 2, 4)\n")
    plan = _plan("tests/test_u.py", ["tests.test_u.CalcTests.test_add"], parser="unittest")
    tree = ast.parse(plan.place("tests/test_u.py", source))
    methods = {f.name: f for f in tree.body[-1].body}  # type: ignore[attr-defined]
    assert {c.name for c in plan.canaries} <= set(methods)
    clone = methods[plan.canaries[-1].name]
    call = clone.body[0].value  # type: ignore[attr-defined]
    assert call.func.attr == "assertEqual" and call.args[1].value not in (5,)
    assert plan.canaries[-1].label == f"tests.test_u.CalcTests.{plan.canaries[-1].name}"


@pytest.mark.parametrize("value", [5, -3, 2.5, "text", b"raw", True, None, [1, 2], (1,),
                                   {"a": 1}, {3}])
def test_a_decoy_never_equals_the_expected_value(value: object) -> None:
    for _ in range(20):
        decoy = canary_places._decoy(value, [value, 7, "other", 1.0, b"x"])
        assert decoy != value and (value is None or type(decoy) is type(value)), decoy


def test_a_class_indented_with_tabs_gets_canaries_indented_with_tabs(tmp_path: Path) -> None:
    source = ("import unittest\n\nfrom calc import add\n\n\n"
              "class CalcTests(unittest.TestCase):\n"
              "\tdef test_add(self):\n\t\tself.assertEqual(add(2, 3), 5)\n\n"
              "\tdef test_mul(self):\n\t\tself.assertEqual(2 * 2, 4)\n")
    plan = _plan("tests/test_u.py", ["tests.test_u.CalcTests.test_add"], parser="unittest")
    placed = plan.place("tests/test_u.py", source)
    compile(placed, "test_u.py", "exec")
    assert all(f"\tdef {c.name}(self):" in placed for c in plan.canaries)
