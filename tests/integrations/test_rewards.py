"""The trainers' reward shapes against a real executor: verdicts score 1/0 with valid set, a
grading without a verdict is flagged invalid (never a silent 0)."""

from __future__ import annotations

import json

from sandbox_client import SandboxClient
from sandbox_client.integrations.rewards import (
    compute_score,
    compute_score_batch,
    extract_patch,
    reward_func,
    skyrl_step,
)
from task_executor.demo import DemoTask
from tests.integrations.conftest import task_row


def fenced(patch: str) -> str:
    return f"I fixed add.\n```diff\n{patch}```\nDone."


def test_extract_patch_takes_the_last_fenced_diff_else_the_diff_lines() -> None:
    assert extract_patch("a\n```diff\nX\n```\nb\n```patch\nY\n```") == "Y\n"
    assert extract_patch("see:\ndiff --git a/f b/f\n+x\n") == "diff --git a/f b/f\n+x\n"
    assert extract_patch("no patch here") == "no patch here"


def test_verl_compute_score_grades_the_patch_in_the_answer(
    demo_task: DemoTask, client: SandboxClient
) -> None:
    row = task_row(demo_task)
    gold = compute_score("swe", fenced(demo_task.gold_patch), row, {}, client=client)
    wrong = compute_score("swe", "I could not fix it.", json.dumps(row), client=client)
    assert gold == {"score": 1.0, "valid": True, "resolved": True, "status": "resolved"}
    assert wrong == {"score": 0.0, "valid": True, "resolved": False,
                     "status": "patch_apply_failed"}


def test_no_verdict_is_flagged_invalid_not_scored_silently(
    demo_task: DemoTask, client: SandboxClient
) -> None:
    # The executor cannot check the commit out: no verdict on the agent, whatever it wrote.
    broken = {**task_row(demo_task), "base_commit": "0" * 40}
    scored = compute_score("swe", fenced(demo_task.gold_patch), broken, client=client,
                           no_verdict_score=-1.0)
    assert scored["valid"] is False
    assert scored["status"] == "execution_error"
    assert scored["score"] == -1.0
    garbage = compute_score("swe", "x", "not json", client=client)
    assert (garbage["valid"], garbage["status"]) == (False, "execution_error")


def test_verl_batch_form_keeps_order_and_keys(demo_task: DemoTask, client: SandboxClient) -> None:
    row = task_row(demo_task)
    scores = compute_score_batch(
        ["swe"] * 3, [fenced(demo_task.gold_patch), "nothing", fenced(demo_task.gold_patch)],
        [row, row, "[]"], [None, None, None], client=client,
    )
    assert [(s["score"], s["valid"]) for s in scores] == [(1.0, True), (0.0, True), (0.0, False)]
    assert all(set(s) == {"score", "valid", "resolved", "status"} for s in scores)


def test_openrlhf_reward_func_strips_the_prompt_and_flags_validity(
    demo_task: DemoTask, client: SandboxClient
) -> None:
    prompt = "Fix calc.add. Answer with a diff.\n"
    labels = [json.dumps(task_row(demo_task)), json.dumps(task_row(demo_task)), "{}"]
    # The prompt itself holds a (wrong) diff: only the response part may be graded.
    prompts = [prompt + "```diff\nnot a patch\n```\n"] * 3
    queries = [prompts[0] + fenced(demo_task.gold_patch), prompts[1] + "no idea",
               prompts[2] + fenced(demo_task.gold_patch)]
    out = reward_func(queries, prompts, labels, client=client)
    assert [float(x) for x in out["rewards"]] == [1.0, 0.0, 0.0]
    assert [float(x) for x in out["scores"]] == [1.0, 0.0, 0.0]
    assert [float(x) for x in out["extra_logs"]["valid"]] == [1.0, 1.0, 0.0]


def test_skyrl_step_output_shape(demo_task: DemoTask, client: SandboxClient) -> None:
    out = skyrl_step(fenced(demo_task.gold_patch), task_row(demo_task), client=client)
    assert out == {"observations": [], "reward": 1.0, "done": True,
                   "metadata": {"valid": True, "resolved": True, "status": "resolved"}}
