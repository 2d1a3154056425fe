"""A SkyRL environment that grades the model's patch on Dockyard (skyrl-gym 0.4.0).

Register it and name it in the dataset's ``env_class``; each row's
``extras["reward_spec"]["ground_truth"]`` is the task (a TaskSpec mapping or its JSON)::

    from skyrl_gym.envs import register
    register(id="dockyard", entry_point="sandbox_client.integrations.skyrl:DockyardEnv")

One step, ``done`` at once; ``metadata["valid"]`` is False when the grading gave no verdict, so
"no verdict" is never silently a reward of 0 (see ``rewards.skyrl_step``).
"""

from __future__ import annotations

from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from .rewards import skyrl_step


class DockyardEnv(BaseTextEnv):  # type: ignore[misc]  # skyrl_gym ships no type information
    """``BaseTextEnv`` whose one step grades the action's patch."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        spec = (extras or {}).get("reward_spec") or {}
        if "ground_truth" not in spec:
            raise ValueError("DockyardEnv: extras['reward_spec']['ground_truth'] is required")
        self.ground_truth = spec["ground_truth"]
        self.no_verdict_score = float(getattr(env_config, "no_verdict_score", 0.0) or 0.0)
        self.last_valid: bool | None = None

    def step(self, action: str) -> BaseTextEnvStepOutput:
        output = skyrl_step(action, self.ground_truth, no_verdict_score=self.no_verdict_score)
        self.last_valid = output["metadata"]["valid"]
        return BaseTextEnvStepOutput(**output)

    def get_metrics(self) -> dict[str, Any]:
        return {} if self.last_valid is None else {"valid": float(self.last_valid)}
