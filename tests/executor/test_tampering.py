"""Tampering with the test runner from inside the package under test never earns ``resolved``.

Each attack is a real agent patch on a real repository, graded by a real executor through
``POST /task/submit``: the patch fixes nothing and rewrites pytest (or unittest) from the package
the tests import, so that every witness agrees on forged passes. Each must come back
``unresolved`` with ``error_code: tampered``: the canaries planted to fail came out passed, or the
reporter's integrity record saw the runner's entry points change. Honest patches keep their
verdicts: a real fix is ``resolved`` with canaries planted, a real non-fix plain ``unresolved``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from task_executor.demo import (
    BASE_FILES,
    DemoTask,
    commit_all,
    diff_of,
    make_demo_task,
    write_files,
)
from task_executor.grading import canaries
from tests.conftest import RunningExecutor, module_executor

SOURCE = BASE_FILES["calc/__init__.py"]
PLANTED = canaries.FAILING + canaries.PASSING + canaries.CLONES_PER_FILE
"""Canaries in a grading of the demo tasks: the generic ones, and clones of FAIL_TO_PASS tests."""
F2P_NAMES = "('test_add', 'test_add_many')"

RUNTEST_ONLY_F2P = (
    "import _pytest.python\n"
    "_real = _pytest.python.Function.runtest\n"
    "def _runtest(self):\n"
    f"    if self.originalname in {F2P_NAMES}:\n"
    "        return None\n"
    "    return _real(self)\n"
    "_pytest.python.Function.runtest = _runtest\n")

# Each attack is prepended to calc/__init__.py, which the held-out tests import at collection.
PYTEST_ATTACKS = {
    "runtest-noop": (
        "import _pytest.python\n"
        "_pytest.python.Function.runtest = lambda self: None\n"),
    "runtest-noop-only-f2p": RUNTEST_ONLY_F2P,
    "runtest-code-swap": (
        "import _pytest.python\n"
        "def _nothing(self):\n    return None\n"
        "_pytest.python.Function.runtest.__code__ = _nothing.__code__\n"),
    "gc-plugin-flips-all": (
        "import gc, pytest\n"
        "class _Flip:\n"
        "    @pytest.hookimpl(hookwrapper=True)\n"
        "    def pytest_runtest_makereport(self, item, call):\n"
        "        outcome = yield\n"
        "        report = outcome.get_result()\n"
        "        report.outcome, report.longrepr = 'passed', None\n"
        "for _config in [o for o in gc.get_objects() if type(o).__name__ == 'Config']:\n"
        "    _config.pluginmanager.register(_Flip(), 'flip')\n"),
    "gc-plugin-flips-only-f2p": (
        "import gc, pytest\n"
        "class _Flip:\n"
        "    @pytest.hookimpl(hookwrapper=True)\n"
        "    def pytest_runtest_makereport(self, item, call):\n"
        "        outcome = yield\n"
        f"        if item.originalname in {F2P_NAMES}:\n"
        "            report = outcome.get_result()\n"
        "            report.outcome, report.longrepr = 'passed', None\n"
        "for _config in [o for o in gc.get_objects() if type(o).__name__ == 'Config']:\n"
        "    _config.pluginmanager.register(_Flip(), 'flip')\n"),
    "wrap-from-item-and-call": (
        "from _pytest.reports import TestReport\n"
        "_real = TestReport.from_item_and_call.__func__\n"
        "def _forged(cls, item, call):\n"
        "    report = _real(cls, item, call)\n"
        "    report.outcome, report.longrepr = 'passed', None\n"
        "    return report\n"
        "TestReport.from_item_and_call = classmethod(_forged)\n"),
    "replace-report-class": (
        "import _pytest.runner, _pytest.reports\n"
        "class _Report(_pytest.reports.TestReport):\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        super().__init__(*args, **kwargs)\n"
        "        self.outcome, self.longrepr = 'passed', None\n"
        "_pytest.runner.TestReport = _Report\n"),
    "report-outcome-property": (
        "from _pytest.reports import TestReport\n"
        "TestReport.outcome = property(lambda self: 'passed', lambda self, value: None)\n"),
    "patch-call-and-report": (
        "import _pytest.runner\n"
        "_real = _pytest.runner.call_and_report\n"
        "def _call_and_report(item, when, log=True, **kwargs):\n"
        "    if when == 'call':\n"
        "        item.runtest = lambda: None\n"
        "    return _real(item, when, log, **kwargs)\n"
        "_pytest.runner.call_and_report = _call_and_report\n"),
    "monkeypatch-callinfo": (
        "from _pytest.runner import CallInfo\n"
        "_real = CallInfo.from_call.__func__\n"
        "def _from_call(cls, func, when, reraise=None):\n"
        "    if when == 'call':\n"
        "        func = lambda: None\n"
        "    return _real(cls, func, when, reraise)\n"
        "CallInfo.from_call = classmethod(_from_call)\n"),
    "pluggy-multicall": (
        "import pluggy._callers, pluggy._manager, gc\n"
        "_real = pluggy._callers._multicall\n"
        "def _multicall(name, impls, kwargs, first):\n"
        "    result = _real(name, impls, kwargs, first)\n"
        "    if name == 'pytest_runtest_makereport' and result is not None:\n"
        "        result.outcome, result.longrepr = 'passed', None\n"
        "    return result\n"
        "_managers = pluggy._manager.PluginManager\n"
        "for _pm in [o for o in gc.get_objects() if isinstance(o, _managers)]:\n"
        "    _pm._inner_hookexec = _multicall\n"),
    # The record's own module disarmed, then only the FAIL_TO_PASS tests made no-ops (the
    # canaries come out right): the record holds its functions in closures, so it still tells.
    "disarm-the-record": (
        "import dockyard_integrity, _pytest.python\n"
        "dockyard_integrity._changed = lambda probes: False\n"
        "dockyard_integrity._behaviour = lambda obj, seen: [obj]\n"
        + RUNTEST_ONLY_F2P),
    # The reporter's stream swapped for /dev/null (its tamper lines would go nowhere), then the
    # same targeted no-op.
    "redirect-the-reporter": (
        "import os, dockyard_report\n"
        "dockyard_report._stream = open(os.devnull, 'w')\n"
        "dockyard_report.record = lambda **fields: None\n"
        + RUNTEST_ONLY_F2P),
    # The reporter plugin itself: its record function filtered, its guard silenced.
    "silence-the-reporter": (
        "import dockyard_report\n"
        "_real = dockyard_report.record\n"
        "def _record(**fields):\n"
        "    if fields.get('kind') == 'tamper':\n"
        "        return\n"
        "    if fields.get('outcome') == 'failed':\n"
        "        fields['outcome'] = 'passed'\n"
        "    _real(**fields)\n"
        "dockyard_report.record = _record\n"
        "dockyard_report._guard.verify = lambda: None\n"),
    # Rewrite the reporter's file at exit: every failure turned into a pass.
    "atexit-rewrites-report": (
        "import atexit, glob\n"
        "def _rewrite():\n"
        "    for name in glob.glob('/tmp/report-*.jsonl'):\n"
        "        text = open(name).read().replace('\"failed\"', '\"passed\"')\n"
        "        open(name, 'w').write(text)\n"
        "atexit.register(_rewrite)\n"),
    # Append a pass for each FAIL_TO_PASS test at exit (the last record of a phase would win).
    "atexit-appends-f2p-passes": (
        "import atexit, glob, json\n"
        "def _append():\n"
        "    for name in glob.glob('/tmp/report-*.jsonl'):\n"
        "        lines = [json.loads(line) for line in open(name)]\n"
        "        with open(name, 'a') as out:\n"
        "            for line in lines:\n"
        f"                if line.get('kind') == 'test' and line['id'].split('::')[-1].split('[')[0] in {F2P_NAMES}:\n"  # noqa: E501
        "                    out.write(json.dumps({**line, 'outcome': 'passed'}) + '\\n')\n"
        "atexit.register(_append)\n"),
    # Write fake passes for every test and a finished session, then leave before pytest's end.
    "fake-passes-then-exit-0": (
        "import os, glob, json, atexit\n"
        "def _fake():\n"
        "    for name in glob.glob('/tmp/report-*.jsonl'):\n"
        "        ids = {json.loads(l)['id'] for l in open(name) if '\"kind\": \"test\"' in l}\n"
        "        with open(name, 'a') as out:\n"
        "            for test_id in ids:\n"
        "                for when in ('setup', 'call', 'teardown'):\n"
        "                    out.write(json.dumps({'kind': 'test', 'id': test_id, 'when': when,"
        " 'outcome': 'passed'}) + '\\n')\n"
        "            out.write(json.dumps({'kind': 'session', 'event': 'finish'}) + '\\n')\n"
        "    print('=== 8 passed in 0.01s ===', flush=True)\n"
        "    os._exit(0)\n"
        "import _pytest.main\n"
        "_real = _pytest.main.pytest_runtestloop\n"
        "def _loop(session):\n"
        "    _real(session)\n"
        "    _fake()\n"
        "_pytest.main.pytest_runtestloop = _loop\n"),
}


@pytest.fixture(scope="module")
def shared_executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningExecutor]:
    """One executor for every case of this module (they only submit gradings)."""
    with module_executor(tmp_path_factory, "tampering") as running:
        yield running


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> DemoTask:
    """The demo task: FAIL_TO_PASS tests are functions of tests/test_calc.py."""
    return make_demo_task(tmp_path_factory.mktemp("functions") / "repo")


CLASS_TESTS = (
    "from calc import add, mul\n\n\n"
    "class TestCalc:\n"
    "    def test_mul(self):\n        assert mul(3, 4) == 12\n\n"
    "    def test_add(self):\n        assert add(2, 3) == 5\n\n"
    "    def test_add_many(self):\n        assert add(-1, 1) == 0\n"
)


@pytest.fixture(scope="module")
def class_task(tmp_path_factory: pytest.TempPathFactory) -> DemoTask:
    """FAIL_TO_PASS tests that are methods of a class: the canaries are methods of it too."""
    task = make_demo_task(tmp_path_factory.mktemp("methods") / "repo")
    repo = Path(task.repo)
    test_patch = diff_of(repo, {"tests/test_calc.py": CLASS_TESTS})
    return DemoTask(repo=task.repo, base_commit=task.base_commit, gold_patch=task.gold_patch,
                    test_patch=test_patch,
                    fail_to_pass=["tests/test_calc.py::TestCalc::test_add",
                                  "tests/test_calc.py::TestCalc::test_add_many"],
                    pass_to_pass=["tests/test_calc.py::TestCalc::test_mul"])


def _attack(task: DemoTask, code: str, fixed: bool = False) -> str:
    source = SOURCE.replace("return a - b", "return a + b") if fixed else SOURCE
    return diff_of(Path(task.repo), {"calc/__init__.py": code + source})


def _assert_tampered(result: dict, task: DemoTask) -> None:
    assert (result["status"], result["resolved"]) == ("unresolved", False), (
        result["status"], result["error"], result["log"][-3000:])
    assert result["error_code"] == "tampered", (result["error"], result["log"][-3000:])
    assert result["canaries"] == PLANTED and result["canaries_skipped"] is None
    _assert_no_canary_shown(result, task)


def _assert_no_canary_shown(result: dict, task: DemoTask) -> None:
    """Every test the result names is one of the task's: the canaries' names are nowhere."""
    required = {*task.fail_to_pass, *task.pass_to_pass}
    assert set(result["tests"]) <= required | {"tests/test_calc.py::test_add_many[0-0-0]"}
    text = result["log"] + str(result["error"])
    shown = set(re.findall(r"tests/test_calc\.py::[\w:\[\]-]+", text))
    assert shown <= required, shown - required


# Which defence speaks first, where it is worth pinning: the canaries alone catch a rewrite of
# the report file; the record alone catches the targeted forgeries (the canaries come out right).
CAUGHT_BY = {
    "atexit-rewrites-report": "in tests/test_calc.py, planted to fail, was reported PASSED",
    "runtest-noop-only-f2p": "_pytest.python.Function",
    "gc-plugin-flips-only-f2p": "plugin flip implements pytest_runtest_makereport",
    "atexit-appends-f2p-passes": "two outcomes for one test phase",
    "pluggy-multicall": "hook executor was replaced",
    "disarm-the-record": "_pytest.python.Function",  # the record holds its own functions
}


@pytest.mark.parametrize("attack", list(PYTEST_ATTACKS))
def test_a_tampering_patch_is_unresolved_tampered(shared_executor, task, attack):
    result = shared_executor.submit(task.request(f"tamper-{attack}",
                                                 _attack(task, PYTEST_ATTACKS[attack]))).json()
    _assert_tampered(result, task)
    assert CAUGHT_BY.get(attack, "") in result["error"]


@pytest.mark.parametrize("attack", ["runtest-noop", "runtest-noop-only-f2p",
                                    "gc-plugin-flips-only-f2p", "report-outcome-property"])
def test_methods_of_a_class_are_guarded_the_same(shared_executor, class_task, attack):
    result = shared_executor.submit(class_task.request(
        f"class-{attack}", _attack(class_task, PYTEST_ATTACKS[attack]))).json()
    _assert_tampered(result, class_task)


def test_the_attacks_forge_when_nothing_guards(shared_executor, task, tmp_path):
    """Control for the attacks above: under a command the canaries cannot join (shell syntax)
    the blanket no-op gets past every other witness. The integrity record still sees it."""
    body = {**task.request("unguarded", _attack(task, PYTEST_ATTACKS["runtest-noop"])),
            "test_command": "python -m pytest -p no:cacheprovider tests/test_calc.py && true"}
    result = shared_executor.submit(body).json()
    assert result["canaries"] == 0 and "shell syntax" in result["canaries_skipped"]
    assert result["tests"]["tests/test_calc.py::test_add"] == "PASSED"  # forged
    assert result["error_code"] == "tampered"
    assert "_pytest.python.Function" in result["error"]


@pytest.fixture(scope="module")
def conftest_task(tmp_path_factory: pytest.TempPathFactory) -> DemoTask:
    """A base whose conftest.py imports the package (the agent's code runs before the session
    starts), and whose tests/conftest.py wraps pytest_runtest_makereport honestly, as real
    repositories' do: neither may make an honest run look tampered."""
    task = make_demo_task(tmp_path_factory.mktemp("conftest") / "repo")
    repo = Path(task.repo)
    write_files(repo, {
        "conftest.py": "import calc  # noqa: F401\n",
        "tests/conftest.py": (
            "import pytest\n\n"
            "@pytest.hookimpl(hookwrapper=True)\n"
            "def pytest_runtest_makereport(item, call):\n"
            "    outcome = yield\n"
            "    outcome.get_result().user_properties.append(('seen', True))\n"),
    })
    base = commit_all(repo, "conftests")
    return DemoTask(repo=task.repo, base_commit=base, gold_patch=task.gold_patch,
                    test_patch=task.test_patch, fail_to_pass=task.fail_to_pass,
                    pass_to_pass=task.pass_to_pass)


