"""The shared template key (``protocol.template_key``): what it normalizes, that the client's key
is the one the executor keys its template with, and that affinity builds a GRPO group's template
once where round-robin builds it on every executor (``template_hit``, ``/metrics``)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sandbox_client import SandboxClient
from sandbox_client.protocol import normalize_repo, template_key
from task_executor.demo import DemoTask
from tests.conftest import RunningExecutor
from tests.executor.test_metrics import scrape, value

from .conftest import FAST_ENV, ranked

Executors = Callable[..., RunningExecutor]
SHA = "0123456789abcdef0123456789abcdef01234567"


def test_the_key_normalizes_only_what_text_can_tell() -> None:
    same = ["/srv/repo", "/srv//repo/", "/srv/./repo", "//srv/repo/."]
    assert {normalize_repo(spelling) for spelling in same} == {"/srv/repo"}
    assert normalize_repo("/srv/x/../repo") == "/srv/x/../repo"  # a symlink may sit at x
    assert normalize_repo("https://example.com/r.git/") == "https://example.com/r.git/"
    assert template_key("/srv/repo/", SHA.upper()) == template_key("/srv/repo", SHA)
    assert template_key("/srv/repo", "Main") != template_key("/srv/repo", "main")
    env_ab, env_ba = {"A": "1", "B": "2"}, {"B": "2", "A": "1"}
    assert template_key("/r", SHA, ["x"], env_ab) == template_key("/r", SHA, ["x"], env_ba)
    assert template_key("/r", SHA, ["x", "y"]) != template_key("/r", SHA, ["y", "x"])
    assert template_key("/r", SHA, [], {}) == template_key("/r", SHA)


def demo_spec(demo: DemoTask, task_id: str, **extra: Any) -> dict[str, Any]:
    return {**demo.request(task_id, demo.gold_patch), "env": dict(FAST_ENV), **extra}


def test_the_clients_key_is_the_key_the_executor_builds_under(
    demo_task: DemoTask, executor: RunningExecutor
) -> None:
    assert Path(demo_task.repo).resolve() == Path(demo_task.repo)  # no symlink on the way
    spec = demo_spec(demo_task, "k1", setup=["echo prepared > .prepared"])
    key = template_key(spec["repo"], spec["base_commit"], spec["setup"], spec["env"])
    with SandboxClient(executor.url) as client:
        first = client.run_task(spec)
        # Another spelling of the same path: the same key on both sides, the same template.
        again = client.run_task({**spec, "task_id": "k2", "repo": f"{demo_task.repo}/./"})
    assert (first.status, first.template_hit) == ("resolved", False)
    assert (again.status, again.template_hit) == ("resolved", True)
    built = [p.name for p in (executor.settings.base_dir / "templates").iterdir()]
    assert built == [key]


def builds(executors: list[RunningExecutor]) -> float:
    return sum(value(scrape(e), "dockyard_template_builds_total") for e in executors)


def grade_group(client: SandboxClient, group: dict[str, Any], rollouts: int) -> list[Any]:
    """All rollouts of one task at once, as a GRPO step submits them."""
    specs = [{**group, "task_id": f"{group['task_id']}-r{r}"} for r in range(rollouts)]
    with ThreadPoolExecutor(rollouts) as pool:
        return list(pool.map(client.run_task, specs))


def test_affinity_builds_a_groups_template_once_round_robin_on_every_executor(
    demo_task: DemoTask, executor_factory: Executors
) -> None:
    executors = [executor_factory() for _ in range(3)]
    urls = [e.url for e in executors]
    with SandboxClient(urls) as client:
        results = grade_group(client, ranked(urls, demo_spec(demo_task, "aff")), rollouts=4)
    assert [r.status for r in results] == ["resolved"] * 4
    assert sorted(r.template_hit for r in results) == [False, True, True, True]
    assert builds(executors) == 1

    with SandboxClient(urls, routing="round_robin") as client:
        # Another template (another env), dealt in turn: each executor builds its own copy.
        group = demo_spec(demo_task, "rr", env={**FAST_ENV, "GROUP": "rr"})
        results = grade_group(client, group, rollouts=4)
    assert [r.status for r in results] == ["resolved"] * 4
    assert sorted(r.template_hit for r in results) == [False, False, False, True]
    assert builds(executors) == 1 + 3


def test_a_session_start_says_whether_it_built_its_template(
    demo_task: DemoTask, executor: RunningExecutor
) -> None:
    spec = {"repo": demo_task.repo, "base_commit": demo_task.base_commit, "env": dict(FAST_ENV),
            "setup": ["echo prepared > .prepared"]}
    with SandboxClient(executor.url) as client:
        with client.start_session(spec) as first, client.start_session(spec) as second:
            with first.fork() as forked:
                hits = (first.template_hit, second.template_hit, forked.template_hit)
        # The same template as a grading of the task: the grading reuses it.
        graded = client.run_task(demo_spec(demo_task, "after-sessions",
                                           setup=["echo prepared > .prepared"]))
    assert hits == (False, True, True)
    assert graded.template_hit is True
    assert builds([executor]) == 1
