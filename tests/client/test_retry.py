"""Retry and failover rules: move on only when a request never reached a server or was not taken
(429/503 spill to the next in rank), wait out 429/503 when every executor says it, re-submit a
task only to the executor that has it (elsewhere once that one is gone), never replay anything
else."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
import responses
from urllib3.exceptions import MaxRetryError, NewConnectionError
from urllib3.exceptions import ProtocolError as Urllib3Error

from sandbox_client import (
    ClientConfig,
    ConnectionLost,
    ExecutorBusy,
    ExecutorTimeout,
    ExecutorUnreachable,
    SandboxClient,
)

from .conftest import RawServer, Sleeps, body_of, closed_port, ranked, task_result, task_spec

A, B = "http://exec-a:9090", "http://exec-b:9090"
Make = Callable[..., SandboxClient]
BUSY = {"error": {"code": "busy", "message": "no free worker"}}
HEALTH = {
    "status": "ok", "version": "test", "check_s": 0.01, "load": {},
    "capabilities": {"workspace_mode": "overlay", "overlay": True, "namespaces": True,
                     "egress_guard": True},
}
ABORTED = requests.ConnectionError(Urllib3Error("Connection aborted.", ConnectionResetError()))


def test_refused_moves_to_next_url(
    mocked: responses.RequestsMock, make_client: Make, closed_port_url: str
) -> None:
    mocked.add_passthru(closed_port_url)
    ok = mocked.post(f"{B}/task/submit", json=task_result())
    client = make_client([closed_port_url, B])
    assert client.run_task(ranked([closed_port_url, B])).status == "resolved"
    assert ok.call_count == 1
    assert not client.fleet_status()[closed_port_url].healthy


def test_all_refused_is_unreachable(make_client: Make) -> None:
    client = make_client([closed_port(), closed_port()])
    with pytest.raises(ExecutorUnreachable, match="tried 2"):
        client.run_task(task_spec())


def test_429_on_the_only_executor_waits_retry_after_then_retries(
    mocked: responses.RequestsMock, make_client: Make, sleeps: Sleeps
) -> None:
    url = f"{A}/task/submit"
    mocked.post(url, json=BUSY, status=429, headers={"Retry-After": "3"})
    mocked.post(url, json=task_result())
    assert make_client(A).run_task(task_spec()).status == "resolved"
    assert len(sleeps.calls) == 1 and 3.0 <= sleeps.calls[0] <= 3.0 * 1.25


def test_429_spills_to_the_next_in_rank_at_once(
    mocked: responses.RequestsMock, make_client: Make, sleeps: Sleeps
) -> None:
    first = mocked.post(f"{A}/task/submit", json=BUSY, status=429, headers={"Retry-After": "3"})
    second = mocked.post(f"{B}/task/submit", json=task_result())
    client = make_client([A, B])
    assert client.run_task(ranked([A, B])).status == "resolved"
    assert (first.call_count, second.call_count, sleeps.calls) == (1, 1, [])


def test_every_executor_busy_waits_then_starts_again_from_the_first(
    mocked: responses.RequestsMock, make_client: Make, sleeps: Sleeps
) -> None:
    mocked.post(f"{A}/task/submit", json=BUSY, status=429, headers={"Retry-After": "2"})
    mocked.post(f"{A}/task/submit", json=task_result())
    mocked.post(f"{B}/task/submit", json=BUSY, status=503, headers={"Retry-After": "3"})
    client = make_client([A, B])
    assert client.run_task(ranked([A, B])).status == "resolved"
    assert [c.request.url for c in mocked.calls] == [f"{u}/task/submit" for u in (A, B, A)]
    assert len(sleeps.calls) == 1 and sleeps.calls[0] >= 3.0  # the last Retry-After heard


def test_busy_gives_up_after_the_retry_count(
    mocked: responses.RequestsMock, make_client: Make, sleeps: Sleeps
) -> None:
    call = mocked.post(f"{A}/task/submit", json=BUSY, status=503, headers={"Retry-After": "1"})
    config = ClientConfig(urls=(A,), busy_retries=3, backoff_base_s=0.1)
    with pytest.raises(ExecutorBusy):
        make_client(A, config=config).run_task(task_spec())
    assert call.call_count == 4 and len(sleeps.calls) == 3
    assert all(wait >= 1.0 for wait in sleeps.calls)


def test_busy_gives_up_when_the_time_budget_is_spent(
    mocked: responses.RequestsMock, make_client: Make, sleeps: Sleeps
) -> None:
    mocked.post(f"{A}/task/submit", json=BUSY, status=429, headers={"Retry-After": "40"})
    config = ClientConfig(urls=(A,), busy_retries=100, busy_budget_s=100.0)
    with pytest.raises(ExecutorBusy) as info:
        make_client(A, config=config).run_task(task_spec())
    assert info.value.retry_after == 40.0
    assert sum(sleeps.calls) <= 100.0 and len(sleeps.calls) in (1, 2)


def test_backoff_grows_without_retry_after(
    mocked: responses.RequestsMock, make_client: Make, sleeps: Sleeps
) -> None:
    url = f"{A}/task/submit"
    for _ in range(3):
        mocked.post(url, json=BUSY, status=503)
    mocked.post(url, json=task_result())
    config = ClientConfig(urls=(A,), backoff_base_s=1.0)
    make_client(A, config=config).run_task(task_spec())
    floors = [1.0, 2.0, 4.0]
    assert all(f <= wait <= f * 1.25 for f, wait in zip(floors, sleeps.calls, strict=True))


def test_read_timeout_is_not_sent_elsewhere(
    mocked: responses.RequestsMock, make_client: Make, silent_server: RawServer
) -> None:
    mocked.add_passthru(silent_server.url)
    other = mocked.post(f"{B}/task/submit", json=task_result())
    config = ClientConfig(urls=(silent_server.url, B), timeout_margin=0.2, resubmits=1)
    client = make_client([silent_server.url, B], config=config)
    with pytest.raises(ExecutorTimeout):
        client.run_task(ranked([silent_server.url, B], task_spec(timeout=0.1)))
    assert other.call_count == 0
    # One submit and one same-task_id re-submit, both to the executor that has the task.
    assert silent_server.connections == 2


def test_read_timeout_follows_the_task_timeout(
    mocked: responses.RequestsMock, make_client: Make
) -> None:
    mocked.post(f"{A}/task/submit", json=task_result())
    config = ClientConfig(urls=(A,), connect_timeout=3.0, timeout_margin=60.0, task_timeout=500)
    client = make_client(A, config=config)
    client.run_task(task_spec(timeout=100))
    client.run_task(task_spec())  # no timeout of its own: the trainer's task_timeout applies
    timeouts = [call.request.req_kwargs["timeout"] for call in mocked.calls]
    assert timeouts == [(3.0, 160.0), (3.0, 560.0)]
    assert body_of(mocked.calls[1])["timeout"] == 500


def test_lost_reply_resubmits_same_task_to_same_executor(
    mocked: responses.RequestsMock, make_client: Make
) -> None:
    url = f"{A}/task/submit"
    mocked.post(url, body=ABORTED)
    mocked.post(url, json=task_result("t-9"))
    mocked.get(f"{A}/health", json=HEALTH)
    other = mocked.post(f"{B}/task/submit", json=task_result("t-9"))
    result = make_client([A, B]).run_task(ranked([A, B], task_spec("t-9")))
    assert result.task_id == "t-9"
    # The broken connection makes the client ask whether A is still there before re-submitting.
    assert [c.request.url for c in mocked.calls] == [url, f"{A}/health", url]
    assert [body_of(c)["task_id"] for c in (mocked.calls[0], mocked.calls[2])] == ["t-9", "t-9"]
    assert other.call_count == 0


def test_in_progress_is_polled_until_the_stored_result(
    mocked: responses.RequestsMock, make_client: Make, sleeps: Sleeps
) -> None:
    url = f"{A}/task/submit"
    in_progress = {"error": {"code": "task_in_progress", "message": "still grading"}}
    mocked.post(url, body=ABORTED)
    mocked.get(f"{A}/health", json=HEALTH)  # still there: the re-submit goes to it
    mocked.post(url, json=in_progress, status=409, headers={"Retry-After": "5"})
    mocked.post(url, json=in_progress, status=409, headers={"Retry-After": "5"})
    mocked.post(url, json=task_result())
    assert make_client(A).run_task(task_spec()).status == "resolved"
    assert len(sleeps.calls) == 2 and all(5.0 <= s <= 6.25 for s in sleeps.calls)


def refused(url: str) -> requests.ConnectionError:
    return requests.ConnectionError(
        MaxRetryError(None, url, NewConnectionError(None, "Connection refused"))
    )


def test_executor_gone_after_accepting_is_graded_elsewhere(
    mocked: responses.RequestsMock, make_client: Make
) -> None:
    """The task reached A, then A died (its re-submit cannot connect): the grading died with it,
    so the task is placed again instead of coming back without a verdict."""
    url = f"{A}/task/submit"
    first = mocked.post(url, body=ABORTED)
    mocked.get(f"{A}/health", body=refused(f"{A}/health"))
    other = mocked.post(f"{B}/task/submit", json=task_result())
    client = make_client([A, B])
    assert client.run_task(ranked([A, B])).status == "resolved"
    assert (first.call_count, other.call_count) == (1, 1)
    status = client.fleet_status()[A]
    assert (status.healthy, status.connect_failures) == (False, 1)


def test_many_calls_lost_on_one_dead_executor_cost_one_failed_connect(
    mocked: responses.RequestsMock, make_client: Make
) -> None:
    """Eight gradings in flight when A dies: one /health check finds it gone, the others take
    its word, and all eight are graded on B."""
    entered, arrived = threading.Barrier(8), threading.Lock()
    count = {"n": 0}

    def dies(request: requests.PreparedRequest) -> Any:
        with arrived:
            count["n"] += 1
        entered.wait(30)  # all eight are in flight before any of them breaks
        raise ABORTED

    mocked.add_callback(responses.POST, f"{A}/task/submit", callback=dies)
    health = mocked.get(f"{A}/health", body=refused(f"{A}/health"))
    other = mocked.post(f"{B}/task/submit", json=task_result())
    # No probe of the monitor's in the count: its first would come an hour after the ejection.
    config = ClientConfig(urls=(A, B), probe_base_s=3600.0, probe_max_s=3600.0)
    client = make_client([A, B], config=config)
    spec = ranked([A, B])
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(client.run_task, [{**spec, "task_id": f"t{i}"} for i in range(8)]))
    assert [r.status for r in results] == ["resolved"] * 8
    assert (count["n"], other.call_count, health.call_count) == (8, 8, 1)
    assert client.fleet_status()[A].connect_failures == 1


def test_executor_gone_after_accepting_with_nowhere_else_is_not_unreachable(
    mocked: responses.RequestsMock, make_client: Make
) -> None:
    """The only executor took the task and died: the error says the reply was lost, not that
    the task never reached a server."""
    url = f"{A}/task/submit"
    mocked.post(url, body=ABORTED)
    mocked.get(f"{A}/health", body=refused(f"{A}/health"))
    with pytest.raises(ConnectionLost):
        make_client(A).run_task(task_spec())


def test_exec_is_never_replayed(mocked: responses.RequestsMock, make_client: Make) -> None:
    start = {"session_id": "s1", "workdir": "/w", "base_commit": "abc"}
    mocked.post(f"{A}/session/start", json=start)
    exec_call = mocked.post(f"{A}/session/s1/exec", body=ABORTED)
    session = make_client(A).start_session({"repo": "/r", "base_commit": "abc"})
    with pytest.raises(ConnectionLost):
        session.exec("make install")
    assert exec_call.call_count == 1
