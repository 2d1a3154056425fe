"""Patch splitting and the test-configuration rules, on plain strings; and the lookup of which
test paths exist at the base commit (one small repository)."""

from __future__ import annotations

from types import SimpleNamespace

from task_executor.demo import init_repo
from task_executor.grading.diffs import split_patch, touched_paths
from task_executor.grading.patching import _existing_at_base
from task_executor.grading.results import ReportedTests, exit_status_conflict
from task_executor.grading.testconfig import is_test_config_file, restore_test_sections

TWO_FILES = (
    "diff --git a/a.py b/a.py\r\n--- a/a.py\r\n+++ b/a.py\r\n@@ -1 +1 @@\r\n-x\r\n+y\r\n"
    "diff --git a/old.py b/new.py\nsimilarity index 90%\nrename from old.py\nrename to new.py\n"
    "diff --git a/gone.py b/gone.py\ndeleted file mode 100644\n--- a/gone.py\n+++ /dev/null\n"
    "@@ -1 +0,0 @@\n--- not a header, a removed line starting with two dashes\n"
)


def test_split_patch_round_trips_bytes_and_finds_paths():
    preamble, sections = split_patch(TWO_FILES)
    assert preamble + "".join(s.text for s in sections) == TWO_FILES
    assert [(s.old_path, s.new_path) for s in sections] == [
        ("a.py", "a.py"), ("old.py", "new.py"), ("gone.py", None)]
    assert sections[0].text.count("\r\n") == 6
    assert touched_paths(TWO_FILES) == {"a.py", "old.py", "new.py", "gone.py"}


def test_plain_diff_without_git_headers_and_quoted_names():
    plain = "--- a/x.py\t2024-01-01\n+++ b/x.py\t2024-01-02\n@@ -1 +1 @@\n-a\n+b\n"
    assert touched_paths(plain) == {"x.py"}
    quoted = 'diff --git "a/t\\303\\251st.py" "b/t\\303\\251st.py"\nnew file mode 100644\n'
    assert touched_paths(quoted) == {"tést.py"}


def test_test_configuration_files():
    for path in ["conftest.py", "a/b/conftest.py", "pytest.ini", "tox.ini", ".coveragerc",
                 "sitecustomize.py", "lib/x.pth"]:
        assert is_test_config_file(path), path
    for path in ["conftest_utils.py", "setup.cfg", "pyproject.toml", "tests/test_x.py"]:
        assert not is_test_config_file(path), path


def test_restore_keeps_other_sections_and_puts_test_sections_back():
    base = "[metadata]\nname = a\n\n[tool:pytest]\naddopts = -q\n"
    patched = "[metadata]\nname = b\n\n[tool:pytest]\naddopts = -p evil\n\n[coverage:run]\nx=1\n"
    restored, changed = restore_test_sections("setup.cfg", base, patched)
    assert changed
    assert "name = b" in restored
    assert "addopts = -q" in restored and "evil" not in restored
    assert "coverage" not in restored
    unchanged, changed = restore_test_sections("setup.cfg", base, base.replace("= a", "= c"))
    assert not changed and unchanged.endswith("addopts = -q\n")


def test_pyproject_dotted_keys_fall_back_to_the_base_file():
    base = '[project]\nname = "a"\n'
    sneaky = '[project]\nname = "b"\n\n[tool]\npytest.ini_options.addopts = "-p evil"\n'
    restored, changed = restore_test_sections("pyproject.toml", base, sneaky)
    assert changed
    assert restored == base
    tables = '[project]\nname = "b"\n\n[tool.pytest.ini_options]\naddopts = "-p evil"\n'
    restored, changed = restore_test_sections("pyproject.toml", base, tables)
    assert changed and restored == '[project]\nname = "b"\n\n'


def test_exit_status_cross_check():
    passed = ReportedTests(states={"t::a": "PASSED"})
    failed = ReportedTests(states={"t::a": "FAILED"})
    assert exit_status_conflict(passed, 0) is None
    assert exit_status_conflict(failed, 1) is None
    assert "exited 0" in exit_status_conflict(failed, 0)
    assert "no reported test failed" in exit_status_conflict(passed, 1)
    assert "reported no tests" in exit_status_conflict(ReportedTests(), 5)


def test_which_test_paths_exist_at_base_is_one_literal_lookup(tmp_path):
    """The test patch's paths that exist at the base commit (their parents planted in the tree
    come back with them): glob characters and quotes are names, a directory counts, a path
    outside the tree is no path."""
    repo = tmp_path / "repo"
    base = init_repo(repo, {"a/b/c.py": "x\n", "t[1].py": "y\n", 'odd "name".py': "z\n"})
    workspace = SimpleNamespace(mirror=repo / ".git", base_commit=base)
    asked = ["a", "a/b/c.py", "t[1].py", "t?1?.py", 'odd "name".py', "missing.py", "a/new.py"]
    assert _existing_at_base(workspace, asked) == ["a", "a/b/c.py", "t[1].py", 'odd "name".py']
    # git refuses the whole lookup for a path outside the tree: each path on its own then.
    assert _existing_at_base(workspace, ["../outside", "t[1].py"]) == ["t[1].py"]
