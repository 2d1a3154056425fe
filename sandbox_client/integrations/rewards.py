"""Rewards in the shapes verl, OpenRLHF and SkyRL call, each with a validity flag.

Every function grades the patch found in the model's text against a task (``ground_truth`` /
``label`` / ``reward_spec.ground_truth``: a TaskSpec mapping or its JSON, SWE-bench aliases
allowed) with ``sandbox_client.reward.run_task_safe``, which never raises. A grading without a
verdict (``execution_error``: executor down, broken task, a spec the client refused) is scored
``no_verdict_score`` (0.0 unless told otherwise, because the trainers want a number) AND marked
``valid = False``: the flag is what lets a trainer drop the sample instead of learning that a
correct patch was wrong. The mapping from status to reward is ``sandbox_client.reward.REWARDS``.

Signatures, checked against the pinned sources:

- verl 0.9.1 (``verl/experimental/reward_loop/reward_manager/naive.py`` and
  ``verl/workers/reward_manager/batch.py``): ``compute_score(data_source, solution_str,
  ground_truth, extra_info=None, **kwargs)`` returning a float or a dict with ``"score"`` (the
  other keys become ``reward_extra_info``, so every dict carries the same keys), and the batch
  form ``compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs)``
  returning one such dict per sample.
- OpenRLHF 0.11.2 (``openrlhf/utils/agent.py``, ``SingleTurnAgentExecutor``):
  ``reward_func(queries, prompts, labels, **kwargs)`` returning ``{"rewards", "scores",
  "extra_logs"}``, tensors of one value per query (``queries`` are prompt + response).
- SkyRL (skyrl-gym 0.4.0, ``skyrl_gym/envs/base_text_env.py``): ``step(action)`` returning
  ``BaseTextEnvStepOutput(observations, reward, done, metadata)``; ``skyrl_step`` builds it and
  ``sandbox_client.integrations.skyrl.DockyardEnv`` is the registered environment class.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..client import SandboxClient
from ..protocol import TaskResult
from ..reward import REWARDS, execution_error, run_task_safe

__all__ = [
    "compute_score",
    "compute_score_batch",
    "extract_patch",
    "grade_patch",
    "reward_func",
    "score_dict",
    "skyrl_step",
]

_FENCE = re.compile(r"```(?:diff|patch)[^\n]*\n(.*?)```", re.DOTALL)


def extract_patch(text: str) -> str:
    """The patch in a model's answer: the last fenced ``diff``/``patch`` block, else everything
    from the first ``diff --git`` line, else the text itself (an empty or non-patch answer is
    graded as what it is: a patch that does not resolve)."""
    blocks = _FENCE.findall(text)
    if blocks:
        return str(blocks[-1])
    start = text.find("diff --git ")
    return text[start:] if start >= 0 else text


def grade_patch(
    task: Mapping[str, Any] | str, patch: str, *, client: SandboxClient | None = None
) -> TaskResult:
    """Grade ``patch`` on ``task`` (a TaskSpec mapping or its JSON); never raises."""
    try:
        spec = dict(json.loads(task) if isinstance(task, str) else task)
    except (TypeError, ValueError) as exc:
        return execution_error("?", f"task is not a JSON object: {exc}", code="invalid_spec")
    spec.pop("model_patch", None)  # the submission replaces whatever patch the record carried
    spec["patch"] = patch
    return run_task_safe(spec, client=client)


def score_dict(result: TaskResult, no_verdict_score: float = 0.0) -> dict[str, Any]:
    """``{"score", "valid", "resolved", "status"}``: the same keys for every sample, as verl's
    ``reward_extra_info`` needs; ``valid`` is False exactly when there is no verdict."""
    reward = REWARDS[result.status]
    return {
        "score": no_verdict_score if reward is None else reward,
        "valid": reward is not None,
        "resolved": bool(result.resolved),
        "status": result.status,
    }


def compute_score(
    data_source: str, solution_str: str, ground_truth: Mapping[str, Any] | str,
    extra_info: Mapping[str, Any] | None = None, *, client: SandboxClient | None = None,
    no_verdict_score: float = 0.0, **_: Any,
) -> dict[str, Any]:
    """verl's ``custom_reward_function``: grade the patch in ``solution_str`` on the task in
    ``ground_truth``. ``no_verdict_score`` can be set from ``reward_kwargs``."""
    result = grade_patch(ground_truth, extract_patch(solution_str), client=client)
    return score_dict(result, no_verdict_score)


def compute_score_batch(
    data_sources: Sequence[str], solution_strs: Sequence[str],
    ground_truths: Sequence[Mapping[str, Any] | str],
    extra_infos: Sequence[Mapping[str, Any] | None] | None = None, *,
    client: SandboxClient | None = None, no_verdict_score: float = 0.0,
    max_workers: int = 16, **_: Any,
) -> list[dict[str, Any]]:
    """verl's batch form (``reward_manager.name=batch``): one dict per sample, in order,
    graded concurrently (``max_workers`` gradings in flight)."""
    infos = list(extra_infos) if extra_infos is not None else [None] * len(solution_strs)
    if not len(data_sources) == len(solution_strs) == len(ground_truths) == len(infos):
        raise ValueError("compute_score_batch: the four sequences differ in length")
    if not solution_strs:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(solution_strs)))) as pool:
        return list(pool.map(
            lambda item: compute_score(*item, client=client, no_verdict_score=no_verdict_score),
            zip(data_sources, solution_strs, ground_truths, infos, strict=True),
        ))


def reward_func(
    queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Mapping[str, Any] | str],
    *, client: SandboxClient | None = None, no_verdict_score: float = 0.0, **_: Any,
) -> dict[str, Any]:
    """OpenRLHF's ``--remote_rm_url reward.py`` function. ``rewards`` and ``scores`` hold one
    value per query; ``extra_logs["valid"]`` is 1.0 for a verdict, 0.0 for none (filter on it:
    OpenRLHF logs it per sample). Tensors when torch is importable (always, under OpenRLHF)."""
    responses = [
        query[len(prompt):] if isinstance(prompt, str) and query.startswith(prompt) else query
        for query, prompt in zip(queries, prompts, strict=True)
    ]
    scores = compute_score_batch(["dockyard"] * len(responses), responses, list(labels),
                                 client=client, no_verdict_score=no_verdict_score)
    rewards = [float(s["score"]) for s in scores]
    return {
        "rewards": _tensor(rewards),
        "scores": _tensor(rewards),
        "extra_logs": {
            "valid": _tensor([float(s["valid"]) for s in scores]),
            "resolved": _tensor([float(s["resolved"]) for s in scores]),
        },
    }


def skyrl_step(
    action: str, ground_truth: Mapping[str, Any] | str, *, client: SandboxClient | None = None,
    no_verdict_score: float = 0.0,
) -> dict[str, Any]:
    """A SkyRL ``BaseTextEnvStepOutput`` for a one-step patch task: ``done`` at once, the
    reward, and ``metadata`` carrying ``valid`` (False: no verdict), ``status`` and
    ``resolved``."""
    scored = compute_score("dockyard", action, ground_truth, client=client,
                           no_verdict_score=no_verdict_score)
    metadata = {key: value for key, value in scored.items() if key != "score"}
    return {"observations": [], "reward": scored["score"], "done": True, "metadata": metadata}


def _tensor(values: list[float]) -> Any:
    try:
        import torch  # OpenRLHF's own example returns float tensors
    except ImportError:
        return values
    return torch.tensor(values, dtype=torch.float)
