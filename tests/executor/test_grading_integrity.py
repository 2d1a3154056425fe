"""Reward integrity: each grading rule of DESIGN.md against a patch that tries to cheat it.

Every test grades through a real executor (waitress on loopback) with real git and real pytest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from task_executor.demo import FIXED_FILES, commit_all, diff_of, init_repo, write_files

CHEAT_CONFTEST = """
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""

CHEAT_PLUGIN = CHEAT_CONFTEST  # the same hook, as a plugin module a config file loads with -p
PYTEST_TOML = '[pytest]\naddopts = ["-p", "cheat_plugin"]\n'


def _cheat_patch(demo_task, files: dict[str, str]) -> str:
    return diff_of(Path(demo_task.repo), files)


def test_gold_patch_resolves(executor, demo_task):
    result = executor.submit(demo_task.request("gold", demo_task.gold_patch)).json()
    assert result["status"] == "resolved"
    assert result["resolved"] is True
    assert result["patch_applied"] is True
    assert set(result["fail_to_pass"]["passed"]) == set(demo_task.fail_to_pass)
    assert result["tests"]["tests/test_calc.py::test_add_many[1-2-3]"] == "PASSED"
    assert result["phases"]["tests"] > 0
    assert "test session starts" in result["log"]
    assert (result["control_run"], result["phases"]["control"]) == (None, 0.0)  # consistent


def test_empty_patch_is_unresolved(executor, demo_task):
    result = executor.submit(demo_task.request("empty", "")).json()
    assert result["status"] == "unresolved"
    assert result["resolved"] is False
    assert result["tests"]["tests/test_calc.py::test_add"] == "FAILED"
    assert result["pass_to_pass"]["failed"] == []
    assert result["control_run"] is None and result["error_code"] is None


def test_conftest_cheat_works_when_it_is_part_of_the_base(executor, tmp_path, demo_task):
    """Control: the planted hook really forges passes (the canaries planted to fail come out
    passed: tampered), so excluding it is what stops it (plain unresolved below)."""
    repo = Path(demo_task.repo)
    write_files(repo, {"conftest.py": CHEAT_CONFTEST})
    base = commit_all(repo, "base with a forging conftest")
    result = executor.submit({**demo_task.request("control", ""), "base_commit": base}).json()
    assert (result["status"], result["error_code"]) == ("unresolved", "tampered"), result
    assert result["tests"]["tests/test_calc.py::test_add"] == "PASSED"  # forged


@pytest.mark.parametrize(
    "planted",
    [
        {"conftest.py": CHEAT_CONFTEST},
        {"tests/conftest.py": CHEAT_CONFTEST},
        {"cheat_plugin.py": CHEAT_PLUGIN, "pytest.ini": "[pytest]\naddopts = -p cheat_plugin\n"},
        {"cheat_plugin.py": CHEAT_PLUGIN, "tox.ini": "[pytest]\naddopts = -p cheat_plugin\n"},
        {
            "cheat_plugin.py": CHEAT_PLUGIN,
            "setup.cfg": "[tool:pytest]\naddopts = -p cheat_plugin\n",
        },
        {
            "cheat_plugin.py": CHEAT_PLUGIN,
            "pyproject.toml": '[tool.pytest.ini_options]\naddopts = "-p cheat_plugin"\n',
        },
        {"cheat_plugin.py": CHEAT_PLUGIN, "sitecustomize.py": "import cheat_plugin\n"},
        # pytest 9's own files (the image's pytest may be older: excluded all the same).
        {"cheat_plugin.py": CHEAT_PLUGIN, "pytest.toml": PYTEST_TOML},
        {"cheat_plugin.py": CHEAT_PLUGIN, ".pytest.toml": PYTEST_TOML},
    ],
    ids=["conftest", "nested-conftest", "pytest.ini", "tox.ini", "setup.cfg", "pyproject", "site",
         "pytest.toml", ".pytest.toml"],
)
def test_planted_test_configuration_is_excluded(executor, demo_task, planted):
    patch = _cheat_patch(demo_task, planted)
    result = executor.submit(demo_task.request("cheat", patch)).json()
    assert result["status"] == "unresolved", result["log"]
    assert result["error_code"] is None  # left out: the tests ran honestly
    config_files = {name for name in planted if name != "cheat_plugin.py"}
    assert config_files <= set(result["excluded_files"])