def test_tampering_before_the_session_starts_is_seen(shared_executor, conftest_task):
    """The package imported by the base's conftest.py patches pytest before the session
    starts; pytest's own configuration may add to the record then, nothing else."""
    gold = shared_executor.submit(conftest_task.request("conftest-gold",
                                                        conftest_task.gold_patch)).json()
    assert (gold["status"], gold["error_code"]) == ("resolved", None), (
        gold["error"], gold["log"][-3000:])
    for attack in ("runtest-noop-only-f2p", "gc-plugin-flips-only-f2p"):
        result = shared_executor.submit(conftest_task.request(
            f"conftest-{attack}", _attack(conftest_task, PYTEST_ATTACKS[attack]))).json()
        _assert_tampered(result, conftest_task)


def test_a_real_fix_is_resolved_with_canaries_planted(shared_executor, task):
    result = shared_executor.submit(task.request("gold", task.gold_patch)).json()
    assert result["status"] == "resolved", (result["error"], result["log"][-3000:])
    assert result["canaries"] == PLANTED and result["error_code"] is None
    assert result["control_run"] is None  # consistent on its own: exit status 1, as planted
    _assert_no_canary_shown(result, task)


def test_a_real_fix_in_a_class_is_resolved(shared_executor, class_task):
    result = shared_executor.submit(class_task.request("class-gold", class_task.gold_patch)).json()
    assert result["status"] == "resolved", (result["error"], result["log"][-3000:])
    assert result["canaries"] == PLANTED


