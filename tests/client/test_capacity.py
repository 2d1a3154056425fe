"""The client learns each executor's capacity before its first call there (issue #25), and learns
it again when it is old or in doubt: a cold batch against a real capacity-4 executor meets no 429
(counted by the executor's own /metrics), and without learning the same setup does meet them.

The live gradings wait in their test command for a file the test creates, so "four at the
executor, twelve waiting in the client" is a state the test observes, never a timing."""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
import responses

from sandbox_client import ExecutorUnreachable, SandboxClient, TaskSpec
from sandbox_client.routing import Fleet
from task_executor.demo import DemoTask
from task_executor.grading.grader import default_test_command
from tests.conftest import RunningExecutor
from tests.processes import wait_until

from .conftest import FAST_ENV, Sleeps, answered, closed_port, ranked, task_result, task_spec

Make = Callable[..., SandboxClient]
A, B = "http://exec-a:9090", "http://exec-b:9090"
GUARD_S = 120.0  # only turns a hang into a failure
BUSY = {"error": {"code": "over_capacity", "message": "all slots are busy"}}
STARTED = {"session_id": "s", "workdir": "/testbed", "base_commit": "abc123"}


def held_specs(demo: DemoTask, release: Path, count: int) -> list[dict[str, Any]]:
    """``count`` gradings, gold and empty patches alternating, whose tests start only once
    ``release`` exists."""
    specs = []
    for i in range(count):
        body = {**demo.request(f"cold-{i}", demo.gold_patch if i % 2 == 0 else ""),
                "env": dict(FAST_ENV)}
        tests = default_test_command(TaskSpec.model_validate(body))
        body["test_command"] = f"until [ -e {release} ]; do sleep 0.05; done; {tests}"
        specs.append(body)
    return specs


def running(executor: RunningExecutor) -> int:
    return int(executor.get("/health").json()["load"]["tasks_running"])


def held_batch(
    executor: RunningExecutor, demo: DemoTask, release: Path, count: int, learn: bool,
    while_held: Callable[[SandboxClient], None],
) -> None:
    """``count`` gradings sent at once by one client, ``while_held`` checked while their tests
    are held, then let go: every verdict must be right."""
    specs = held_specs(demo, release, count)
    with SandboxClient(executor.url, learn_capacity=learn) as client, \
            ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(client.run_task, spec) for spec in specs]
        while_held(client)
        release.touch()
        results = [future.result(timeout=GUARD_S) for future in futures]
    assert [r.status for r in results] == [
        "resolved" if i % 2 == 0 else "unresolved" for i in range(count)]


def test_a_cold_batch_of_16_on_a_capacity_4_executor_meets_no_429(
    shared_dir: Path, executor_factory: Callable[..., RunningExecutor], demo_task: DemoTask
) -> None:
    executor = executor_factory(max_concurrent_tasks=4)

    def four_sent_twelve_waiting(client: SandboxClient) -> None:
        # Four at the executor, twelve waiting in the client: nothing sent to be refused.
        wait_until(lambda: running(executor) == 4 and client._fleet.waiting == 12,
                   timeout=GUARD_S)
        assert client.fleet_status()[executor.url].task_capacity == 4

    held_batch(executor, demo_task, shared_dir / "release", 16, True, four_sent_twelve_waiting)
    assert answered(executor, "/task/submit", 200) == 16
    assert answered(executor, "/task/submit", 429) == 0


def test_without_learning_the_same_cold_batch_meets_429s(
    shared_dir: Path, executor_factory: Callable[..., RunningExecutor], demo_task: DemoTask
) -> None:
    """The setup above can fail: told not to learn, the client sends beyond the capacity."""
    executor = executor_factory(max_concurrent_tasks=4)

    def refused(client: SandboxClient) -> None:
        wait_until(lambda: answered(executor, "/task/submit", 429) >= 2, timeout=GUARD_S)
        assert client.fleet_status()[executor.url].task_capacity is None

    held_batch(executor, demo_task, shared_dir / "release", 6, False, refused)


# -- learning again: scripted executors ----------------------------------------------------------


def health(tasks: int | None, sessions: int | None = 8) -> dict[str, Any]:
    load = {"tasks_running": 0, "sessions": 0}
    load.update({k: v for k, v in (("task_capacity", tasks), ("session_capacity", sessions))
                 if v is not None})
    return {"status": "ok", "version": "test", "check_s": 0.01,
            "capabilities": {"workspace_mode": "overlay", "overlay": True, "namespaces": True,
                             "egress_guard": True},
            "load": load}


@pytest.fixture
def learning(make_client: Make) -> Make:
    """Clients that learn capacity (the shared fixture's do not)."""
    return lambda urls, **kwargs: make_client(urls, learn_capacity=True, **kwargs)