def test_gitattributes_cannot_corrupt_the_held_out_tests(executor, demo_task):
    # A working-tree encoding the interpreter cannot read, applied by git as it writes the
    # held-out tests, hands the runner files it cannot parse: every test MISSING. The agent's
    # .gitattributes is test configuration, left out like conftest.py; the tests stay canonical.
    # By hand: git itself would re-encode the patch's other files while making it.
    patch = ("diff --git a/.gitattributes b/.gitattributes\nnew file mode 100644\n"
             "--- /dev/null\n+++ b/.gitattributes\n@@ -0,0 +1 @@\n"
             "+*.py working-tree-encoding=UTF-16LE\n")
    result = executor.submit(demo_task.request("attrs", patch)).json()
    assert result["status"] == "unresolved", result["log"]
    assert ".gitattributes" in result["excluded_files"]
    assert result["tests"]["tests/test_calc.py::test_mul"] == "PASSED"


def test_setup_cfg_keeps_agent_edits_outside_test_sections(executor, demo_task):
    repo = Path(demo_task.repo)
    write_files(
        repo, {"setup.cfg": "[metadata]\nname = calc\n\n[tool:pytest]\nxfail_strict = true\n"}
    )
    base = commit_all(repo, "setup.cfg")
    patch = diff_of(
        repo,
        {
            **FIXED_FILES,
            "setup.cfg": "[metadata]\nname = calc2\n\n[tool:pytest]\naddopts = -p cheat_plugin\n",
            "cheat_plugin.py": CHEAT_PLUGIN,
        },
    )
    body = {
        **demo_task.request("cfg", patch),
        "base_commit": base,
        "test_command": "cat setup.cfg && python -m pytest -p no:cacheprovider tests/test_calc.py",
    }
    result = executor.submit(body).json()
    assert result["status"] == "resolved"
    assert result["excluded_files"] == ["setup.cfg"]
    assert "name = calc2" in result["log"]  # the agent's metadata edit stayed
    assert "xfail_strict = true" in result["log"]  # the test section is the base's
    assert "cheat_plugin" not in result["log"].split("$ ", 2)[1].split("===")[0]


def test_agent_edit_of_held_out_test_file_is_overridden(executor, demo_task):
    weakened = "def test_add():\n    pass\n\n\ndef test_add_many():\n    pass\n"
    patch = _cheat_patch(demo_task, {"tests/test_calc.py": weakened})
    result = executor.submit(demo_task.request("edit-tests", patch)).json()
    assert result["patch_applied"] is True
    assert result["status"] == "unresolved"
    assert result["tests"]["tests/test_calc.py::test_add"] == "FAILED"


def test_agent_deletion_of_held_out_test_file_is_overridden(executor, demo_task):
    repo = Path(demo_task.repo)
    (repo / "tests/test_calc.py").unlink()
    patch = diff_of(repo, {})
    assert "deleted file mode" in patch
    result = executor.submit(demo_task.request("delete-tests", patch + demo_task.gold_patch)).json()
    assert result["status"] == "resolved"