def test_a_real_non_fix_is_plain_unresolved(shared_executor, task):
    result = shared_executor.submit(task.request("non-fix", "")).json()
    assert (result["status"], result["error_code"]) == ("unresolved", None), result["error"]
    assert result["canaries"] == PLANTED


def test_the_canaries_run_but_their_names_never_show(shared_executor, task):
    """-v and -rA print every test's id: the run has the task's 5 and the 3 canaries, and the
    result names only the task's, and counts only them (pytest printed 5 failed, 3 passed)."""
    body = {**task.request("verbose", ""),
            "test_command": "python -m pytest -p no:cacheprovider -v -rA tests/test_calc.py"}
    result = shared_executor.submit(body).json()
    assert (result["status"], result["error_code"]) == ("unresolved", None), result["error"]
    assert result["canaries"] == PLANTED
    assert re.search(r"=+ 3 failed, 2 passed in ", result["log"]), result["log"][-2000:]
    _assert_no_canary_shown(result, task)
    assert "AssertionError: unexpected" not in result["log"]  # their failure sections too


def test_canaries_are_new_per_grading(shared_executor, task):
    """Two gradings of the same patch plant different names (read from the executor's side:
    the plan, made as the grader makes it)."""
    from sandbox_client.protocol import TaskSpec
    from task_executor.grading.grader import canary_plan

    spec = TaskSpec.model_validate(task.request("plan", ""))
    first, second = canary_plan(spec), canary_plan(spec)
    assert {c.name for c in first.canaries}.isdisjoint({c.name for c in second.canaries})
    assert sorted(c.fails for c in first.canaries) == [False, True, True]
    assert all(c.name.startswith("test_") for c in first.canaries)