def test_health_is_asked_once_before_the_first_call(
    mocked: responses.RequestsMock, learning: Make
) -> None:
    probe = mocked.get(f"{A}/health", json=health(2))
    submit = mocked.post(f"{A}/task/submit", json=task_result())
    client = learning(A)
    for i in range(3):
        assert client.run_task(task_spec(f"t{i}")).status == "resolved"
    assert [c.request.url for c in mocked.calls][:2] == [f"{A}/health", f"{A}/task/submit"]
    assert (probe.call_count, submit.call_count) == (1, 3)
    assert (client.fleet_status()[A].task_capacity, client.fleet_status()[A].session_capacity) \
        == (2, 8)


def test_a_429_all_the_same_has_the_capacity_learned_again(
    mocked: responses.RequestsMock, learning: Make, sleeps: Sleeps
) -> None:
    """An executor restarted with other limits: it said 4, then refuses; asked again it says 1."""
    mocked.get(f"{A}/health", json=health(4))
    mocked.get(f"{A}/health", json=health(1))
    mocked.post(f"{A}/task/submit", json=BUSY, status=429, headers={"Retry-After": "1"})
    mocked.post(f"{A}/task/submit", json=task_result())
    client = learning(A)
    assert client.run_task(task_spec()).status == "resolved"
    health_calls = [c for c in mocked.calls if c.request.url == f"{A}/health"]
    assert len(health_calls) == 2
    assert client.fleet_status()[A].task_capacity == 1


def test_a_broken_connection_has_the_capacity_learned_again(
    mocked: responses.RequestsMock, learning: Make
) -> None:
    mocked.get(f"{A}/health", json=health(4))
    mocked.get(f"{A}/health", json=health(2))  # the restarted executor's
    mocked.post(f"{A}/task/submit", body=requests.ConnectionError("reset by peer"))
    mocked.post(f"{A}/task/submit", json=task_result())
    client = learning(A)
    assert client.run_task(task_spec()).status == "resolved"  # re-submitted after its /health
    assert client.run_task(task_spec("next")).status == "resolved"
    assert client.fleet_status()[A].task_capacity == 2


def test_an_executor_without_capacity_in_its_health_or_not_answering_it_is_used_as_before(
    mocked: responses.RequestsMock, learning: Make
) -> None:
    mocked.get(f"{A}/health", json=health(None, None))
    mocked.post(f"{A}/task/submit", json=task_result())
    silent = closed_port()
    mocked.add_passthru(silent)
    client = learning([A])
    assert client.run_task(task_spec()).status == "resolved"
    assert client.fleet_status()[A].task_capacity is None
    # Nothing listens: the /health is refused, the call goes ahead and fails as it would have.
    other = learning([silent])
    with pytest.raises(ExecutorUnreachable):
        other.run_task(task_spec())


class Scripted:
    """A stand-in ``learn``: answers the capacities given, one per call, and counts calls."""

    def __init__(self, *capacities: int) -> None:
        self.capacities = list(capacities)
        self.calls = 0

    def __call__(self, url: str) -> Mapping[str, float]:
        capacity = self.capacities[min(self.calls, len(self.capacities) - 1)]
        self.calls += 1
        return {"task_capacity": capacity, "session_capacity": capacity}


def fleet(learn: Scripted, ttl: float) -> Fleet:
    return Fleet([A], routing="round_robin", affinity_k=1, probe=learn, probe_base_s=3600,
                 probe_max_s=3600, learn=learn, capacity_ttl_s=ttl)


def test_a_learned_capacity_is_trusted_for_its_ttl_only() -> None:
    kept, expiring = Scripted(2, 5), Scripted(2, 5)
    for one in (fleet(kept, ttl=3600.0), fleet(expiring, ttl=0.0)):
        for _ in range(3):
            url = one.reserve("task", [A], set(), None)
            assert url == A
            one.release(A, "task")
    assert (kept.calls, expiring.calls) == (1, 3)


def test_an_ejection_has_the_capacity_learned_again() -> None:
    learn = Scripted(2, 6)
    one = fleet(learn, ttl=3600.0)
    one.reserve("task", [A], set(), None)
    one.release(A, "task")
    one.connect_failed(A, "refused")
    one.answered(A)  # back in rotation, by a call's answer: what it can take is not known
    one.reserve("task", [A], set(), None)
    assert (learn.calls, one.status()[A].task_capacity) == (2, 6)
    one.close()