def test_test_patch_wins_over_a_file_the_agent_added(executor, tmp_path):
    repo = tmp_path / "repo"
    base = init_repo(repo, {"calc.py": "def add(a, b):\n    return a - b\n"})
    fix = diff_of(repo, {"calc.py": "def add(a, b):\n    return a + b\n"})
    test_patch = diff_of(
        repo,
        {"test_new.py": "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
    )
    fake = diff_of(repo, {"test_new.py": "def test_add():\n    pass\n"})
    body = {
        "task_id": "new-file",
        "repo": str(repo),
        "base_commit": base,
        "test_patch": test_patch,
        "fail_to_pass": ["test_new.py::test_add"],
    }
    assert executor.submit({**body, "patch": fake}).json()["status"] == "unresolved"
    assert executor.submit({**body, "patch": fake + fix}).json()["status"] == "resolved"


def test_printed_pass_lines_are_not_counted(executor, demo_task):
    forger = (
        "import sys\n"
        "for name in ('test_add', 'test_add_many[1-2-3]', 'test_add_many[-1-1-0]'):\n"
        "    print(f'tests/test_calc.py::{name} PASSED')\n"
        "    sys.stderr.write(f'PASSED tests/test_calc.py::{name}\\n')\n"
    )
    source = Path(demo_task.repo, "calc/__init__.py").read_text()
    patch = _cheat_patch(demo_task, {"calc/__init__.py": forger + source})
    # -s and -rA: the forged lines reach the log exactly where a log-grepping grader would look.
    body = {
        **demo_task.request("forger", patch),
        "test_command": "python -m pytest -p no:cacheprovider -s -rA tests/test_calc.py",
    }
    result = executor.submit(body).json()
    assert "tests/test_calc.py::test_add PASSED" in result["log"]
    assert "PASSED tests/test_calc.py::test_add\n" in result["log"]
    assert result["status"] == "unresolved"


def test_imperative_xfail_in_code_under_test_is_not_a_pass(executor, demo_task):
    source = Path(demo_task.repo, "calc/__init__.py").read_text()
    sneaky = source.replace("    return a - b", "    import pytest\n    pytest.xfail('later')")
    patch = _cheat_patch(demo_task, {"calc/__init__.py": sneaky})
    result = executor.submit(demo_task.request("xfail", patch)).json()
    assert result["status"] == "unresolved"
    assert result["tests"]["tests/test_calc.py::test_add"] == "SKIPPED"


def test_exit_status_that_contradicts_the_results_is_not_a_pass(executor, demo_task):
    """Code that forces the process to fail after passing tests gets no 1.0: the run gives no
    consistent verdict, the control (no agent patch) does, so the patch is to blame."""
    source = Path(demo_task.repo, "calc/__init__.py").read_text()
    odd = "import atexit, os\natexit.register(lambda: os._exit(3))\n" + source
    patch = _cheat_patch(
        demo_task, {**FIXED_FILES, "calc/__init__.py": odd.replace("return a - b", "return a + b")}
    )
    result = executor.submit(demo_task.request("exit", patch)).json()
    assert result["status"] == "unresolved"
    assert result["resolved"] is False
    assert result["error_code"] == "exit_status_mismatch"
    assert result["control_run"] is True


def test_masked_exit_status_with_failures_is_no_verdict(executor, demo_task):
    body = {
        **demo_task.request("masked", ""),
        "test_command": "python -m pytest -p no:cacheprovider tests/test_calc.py || true",
    }
    result = executor.submit(body).json()
    assert result["status"] == "execution_error"
    assert "exited 0" in result["error"]


def test_patch_that_does_not_apply(executor, demo_task):
    bad = demo_task.gold_patch.replace("-    return a - b", "-    return a * b * c")
    result = executor.submit(demo_task.request("bad", bad)).json()
    assert result["status"] == "patch_apply_failed"
    assert result["resolved"] is False
    assert result["patch_applied"] is False


def test_garbage_patch_is_patch_apply_failed(executor, demo_task):
    result = executor.submit(demo_task.request("garbage", "this is not a diff\n")).json()
    assert result["status"] == "patch_apply_failed"


def test_crlf_patch_applies(executor, tmp_path):
    repo = tmp_path / "repo"
    base = init_repo(repo, {"calc.py": b"def add(a, b):\r\n    return a - b\r\n"})
    fix = diff_of(repo, {"calc.py": b"def add(a, b):\r\n    return a + b\r\n"})
    assert "\r\n" in fix
    tests = diff_of(
        repo,
        {"test_calc.py": "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
    )
    result = executor.submit(
        {
            "task_id": "crlf",
            "repo": str(repo),
            "base_commit": base,
            "patch": fix,
            "test_patch": tests,
            "fail_to_pass": ["test_calc.py::test_add"],
        }
    ).json()
    assert result["status"] == "resolved", result["error"]