def test_a_custom_pytest_command_gets_the_canary_ids(shared_executor, task):
    """A command naming test ids runs the canaries too: their ids are appended."""
    ids = " ".join(task.fail_to_pass + task.pass_to_pass)
    body = {**task.request("ids", _attack(task, PYTEST_ATTACKS["runtest-noop"])),
            "test_command": f"python -m pytest -p no:cacheprovider {ids}"}
    result = shared_executor.submit(body).json()
    _assert_tampered(result, task)
    gold = shared_executor.submit({**body, "task_id": "ids-gold", "patch": task.gold_patch}).json()
    assert (gold["status"], gold["canaries"]) == ("resolved", PLANTED), gold["error"]


@pytest.mark.parametrize(("command", "reason"), [
    ("python -m pytest -p no:cacheprovider tests/test_calc.py | cat", "shell syntax"),
    ("python -m pytest -p no:cacheprovider -x tests/test_calc.py", "stops early"),
    ("python -m pytest -p no:cacheprovider", "names no test"),
])
def test_commands_canaries_cannot_join_get_none_and_say_why(shared_executor, task, command,
                                                            reason):
    body = {**task.request("fallback", task.gold_patch), "test_command": command}
    result = shared_executor.submit(body).json()
    assert result["canaries"] == 0 and reason in result["canaries_skipped"]
    if "|" not in command:
        assert result["status"] == "resolved", (result["error"], result["log"][-2000:])