def test_many_first_calls_wait_for_one_health() -> None:
    gate, entered = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow_learn(url: str) -> Mapping[str, float]:
        calls.append(url)
        entered.set()
        gate.wait(GUARD_S)
        return {"task_capacity": 2}

    one = Fleet([A], routing="round_robin", affinity_k=1, probe=slow_learn, probe_base_s=3600,
                probe_max_s=3600, learn=slow_learn)
    with ThreadPoolExecutor(4) as pool:
        placed: list[Future[str | None]] = [
            pool.submit(one.reserve, "task", [A], set(), 1e12) for _ in range(4)]
        assert entered.wait(GUARD_S)
        gate.set()
        # The capacity learned: two placed, two waiting for room.
        wait_until(lambda: sum(f.done() for f in placed) == 2 and one.waiting == 2,
                   timeout=GUARD_S)
        one.release(A, "task")
        one.release(A, "task")
        assert [f.result(GUARD_S) for f in placed] == [A] * 4
    assert calls == [A]


# -- sessions ------------------------------------------------------------------------------------


@pytest.fixture
def two_executors(mocked: responses.RequestsMock) -> Iterator[dict[str, responses.BaseResponse]]:
    yield {
        url: (mocked.get(f"{url}/health", json=health(4, sessions=1)),
              mocked.post(f"{url}/session/start", json=STARTED),
              mocked.delete(f"{url}/session/s", json={"session_id": "s", "closed": True}))[1]
        for url in (A, B)
    }


def test_sessions_held_count_against_the_session_capacity(
    two_executors: dict[str, Any], learning: Make, sleeps: Sleeps
) -> None:
    client = learning([A, B])
    spec = ranked([A, B], {"repo": "/srv/repo", "base_commit": "abc123"})
    first = client.start_session(spec)
    second = client.start_session(spec)  # A holds its one session: B, not a 429 at A
    assert [first.url, second.url] == [A, B]
    assert client.fleet_status()[A].sessions == 1
    first.close()
    third = client.start_session(spec)
    assert third.url == A
    # A session dropped without closing gives its room back too (the executor reaps it).
    del third
    gc.collect()
    assert client.fleet_status()[A].sessions == 0
    assert client.start_session(spec).url == A
    assert [two_executors[u].call_count for u in (A, B)] == [3, 1]
    assert sleeps.calls == []


def test_a_fork_holds_room_on_its_executor_like_a_start(
    mocked: responses.RequestsMock, learning: Make, sleeps: Sleeps
) -> None:
    """A fork is a new session on its parent's executor: counted until it ends, so that the
    next start goes where there is room instead of meeting a 429 there."""
    for url in (A, B):
        mocked.get(f"{url}/health", json=health(4, sessions=2))
        mocked.post(f"{url}/session/start", json=STARTED)
    fork_route = mocked.post(f"{A}/session/s/fork", json={**STARTED, "session_id": "f"})
    mocked.delete(f"{A}/session/f", json={"session_id": "f", "closed": True})
    client = learning([A, B])
    spec = ranked([A, B], {"repo": "/srv/repo", "base_commit": "abc123"})
    parent = client.start_session(spec)
    assert parent.url == A and client.fleet_status()[A].sessions == 1
    fork = parent.fork()
    assert fork_route.call_count == 1 and fork.url == A
    assert client.fleet_status()[A].sessions == 2
    assert client.start_session(spec).url == B  # A is full: the parent and its fork
    fork.close()
    assert client.fleet_status()[A].sessions == 1
    assert sleeps.calls == []


def test_scripted_bodies_are_valid_health_answers() -> None:
    """The stand-in answers above are what the protocol says a /health is."""
    from sandbox_client.protocol import HealthResponse

    assert HealthResponse.model_validate_json(json.dumps(health(3))).load["task_capacity"] == 3


class Metrics:
    """``answered`` for an executor subprocess, known only by its URL."""

    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str) -> requests.Response:
        return requests.get(self.url + path, timeout=30)


def test_an_executor_restarted_with_a_smaller_capacity_is_learned_again(
    shared_dir: Path, process_executors: Callable[..., list[Any]], demo_task: DemoTask,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It said 3; restarted at the same URL with 1 slot, it refuses the second of two gradings
    (the client still believed 3): the client asks again, and from then on sends one at a time."""
    monkeypatch.setenv("DOCKYARD_MAX_TASKS", "3")
    (first,) = process_executors(1)
    url = first.url
    release = shared_dir / "release"
    with SandboxClient(url) as client:
        warm = {**demo_task.request("warm", demo_task.gold_patch), "env": dict(FAST_ENV)}
        assert client.run_task(warm).status == "resolved"
        assert client.fleet_status()[url].task_capacity == 3
        first.process.kill()
        first.process.wait()
        monkeypatch.setenv("DOCKYARD_MAX_TASKS", "1")
        process_executors(1, port=int(url.rsplit(":", 1)[1]))
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(client.run_task, spec)
                       for spec in held_specs(demo_task, release, 2)]
            wait_until(lambda: client.fleet_status()[url].task_capacity == 1, timeout=GUARD_S)
            assert answered(Metrics(url), "/task/submit", 429) >= 1
            release.touch()
            results = [future.result(timeout=GUARD_S) for future in futures]
    assert [r.status for r in results] == ["resolved", "unresolved"]
