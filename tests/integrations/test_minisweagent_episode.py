"""One scripted mini-swe-agent episode on Dockyard: mini's own DefaultAgent and DeterministicModel
(mini-swe-agent 2.4.6) fix the demo bug through DockyardEnvironment, submit, and ``finish``
grades the submission ``resolved``. Runs where mini-swe-agent is installed (the frameworks
virtualenv of scripts/ci/frameworks.sh)."""

from __future__ import annotations

import os

import pytest

from sandbox_client import SandboxClient
from task_executor.demo import DemoTask
from tests.conftest import FAST_PYTEST_ENV

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
pytest.importorskip("minisweagent")

from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402

from sandbox_client.integrations.minisweagent import DockyardEnvironment  # noqa: E402


def session_task(task: DemoTask) -> dict[str, object]:
    return {"repo": task.repo, "base_commit": task.base_commit, "env": dict(FAST_PYTEST_ENV)}


STEPS = [
    "grep -n 'return a - b' calc/__init__.py",
    "sed -i 's/return a - b/return a + b/' calc/__init__.py",
    "git diff -- calc > patch.txt",
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt",
]


def test_scripted_episode_fixes_the_bug_and_is_graded_resolved(
    demo_task: DemoTask, client: SandboxClient
) -> None:
    model = DeterministicModel(outputs=[
        make_output(f"step {n}", [{"command": command}]) for n, command in enumerate(STEPS)
    ])
    env = DockyardEnvironment(client=client, task=session_task(demo_task))
    agent = DefaultAgent(model, env, system_template="You fix bugs.",
                         instance_template="{{task}}", cost_limit=0)
    try:
        outcome = agent.run("Fix calc.add.")
        assert outcome["exit_status"] == "Submitted"
        assert "+    return a + b" in outcome["submission"]
        # The first observation came from the sandbox: the buggy line, found by grep.
        assert "5:    return a - b" in agent.messages[3]["content"]
        graded = env.finish(test_patch=demo_task.test_patch, fail_to_pass=demo_task.fail_to_pass,
                            pass_to_pass=demo_task.pass_to_pass)
        assert graded.result.status == "resolved", graded.result.log
        assert graded.patch == outcome["submission"]
    finally:
        env.cleanup()


def test_a_submission_that_does_not_fix_is_unresolved(
    demo_task: DemoTask, client: SandboxClient
) -> None:
    env = DockyardEnvironment(client=client, task=session_task(demo_task))
    try:
        with pytest.raises(Exception) as submitted:
            env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})
        assert type(submitted.value).__name__ == "Submitted"
        assert env.submission == ""
        graded = env.finish(test_patch=demo_task.test_patch,
                            fail_to_pass=demo_task.fail_to_pass,
                            pass_to_pass=demo_task.pass_to_pass)
        assert graded.result.status == "unresolved"
    finally:
        env.cleanup()
