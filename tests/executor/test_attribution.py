"""A run without a consistent verdict is attributed by the control (the tests without the patch).

Each dodge is a real agent patch on a real repository, graded by a real executor: the patch turns
its own failing run into a crash, no report or a contradicting exit status, and must still get
``unresolved``, never ``execution_error`` (no verdict, which reward code drops instead of scoring
0). A broken task is ``execution_error`` with a code a preflight can act on, for the gold patch
too; and a legitimate passing run never pays for a control or loses its ``resolved``.
"""

from __future__ import annotations

import threading
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
from task_executor.grading.consistency import RunEvidence
from task_executor.grading.control import ControlCache
from task_executor.grading.results import ReportedTests
from tests.conftest import RunningExecutor, module_executor

SOURCE = BASE_FILES["calc/__init__.py"]
REQUIRED = ["tests/test_calc.py::test_add", "tests/test_calc.py::test_mul"]


@pytest.fixture(scope="module")
def shared_executor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningExecutor]:
    """One executor for every case of this module (they only submit gradings)."""
    with module_executor(tmp_path_factory, "attribution") as running:
        yield running


@pytest.fixture(scope="module")
def conftest_task(tmp_path_factory: pytest.TempPathFactory) -> DemoTask:
    """The demo task whose base has a conftest.py importing the package under test, as many
    real repositories do: a patch that breaks the package breaks pytest before it collects."""
    task = make_demo_task(tmp_path_factory.mktemp("conftest-task") / "repo")
    repo = Path(task.repo)
    write_files(repo, {"conftest.py": "import calc  # noqa: F401\n"})
    base = commit_all(repo, "conftest imports the package")
    return DemoTask(repo=task.repo, base_commit=base, gold_patch=diff_of(repo, {
        "calc/__init__.py": SOURCE.replace("return a - b", "return a + b")}),
        test_patch=task.test_patch, fail_to_pass=task.fail_to_pass,
        pass_to_pass=task.pass_to_pass)


_ON_EXIT = "import atexit, glob, os\n"
DODGES = {
    "import-time-raise": ("raise ImportError('the patch broke the package')\n" + SOURCE,
                          {"no_tests_reported"}),
    "atexit-exit-0": (_ON_EXIT + "atexit.register(lambda: os._exit(0))\n" + SOURCE,
                      {"exit_status_mismatch"}),
    "exit-1-mid-run": (SOURCE.replace("return a - b", "import os\n    os._exit(1)"),
                       {"tests_crashed"}),
    "sys-exit-0-at-import": ("import sys\nsys.exit(0)\n" + SOURCE, {"no_tests_reported"}),
    # The test process's parent is the sandbox's init (its own PID namespace), which a SIGKILL
    # from inside does not reach: the run goes on and gives its own verdict (or crashes, where
    # the parent is a shell).
    "kill-parent": (SOURCE.replace("return a - b", "import os\n    os.kill(os.getppid(), 9)\n"
                                   "    return a - b"), {None, "tests_crashed"}),
    "delete-report": (_ON_EXIT + "atexit.register(lambda: [os.unlink(f) for f in "
                      "glob.glob('/tmp/report-*.jsonl')])\n" + SOURCE, {"no_tests_reported"}),
    "truncate-report": (_ON_EXIT + "atexit.register(lambda: [open(f, 'w').close() for f in "
                        "glob.glob('/tmp/report-*.jsonl')])\n" + SOURCE, {"no_tests_reported"}),
}


@pytest.mark.parametrize("dodge", list(DODGES))
def test_a_patch_cannot_turn_its_failure_into_no_verdict(shared_executor, conftest_task, dodge):
    module, codes = DODGES[dodge]
    patch = diff_of(Path(conftest_task.repo), {"calc/__init__.py": module})
    result = shared_executor.submit(conftest_task.request(f"dodge-{dodge}", patch)).json()
    assert (result["status"], result["resolved"]) == ("unresolved", False), (
        result["status"], result["error"], result["log"][-2000:])
    assert result["error_code"] in codes, result["error"]
    if result["error_code"] is not None:  # the control decided, once for all these cases
        assert result["control_run"] is not None
    assert shared_executor.get("/health").status_code == 200  # and nothing killed the executor
    required = [*conftest_task.fail_to_pass, *conftest_task.pass_to_pass]
    assert set(required) <= set(result["tests"])
    assert "PASSED" not in {result["tests"][name] for name in conftest_task.fail_to_pass}
    if result["error_code"] == "no_tests_reported":
        assert {result["tests"][name] for name in required} == {"MISSING"}


def test_the_gold_patch_of_the_same_task_resolves_without_a_control(shared_executor,
                                                                     conftest_task):
    result = shared_executor.submit(conftest_task.request("gold", conftest_task.gold_patch)).json()
    assert result["status"] == "resolved", result["log"][-2000:]
    assert (result["control_run"], result["phases"]["control"]) == (None, 0.0)


