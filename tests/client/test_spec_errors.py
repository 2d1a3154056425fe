"""A spec the client refuses is the caller's bug (issue #25): ``SpecError`` at once from
``run_task``, nothing sent; in per-item results (``run_task_safe``, ``run_tasks_safe``) it is
flagged ``invalid_spec``, which the reward mapping calls ``caller_bug``, never
``infrastructure``, and still never scores 0."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest
import responses

from sandbox_client import SandboxClient, SpecError, TaskExecutorError, TaskSpec
from sandbox_client.reward import (
    execution_error,
    no_verdict_cause,
    reward_from_result,
    run_task_safe,
    run_tasks_safe,
)
from task_executor.demo import DemoTask
from tests.conftest import RunningExecutor

from .conftest import FAST_ENV, answered, body_of, closed_port, task_result, task_spec

Make = Callable[..., SandboxClient]
URL = "http://exec-a:9090"

BAD_SPECS: dict[str, dict[str, Any]] = {
    "unknown field": task_spec(tpyo=1),
    "no repo": {"task_id": "t", "base_commit": "abc"},
    "test list not a list": task_spec(FAIL_TO_PASS="[not json"),
}


@pytest.mark.parametrize("name", list(BAD_SPECS))
def test_run_task_raises_spec_error_at_once_and_sends_nothing(
    mocked: responses.RequestsMock, make_client: Make, name: str
) -> None:
    client = make_client(URL, learn_capacity=True)  # not even its /health is asked
    with pytest.raises(SpecError) as info:
        client.run_task(BAD_SPECS[name])
    assert isinstance(info.value, ValueError) and not isinstance(info.value, TaskExecutorError)
    assert info.value.code == "invalid_spec" and info.value.model == "TaskSpec"
    assert len(mocked.calls) == 0


def test_two_different_ids_grade_under_task_id(
    mocked: responses.RequestsMock, make_client: Make
) -> None:
    """A SWE-bench record passed as it is, with Dockyard's ``task_id`` beside its
    ``instance_id``: graded under ``task_id``, as ``dockyard grade`` keeps it; never refused."""
    submit = mocked.post(f"{URL}/task/submit", json=task_result("dockyard-7"))
    spec = task_spec("dockyard-7", instance_id="django__django-11099")
    assert make_client(URL).run_task(spec).task_id == "dockyard-7"
    sent = body_of(submit.calls[0])
    assert sent["task_id"] == "dockyard-7" and "instance_id" not in sent


def test_equal_ids_are_one_id(mocked: responses.RequestsMock, make_client: Make) -> None:
    submit = mocked.post(f"{URL}/task/submit", json=task_result("same"))
    result = make_client(URL).run_task(task_spec("same", instance_id="same"))
    assert result.task_id == "same"
    sent = body_of(submit.calls[0])
    assert sent["task_id"] == "same" and "instance_id" not in sent
    assert TaskSpec.model_validate({**task_spec(), "instance_id": "x", "task_id": None}).task_id \
        == "x"


def test_spec_errors_survive_pickling() -> None:
    with pytest.raises(SpecError) as info:
        SandboxClient(URL, learn_capacity=False).run_task(BAD_SPECS["unknown field"])
    copy = pickle.loads(pickle.dumps(info.value))
    assert (type(copy), copy.field, copy.model, copy.code, str(copy)) == (
        SpecError, "tpyo", "TaskSpec", "invalid_spec", str(info.value))


def test_safe_run_flags_a_bad_spec_as_the_callers_bug(make_client: Make) -> None:
    result = run_task_safe(task_spec("dockyard-7", tpyo=1), client=make_client(URL))
    assert (result.task_id, result.status, result.resolved, result.error_code) == (
        "dockyard-7", "execution_error", None, "invalid_spec")
    assert no_verdict_cause(result) == "caller_bug"
    assert reward_from_result(result) is None  # never 0 without a verdict


def test_no_verdict_causes_are_told_apart() -> None:
    assert no_verdict_cause(execution_error("t", "x", code="invalid_spec")) == "caller_bug"
    assert no_verdict_cause(execution_error("t", "x", code="test_patch_failed")) == "task_broken"
    assert no_verdict_cause(execution_error("t", "x", code="executor_unreachable")) \
        == "infrastructure"
    assert no_verdict_cause(execution_error("t", "x")) == "infrastructure"


def test_a_batch_with_bad_specs_against_a_dead_fleet_says_whose_fault_each_is(
    make_client: Make,
) -> None:
    """Issue #25: a batch whose bad specs looked exactly like a dead fleet."""
    client = make_client(closed_port())
    results = run_tasks_safe([BAD_SPECS["unknown field"], task_spec("ok"), BAD_SPECS["no repo"]],
                             client=client)
    assert [no_verdict_cause(r) for r in results] == ["caller_bug", "infrastructure",
                                                       "caller_bug"]
    assert [r.error_code for r in results] == ["invalid_spec", "executor_unreachable",
                                               "invalid_spec"]
    assert all(reward_from_result(r) is None for r in results)


def test_a_batch_grades_its_good_specs_and_flags_its_bad_ones(
    executor: RunningExecutor, demo_task: DemoTask
) -> None:
    def good(task_id: str, patch: str) -> dict[str, Any]:
        return {**demo_task.request(task_id, patch), "env": dict(FAST_ENV)}

    batch = [
        good("gold", demo_task.gold_patch),
        {**good("renamed", ""), "instance_id": "demo__calc-1"},  # two ids: task_id's
        good("empty", ""),
        {**good("typo", ""), "fail_to_pas": []},
        {**good("same", demo_task.gold_patch), "instance_id": "same"},  # one id, twice
    ]
    with SandboxClient(executor.url) as client:
        results = run_tasks_safe(batch, client=client)
    assert [(r.task_id, r.status, r.error_code) for r in results] == [
        ("gold", "resolved", None),
        ("renamed", "unresolved", None),
        ("empty", "unresolved", None),
        ("typo", "execution_error", "invalid_spec"),
        ("same", "resolved", None),
    ]
    assert [reward_from_result(r) for r in results] == [1.0, 0.0, 0.0, None, 1.0]
    assert [no_verdict_cause(r) for r in results] == [None, None, None, "caller_bug", None]
    # Only the good ones reached the executor, each once.
    assert answered(executor, "/task/submit", 200) == 4
    assert run_tasks_safe([], client=None) == []
