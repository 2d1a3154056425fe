"""finish grading a submitted patch, or the tree's diff without named paths (issue 25)."""

from __future__ import annotations

from task_executor.demo import DemoTask
from tests.conftest import RunningExecutor
from tests.executor import session_fixtures
from tests.executor.test_sessions_api import _exec, _start

# The shared fixtures, made visible to pytest in this module.
shared_executor = session_fixtures.shared_executor
task = session_fixtures.task


def _finish(executor: RunningExecutor, sid: str, task: DemoTask, **extra: object) -> dict:
    answer = executor.post(f"/session/{sid}/finish", json={
        "test_patch": task.test_patch, "fail_to_pass": task.fail_to_pass,
        "pass_to_pass": task.pass_to_pass, **extra})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_submitted_patch_is_graded_not_the_tree(shared_executor, task):
    sid = _start(shared_executor, task)
    # The tree holds a wrong change; the submission is the fix: the submission is graded.
    _exec(shared_executor, sid, "echo broken > calc/__init__.py")
    finished = _finish(shared_executor, sid, task, patch=task.gold_patch)
    assert finished["result"]["status"] == "resolved"
    assert finished["patch"] == task.gold_patch


def test_a_submitted_patch_that_does_not_apply_is_a_verdict(shared_executor, task):
    sid = _start(shared_executor, task)
    _exec(shared_executor, sid, "sed -i 's/return a - b/return a + b/' calc/__init__.py")
    bad = task.gold_patch.replace("return a - b", "return a * b * c")
    finished = _finish(shared_executor, sid, task, patch=bad)
    assert finished["result"]["status"] == "patch_apply_failed"
    assert finished["result"]["resolved"] is False
    assert shared_executor.get(f"/session/{sid}").status_code == 404  # closed either way


def test_exclude_paths_leave_files_out_of_the_diff(shared_executor, task):
    sid = _start(shared_executor, task)
    _exec(shared_executor, sid, "sed -i 's/return a - b/return a + b/' calc/__init__.py && "
          "git diff > patch.txt && mkdir -p build/x && echo o > build/x/out.o && "
          "echo note > notes.md")
    finished = _finish(shared_executor, sid, task, exclude_paths=["patch.txt", "build", "*.md"])
    assert finished["result"]["status"] == "resolved"
    assert "calc/__init__.py" in finished["patch"]
    for left_out in ("patch.txt", "build/x/out.o", "notes.md"):
        assert left_out not in finished["patch"]
        assert left_out in finished["result"]["excluded_files"]


def test_without_exclude_paths_the_file_is_in_the_diff(shared_executor, task):
    sid = _start(shared_executor, task)
    _exec(shared_executor, sid, "echo note > patch.txt")
    finished = _finish(shared_executor, sid, task)
    assert "patch.txt" in finished["patch"]


def test_bad_finish_fields_are_refused(shared_executor, task):
    sid = _start(shared_executor, task)
    for extra in ({"exclude_paths": "patch.txt"}, {"patch": 3}):
        answer = shared_executor.post(f"/session/{sid}/finish", json={
            "test_patch": task.test_patch, "fail_to_pass": task.fail_to_pass, **extra})
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["code"] == "validation_error"
    assert shared_executor.get(f"/session/{sid}").status_code == 200  # kept for a good finish
    shared_executor.delete(f"/session/{sid}")