def test_tests_in_no_python_file_get_no_canaries():
    """The fallback when the FAIL_TO_PASS tests are not Python tests the executor can add to
    (another language, a file the test patch does not write): none, and why."""
    plan = canaries.plan(["spec/calc_spec.rb"], ["spec/calc_spec.rb:12"], [], "rspec", "pytest",
                         default_command=False)
    assert plan.canaries == [] and "no FAIL_TO_PASS test" in (plan.skipped or "")
    plan = canaries.plan(["tests/test_other.py"], ["tests/test_calc.py::test_add"], [],
                         "python -m pytest tests/test_calc.py", "pytest", default_command=True)
    assert plan.canaries == [] and plan.skipped


# --------------------------------------------------------------------- unittest and Django style

UNITTESTS = (
    "import unittest\n\nfrom calc import add, mul\n\n\n"
    "class CalcTests(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
    "    def test_add_many(self):\n        self.assertEqual(add(-1, 1), 0)\n\n"
    "    def test_mul(self):\n        self.assertEqual(mul(3, 4), 12)\n"
)
RUNTESTS = (
    "import os, sys, unittest\n"
    "sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.getcwd()]\n"
    "labels = [a for a in sys.argv[1:] if not a.startswith('-')]\n"
    "suite = unittest.defaultTestLoader.loadTestsFromNames(labels)\n"
    "result = unittest.TextTestRunner(verbosity=2).run(suite)\n"
    "sys.exit(bool(result.failures or result.errors))\n"
)
UNITTEST_ATTACKS = {
    "run-calls-add-success": (
        "import unittest\n"
        "def _run(self, result=None):\n"
        "    result.startTest(self)\n"
        "    result.addSuccess(self)\n"
        "    result.stopTest(self)\n"
        "    return result\n"
        "unittest.TestCase.run = _run\n"),
    "run-skips-only-f2p": (
        "import unittest\n"
        "_real = unittest.TestCase.run\n"
        "def _run(self, result=None):\n"
        f"    if self._testMethodName in {F2P_NAMES}:\n"
        "        result.startTest(self)\n"
        "        result.addSuccess(self)\n"
        "        result.stopTest(self)\n"
        "        return result\n"
        "    return _real(self, result)\n"
        "unittest.TestCase.run = _run\n"),
    "assert-equal-noop": (
        "import unittest\n"
        "unittest.TestCase.assertEqual = lambda self, first, second, msg=None: None\n"),
    "add-failure-is-success": (
        "import unittest\n"
        "unittest.TestResult.addFailure = unittest.TestResult.addSuccess\n"
        "unittest.TextTestResult.addFailure = lambda self, test, err: self.addSuccess(test)\n"),
}