BROKEN = {
    "command-not-found": ({"test_command": "no-such-runner tests/test_calc.py"},
                          "test_command_not_found"),
    "runner-missing": ({"test_command": "python -S -m pytest -p no:cacheprovider "
                                        "tests/test_calc.py"}, "test_runner_missing"),
    "ids-never-reported": ({"fail_to_pass": ["tests/test_calc.py::test_add",
                                             "tests/test_calc.py::test_subtract"]},
                           "test_ids_not_found"),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_task_is_no_verdict_even_for_the_gold_patch(shared_executor, conftest_task,
                                                             broken):
    change, code = BROKEN[broken]
    body = {**conftest_task.request(f"broken-{broken}", conftest_task.gold_patch), **change}
    result = shared_executor.submit(body).json()
    assert (result["status"], result["resolved"]) == ("execution_error", None), result["error"]
    assert result["error_code"] == code, result["error"]
    assert "without the agent's patch" in result["error"]


LEGIT_TESTS = (
    "import pytest\n\nfrom calc import add\n\n\n"
    '@pytest.mark.parametrize("word", ["two words", "\u00fcn\u00efc\u00f6d\u00e9", "a::b"])\n'
    "def test_word(word):\n"
    "    print('=== 3 failed, 1 error in 0.10s ===')  # a test may print anything\n"
    "    print('tests/test_calc.py::test_add FAILED')\n"
    "    assert add(len(word), 0) == len(word)\n"
)
LEGIT_IDS = ["tests/test_words.py::test_word[two words]",
             "tests/test_words.py::test_word[\\xfcn\\xefc\\xf6d\\xe9]",
             "tests/test_words.py::test_word[a::b]"]
COMMAND = "python -m pytest -p no:cacheprovider {} tests/test_calc.py tests/test_words.py"


@pytest.mark.parametrize("options", ["-s -rA", "-q -s", "-v -p no:xdist", "-qq"])
def test_a_legitimate_passing_run_keeps_its_verdict(shared_executor, conftest_task, options):
    repo = Path(conftest_task.repo)
    test_patch = conftest_task.test_patch + diff_of(repo, {"tests/test_words.py": LEGIT_TESTS})
    body = {**conftest_task.request(f"legit{options}", conftest_task.gold_patch),
            "test_patch": test_patch, "test_command": COMMAND.format(options),
            "pass_to_pass": [*conftest_task.pass_to_pass, *LEGIT_IDS]}
    result = shared_executor.submit(body).json()
    assert result["status"] == "resolved", (result["error"], result["tests"], result["log"])
    if options != "-qq":  # pytest -qq prints no summary: one control shows that is the task's way
        assert result["control_run"] is None


def test_concurrent_gradings_run_one_control(shared_executor, tmp_path):
    task = make_demo_task(tmp_path / "repo")
    crash = SOURCE.replace("return a - b", "import os\n    os._exit(1)")
    patches = [diff_of(Path(task.repo), {"calc/__init__.py": f"# rollout {n}\n" + crash})
               for n in range(3)]
    results: list[dict] = []

    def grade(patch: str) -> None:
        results.append(shared_executor.submit(task.request("crash", patch)).json())

    threads = [threading.Thread(target=grade, args=(patch,)) for patch in patches[:2]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    grade(patches[2])
    assert [r["status"] for r in results] == ["unresolved"] * 3, [r["error"] for r in results]
    assert sorted(r["control_run"] for r in results) == [False, False, True]


def _consistent_run() -> RunEvidence:
    return RunEvidence.of(ReportedTests(states={"t": "PASSED"}), 0, False, "pytest",
                          "1 passed in 1s")


def test_the_control_cache_runs_a_key_once_while_others_wait():
    cache = ControlCache()
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow_control() -> RunEvidence:
        calls.append("ran")
        started.set()
        release.wait()
        return _consistent_run()

    answers: list[tuple[RunEvidence, bool]] = []
    first = threading.Thread(target=lambda: answers.append(cache.get("k", slow_control)))
    first.start()
    started.wait()
    second = threading.Thread(target=lambda: answers.append(cache.get("k", slow_control)))
    second.start()
    release.set()
    first.join()
    second.join()
    assert calls == ["ran"] and cache.computed == 1
    assert sorted(ran for _, ran in answers) == [False, True]
    assert answers[0][0] is answers[1][0]


def test_a_control_that_failed_is_not_kept():
    cache = ControlCache()

    def broken() -> RunEvidence:
        raise OSError("no space left on device")

    with pytest.raises(OSError):
        cache.get("k", broken)
    run, ran = cache.get("k", _consistent_run)
    assert ran is True and cache.computed == 2


UNITTESTS = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class T(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
    "    def test_zero(self):\n        print('FAILED (failures=9)')\n"
    "        self.assertEqual(add(0, 0), 0)\n"
)


@pytest.mark.parametrize(("patch_kind", "verdict"), [
    ("gold", ("resolved", None, None)),
    ("atexit-exit-0", ("unresolved", "exit_status_mismatch", True)),
])
def test_unittest_runs_are_cross_checked_too(shared_executor, conftest_task, patch_kind,
                                              verdict):
    repo = Path(conftest_task.repo)
    patch = conftest_task.gold_patch if patch_kind == "gold" else diff_of(
        repo, {"calc/__init__.py": DODGES[patch_kind][0]})
    body = {**conftest_task.request(f"unittest-{patch_kind}", patch),
            "test_patch": diff_of(repo, {"tests/test_u.py": UNITTESTS}),
            "test_command": "python -m unittest -v tests.test_u", "log_parser": "unittest",
            "fail_to_pass": ["tests.test_u.T.test_add"],
            "pass_to_pass": ["tests.test_u.T.test_zero"]}
    result = shared_executor.submit(body).json()
    control_ran = None if result["control_run"] is None else True
    assert (result["status"], result["error_code"], control_ran) == verdict, result["log"]
