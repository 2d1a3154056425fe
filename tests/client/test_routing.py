"""Placement (``sandbox_client.routing``): rendezvous ranking, template affinity, spill on 429,
room from ``/health`` and from 429s, ejection and re-admission, the fleet's view."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import responses

from sandbox_client import ClientConfig, SandboxClient
from sandbox_client.routing import rendezvous_rank
from task_executor.demo import DemoTask

from .conftest import FAST_ENV, Sleeps, graded_on, ranked, task_result, task_spec

A, B, C = "http://exec-a:9090", "http://exec-b:9090", "http://exec-c:9090"
Make = Callable[..., SandboxClient]
Executors = Callable[..., Any]
BUSY = {"error": {"code": "over_capacity", "message": "all slots are busy"}}
KEYS = [f"template-{i}" for i in range(2000)]
FLEET = [f"http://10.0.0.{i}:9090" for i in range(1, 7)]


def owners(urls: list[str]) -> dict[str, str]:
    return {key: rendezvous_rank(key, urls)[0] for key in KEYS}


# -- ranking ---------------------------------------------------------------------------------


def test_ranking_is_stable_and_ignores_the_order_urls_come_in() -> None:
    for key in KEYS[:50]:
        ranking = rendezvous_rank(key, FLEET)
        assert sorted(ranking) == sorted(FLEET)
        assert rendezvous_rank(key, FLEET[::-1]) == ranking == rendezvous_rank(key, FLEET)


def test_removing_an_executor_moves_only_the_keys_it_ranked_first() -> None:
    before = owners(FLEET)
    gone = FLEET[2]
    after = owners([url for url in FLEET if url != gone])
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == gone}
    # ... and each of them goes to its second choice: the next in its own ranking.
    assert all(after[key] == rendezvous_rank(key, FLEET)[1] for key in moved)


def test_adding_an_executor_moves_only_the_keys_it_now_ranks_first() -> None:
    before = owners(FLEET)
    after = owners([*FLEET, "http://10.0.0.99:9090"])
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved and all(after[key] == "http://10.0.0.99:9090" for key in moved)


def test_keys_spread_over_the_fleet() -> None:
    shares = Counter(owners(FLEET).values())
    assert set(shares) == set(FLEET)
    assert all(0.6 < n / (len(KEYS) / len(FLEET)) < 1.4 for n in shares.values()), shares


# -- affinity and spill (mocked executors) ---------------------------------------------------


def counting(mocked: responses.RequestsMock, urls: list[str]) -> Counter[str]:
    """Every executor in ``urls`` grades whatever it gets; returns the counts by URL."""
    hits: Counter[str] = Counter()
    lock = threading.Lock()

    def answer(request: requests.PreparedRequest) -> tuple[int, dict[str, str], str]:
        with lock:
            hits[f"http://{urlsplit(request.url).netloc}"] += 1
        return 200, {}, json.dumps(task_result(json.loads(request.body or b"{}")["task_id"]))

    for url in urls:
        mocked.add_callback(responses.POST, f"{url}/task/submit", callback=answer)
    return hits


def test_a_grpo_group_goes_to_the_executor_its_template_ranks_first(
    mocked: responses.RequestsMock, make_client: Make
) -> None:
    hits = counting(mocked, [A, B, C])
    client = make_client([A, B, C])
    groups = [ranked(order, task_spec("g")) for order in ([A, B, C], [B, C, A], [C, A, B])]
    rollouts = [{**group, "task_id": f"g{g}-r{r}"} for g, group in enumerate(groups)
                for r in range(8)]
    with ThreadPoolExecutor(8) as pool:
        assert all(r.status == "resolved" for r in pool.map(client.run_task, rollouts))
    assert hits == {A: 8, B: 8, C: 8}


def test_affinity_k_deals_a_template_to_the_least_busy_of_its_first_k(
    mocked: responses.RequestsMock, make_client: Make
) -> None:
    held, entered = threading.Event(), threading.Event()
    hits = counting(mocked, [B, C])

    def slow(request: requests.PreparedRequest) -> tuple[int, dict[str, str], str]:
        entered.set()
        held.wait(30)
        return 200, {}, json.dumps(task_result("first"))

    mocked.add_callback(responses.POST, f"{A}/task/submit", callback=slow)
    client = make_client([A, B, C], affinity_k=2)
    spec = ranked([A, B, C])
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.run_task, {**spec, "task_id": "first"})
        assert entered.wait(30)
        assert client.run_task({**spec, "task_id": "second"}).status == "resolved"
        held.set()
        assert first.result().status == "resolved"
    assert hits == {B: 1}  # A was busy with the first: its peer among the first 2 took it


def test_a_429_marks_the_executor_full_for_the_calls_after_it(
    mocked: responses.RequestsMock, make_client: Make, sleeps: Sleeps
) -> None:
    busy = mocked.post(f"{A}/task/submit", json=BUSY, status=429, headers={"Retry-After": "60"})
    hits = counting(mocked, [B])
    client = make_client([A, B])
    spec = ranked([A, B])
    for i in range(3):
        assert client.run_task({**spec, "task_id": f"t{i}"}).status == "resolved"
    assert (busy.call_count, hits, sleeps.calls) == (1, {B: 3}, [])


def health(capacity: int) -> dict[str, Any]:
    return {
        "status": "ok", "version": "test", "check_s": 0.01,
        "capabilities": {"workspace_mode": "overlay", "overlay": True, "namespaces": True,
                         "egress_guard": True},
        "load": {"tasks_running": 0, "task_capacity": capacity, "sessions": 0,
                 "session_capacity": 8},
    }


class OneSlot:
    """An executor with one grading slot that answers 429 beyond it; holds its first grading
    until ``release`` is set."""

    def __init__(self, mocked: responses.RequestsMock, url: str) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.running = self.refused = self.graded = 0
        self._lock = threading.Lock()
        mocked.get(f"{url}/health", json=health(capacity=1))
        mocked.add_callback(responses.POST, f"{url}/task/submit", callback=self._answer)

    def _answer(self, request: requests.PreparedRequest) -> tuple[int, dict[str, str], str]:
        with self._lock:
            if self.running:
                self.refused += 1
                return 429, {"Retry-After": "2"}, json.dumps(BUSY)
            self.running += 1
        if not self.graded:
            self.entered.set()
            self.release.wait(30)
        with self._lock:
            self.running -= 1
            self.graded += 1
        return 200, {}, json.dumps(task_result(json.loads(request.body or b"{}")["task_id"]))


def test_an_executor_full_by_its_health_is_passed_over_unasked(
    mocked: responses.RequestsMock, make_client: Make
) -> None:
    a = OneSlot(mocked, A)
    hits = counting(mocked, [B])
    client = make_client([A, B])
    assert client.health(A).load["task_capacity"] == 1
    assert client.fleet_status()[A].task_capacity == 1
    spec = ranked([A, B])
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.run_task, {**spec, "task_id": "first"})
        assert a.entered.wait(30)
        assert client.run_task({**spec, "task_id": "second"}).status == "resolved"
        a.release.set()
        assert first.result().status == "resolved"
    assert (a.graded, a.refused, hits) == (1, 0, {B: 1})


def test_with_every_executor_full_a_task_waits_in_the_client_for_a_slot(
    mocked: responses.RequestsMock, make_client: Make, sleeps: Sleeps
) -> None:
    a = OneSlot(mocked, A)
    client = make_client(A)
    client.health(A)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(client.run_task, task_spec("first"))
        assert a.entered.wait(30)
        second = pool.submit(client.run_task, task_spec("second"))
        deadline = time.monotonic() + 30  # a guard against hanging, not a speed requirement
        while client._fleet.waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client._fleet.waiting == 1 and a.graded == 0
        a.release.set()
        assert [first.result().status, second.result().status] == ["resolved", "resolved"]
    assert (a.graded, a.refused, sleeps.calls) == (2, 0, [])  # never sent to be refused


# -- ejection ----------------------------------------------------------------------------------


def test_no_call_after_the_first_connects_to_an_ejected_executor(
    mocked: responses.RequestsMock, make_client: Make, closed_port_url: str
) -> None:
    mocked.add_passthru(closed_port_url)
    hits = counting(mocked, [B])
    config = ClientConfig(urls=(closed_port_url, B), probe_base_s=3600.0, probe_max_s=3600.0)
    client = make_client([closed_port_url, B], config=config)
    spec = ranked([closed_port_url, B])
    for i in range(5):
        assert client.run_task({**spec, "task_id": f"t{i}"}).status == "resolved"
    dead, alive = client.fleet_status()[closed_port_url], client.fleet_status()[B]
    assert (dead.healthy, dead.connect_failures, dead.ejections) == (False, 1, 1)
    assert "could not connect" in (dead.last_error or "") and dead.next_probe_s is not None
    assert (alive.healthy, alive.in_flight, alive.last_error, hits) == (True, 0, None, {B: 5})


def test_an_executor_that_breaks_every_connection_is_ejected(
    mocked: responses.RequestsMock, make_client: Make, hangup_server: Any
) -> None:
    mocked.add_passthru(hangup_server.url)
    hits = counting(mocked, [B])
    config = ClientConfig(urls=(hangup_server.url, B), probe_base_s=3600.0, probe_max_s=3600.0)
    client = make_client([hangup_server.url, B], config=config)
    spec = ranked([hangup_server.url, B])
    # The submit breaks; the /health asked before a re-submit breaks too: the executor is
    # ejected and the task placed again.
    assert client.run_task(spec).status == "resolved"
    assert not client.fleet_status()[hangup_server.url].healthy
    assert client.run_task({**spec, "task_id": "next"}).status == "resolved"
    assert (hangup_server.connections, hits) == (2, {B: 2})


def test_ejected_executor_is_readmitted_when_it_answers_again(
    demo_task: DemoTask, process_executors: Executors, caplog: pytest.LogCaptureFixture
) -> None:
    """Real executors on loopback: one killed (ejected at the first refused connect, then
    passed over), started again at its URL (re-admitted by a probe, its templates' home again)."""
    doomed, survivor = process_executors(2)
    order = [doomed.url, survivor.url]
    spec = ranked(order, {**demo_task.request("again", demo_task.gold_patch), "env": FAST_ENV})
    caplog.set_level(logging.INFO, logger="sandbox_client.client")
    config = ClientConfig(urls=tuple(order), probe_base_s=0.05, probe_max_s=0.2)
    with SandboxClient(config=config) as client:
        assert client.run_task({**spec, "task_id": "before"}).status == "resolved"
        doomed.process.send_signal(signal.SIGKILL)
        doomed.process.wait(timeout=60)
        for i in range(3):
            assert client.run_task({**spec, "task_id": f"while-{i}"}).status == "resolved"
        status = client.fleet_status()[order[0]]
        assert (status.healthy, status.connect_failures) == (False, 1)

        process_executors(1, port=urlsplit(order[0]).port)
        deadline = time.monotonic() + 120  # a guard against hanging, not a speed requirement
        while not client.fleet_status()[order[0]].healthy and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.fleet_status()[order[0]].healthy
        assert client.run_task({**spec, "task_id": "after"}).status == "resolved"
    assert graded_on(caplog) == {order[0]: 2, order[1]: 3}
    assert client.fleet_status()[order[0]].connect_failures == 1


def test_sessions_of_one_template_start_together_and_spill_on_429(
    mocked: responses.RequestsMock, make_client: Make, sleeps: Sleeps
) -> None:
    started = {"session_id": "s", "workdir": "/testbed", "base_commit": "abc123"}
    full = mocked.post(f"{A}/session/start", json=BUSY, status=429, headers={"Retry-After": "60"})
    mocked.post(f"{A}/session/start", json=started)
    spilled = mocked.post(f"{B}/session/start", json=started)
    client = make_client([A, B])
    spec = ranked([A, B], {"repo": "/srv/repo", "base_commit": "abc123"})
    sessions = [client.start_session(spec) for _ in range(2)]
    # A refused the first and counts as full for a minute: both went to B, no one waited.
    assert [s.url for s in sessions] == [B, B]
    assert (full.call_count, spilled.call_count, sleeps.calls) == (1, 2, [])
