"""DockyardEnv made through SkyRL's own registry (skyrl-gym 0.4.0), graded by a real executor."""

from __future__ import annotations

import pytest

from sandbox_client import SandboxClient, api
from task_executor.demo import DemoTask
from tests.integrations.conftest import task_row
from tests.integrations.test_rewards import fenced

skyrl_gym = pytest.importorskip("skyrl_gym")

ENV_ID = "dockyard-test"


def test_registered_env_steps_once_with_a_validity_flag(
    demo_task: DemoTask, client: SandboxClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The env grades through the default client (DOCKYARD_SANDBOX_URLS), as a trainer's does.
    monkeypatch.setattr(api, "_default", client)
    if ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=ENV_ID, entry_point="sandbox_client.integrations.skyrl:DockyardEnv")
    env = skyrl_gym.make(ENV_ID, env_config=None,
                         extras={"reward_spec": {"ground_truth": task_row(demo_task)}})
    assert isinstance(env, skyrl_gym.Env)
    out = env.step(fenced(demo_task.gold_patch))
    assert (out["reward"], out["done"], out["metadata"]["valid"]) == (1.0, True, True)
    assert env.get_metrics() == {"valid": 1.0}
    broken = skyrl_gym.make(ENV_ID, env_config=None, extras={
        "reward_spec": {"ground_truth": {**task_row(demo_task), "base_commit": "0" * 40}}})
    out = broken.step(fenced(demo_task.gold_patch))
    assert out["metadata"] == {"valid": False, "resolved": False, "status": "execution_error"}
    with pytest.raises(ValueError, match="ground_truth"):
        skyrl_gym.make(ENV_ID, env_config=None, extras={})