@pytest.fixture(scope="module")
def unittest_task(tmp_path_factory: pytest.TempPathFactory) -> DemoTask:
    """The demo package with unittest tests, run by ``python -m unittest`` (module labels)."""
    task = make_demo_task(tmp_path_factory.mktemp("unittest") / "repo")
    test_patch = diff_of(Path(task.repo), {"tests/test_u.py": UNITTESTS})
    return DemoTask(repo=task.repo, base_commit=task.base_commit, gold_patch=task.gold_patch,
                    test_patch=test_patch,
                    fail_to_pass=["tests.test_u.CalcTests.test_add",
                                  "tests.test_u.CalcTests.test_add_many"],
                    pass_to_pass=["tests.test_u.CalcTests.test_mul"],
                    test_command="python -m unittest -v tests.test_u")


@pytest.fixture(scope="module")
def django_task(tmp_path_factory: pytest.TempPathFactory) -> DemoTask:
    """A Django-shaped task: tests/runtests.py taking labels relative to tests/, ids in
    Django's ``test_x (module.Class)`` form."""
    task = make_demo_task(tmp_path_factory.mktemp("django") / "repo")
    repo = Path(task.repo)
    write_files(repo, {"tests/runtests.py": RUNTESTS, "tests/calc_tests/__init__.py": ""})
    base = commit_all(repo, "a Django-style runner")
    test_patch = diff_of(repo, {"tests/calc_tests/tests.py": UNITTESTS})
    return DemoTask(repo=task.repo, base_commit=base, gold_patch=task.gold_patch,
                    test_patch=test_patch,
                    fail_to_pass=["test_add (calc_tests.tests.CalcTests)",
                                  "test_add_many (calc_tests.tests.CalcTests)"],
                    pass_to_pass=["test_mul (calc_tests.tests.CalcTests)"],
                    test_command="python tests/runtests.py --verbosity=2 calc_tests.tests")


def _unittest_body(task: DemoTask, task_id: str, patch: str, parser: str) -> dict:
    return {**task.request(task_id, patch), "log_parser": parser}


@pytest.mark.parametrize("style", ["unittest", "django"])
def test_unittest_and_django_runs_are_guarded(shared_executor, unittest_task, django_task,
                                              style):
    task = unittest_task if style == "unittest" else django_task
    gold = shared_executor.submit(_unittest_body(task, f"{style}-gold", task.gold_patch,
                                                 style)).json()
    assert (gold["status"], gold["canaries"]) == ("resolved", PLANTED), (
        gold["error"], gold["canaries_skipped"], gold["log"][-3000:])
    assert "Ran 3 tests" in gold["log"] and "\nOK" in gold["log"]  # the canaries uncounted
    _assert_no_unittest_canary_shown(gold, task)
    honest = shared_executor.submit(_unittest_body(task, f"{style}-empty", "", style)).json()
    assert (honest["status"], honest["error_code"]) == ("unresolved", None), honest["error"]
    for attack, code in UNITTEST_ATTACKS.items():
        result = shared_executor.submit(_unittest_body(
            task, f"{style}-{attack}", _attack(task, code), style)).json()
        assert (result["status"], result["error_code"]) == ("unresolved", "tampered"), (
            attack, result["status"], result["error"], result["log"][-3000:])
        _assert_no_unittest_canary_shown(result, task)


def _assert_no_unittest_canary_shown(result: dict, task: DemoTask) -> None:
    assert set(result["tests"]) == {*task.fail_to_pass, *task.pass_to_pass}, result["tests"]
    shown = set(re.findall(r"^(?:FAIL: |ERROR: )?(test_\w+) \(", result["log"], re.M))
    shown |= set(re.findall(r"CalcTests\.(test_\w+)", result["log"] + str(result["error"])))
    assert shown <= {"test_add", "test_add_many", "test_mul"}, shown


# --------------------------------------------------------------------- start-up hooks, sessions

# A .pth line runs at start-up, before the other site directories are on sys.path: it adds them.
PTH_HOOK = ("import sys, site; sys.path.extend(site.getsitepackages()); "
            "exec(\"import _pytest.python as p\\np.Function.runtest = lambda self: None\")\n")


FORK_AND_FORGE = (
    "import os, sys, time, glob, json\n"
    "if os.fork() == 0:\n"
    "    # The child outlives the test process and appends passes for every test it ran.\n"
    "    parent = os.getppid()\n"
    "    while os.getppid() == parent:\n"
    "        time.sleep(0.05)\n"
    "    for name in glob.glob('/tmp/report-*.jsonl'):\n"
    "        records = [json.loads(line) for line in open(name)]\n"
    "        with open(name, 'a') as out:\n"
    "            for record in records:\n"
    "                if record.get('kind') == 'test':\n"
    "                    out.write(json.dumps({**record, 'outcome': 'passed'}) + '\\n')\n"
    "    os._exit(0)\n"
)


def test_a_forked_child_that_forges_after_the_run_gains_nothing(shared_executor, task):
    """A child forked at import waits for the test process to end, then appends passes to the
    report: either the executor has read the report by then (the run's own outcomes stand) or
    it reads two outcomes for one phase (tampered). Never resolved."""
    result = shared_executor.submit(task.request("fork", _attack(task, FORK_AND_FORGE))).json()
    assert (result["status"], result["resolved"]) == ("unresolved", False), (
        result["error"], result["log"][-2000:])
    assert result["error_code"] in (None, "tampered"), result["error"]
    assert result["tests"]["tests/test_calc.py::test_add"] != "PASSED" or (
        result["error_code"] == "tampered")


def test_start_up_hooks_dropped_where_python_looks_do_not_forge(shared_executor, task):
    """A session drops the no-op where Python looks at start-up: a .pth and a sitecustomize
    in the interpreter's site-packages (a copy-on-write runtime directory: writable), and
    both in the tree. finish grades the session's patch in a fresh workspace: the tree's are
    test configuration (left out), the interpreter's are not part of a patch."""
    from tests.conftest import FAST_PYTEST_ENV

    body = {"repo": task.repo, "base_commit": task.base_commit, "env": FAST_PYTEST_ENV}
    started = shared_executor.post("/session/start", json=body)
    assert started.status_code == 200, started.text
    sid = started.json()["session_id"]
    hook = PTH_HOOK.replace('"', '\\"')
    dropped = shared_executor.post(f"/session/{sid}/exec", json={"command": (
        "site=$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])') && "
        f'printf "%s" "{hook}" > "$site/zz_tamper.pth" && '
        f'printf "%s" "{hook}" > "$site/sitecustomize.py" && '
        f'printf "%s" "{hook}" > zz_tamper.pth && printf "%s" "{hook}" > sitecustomize.py && '
        "printf 'def test_fails():\\n    assert 0\\n' > /tmp/test_fails.py && "
        "cd / && python -m pytest -q -p no:cacheprovider /tmp/test_fails.py | tail -1")}).json()
    assert dropped["exit_code"] == 0, dropped["output"]
    assert "1 passed" in dropped["output"], dropped["output"]  # in the session, it forges
    finished = shared_executor.post(f"/session/{sid}/finish", json={
        "test_patch": task.test_patch, "fail_to_pass": task.fail_to_pass,
        "pass_to_pass": task.pass_to_pass}).json()
    result = finished["result"]
    assert result["status"] == "unresolved", (result["error"], result["log"][-2000:])
    assert {"sitecustomize.py", "zz_tamper.pth"} <= set(result["excluded_files"])
    assert result["canaries"] == PLANTED
    assert result["error_code"] is None  # nothing forged reached the grading: plainly unresolved
    assert result["tests"]["tests/test_calc.py::test_add"] == "FAILED"
