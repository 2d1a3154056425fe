"""End to end against real executors on loopback: verdicts, spreading, failover, a killed
executor that costs no verdict, a lost reply that must not run the tests twice, and sessions."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from sandbox_client import (
    ExecutorRejected,
    RemoteSession,
    SandboxClient,
    reward_from_result,
    run_task_safe,
)
from sandbox_client.protocol import FinishResult
from task_executor.demo import DemoTask
from tests.loopback import LoopbackServer

from .conftest import FAST_ENV, graded_on

Executors = Callable[..., Any]


def spec(demo: DemoTask, task_id: str, patch: str, **extra: Any) -> dict[str, Any]:
    return {**demo.request(task_id, patch), "env": dict(FAST_ENV), **extra}


def test_gold_resolves_and_empty_does_not(demo_task: DemoTask, executor: Any) -> None:
    with SandboxClient(executor.url) as client:
        gold = client.run_task(spec(demo_task, "gold", demo_task.gold_patch))
        empty = client.run_task(spec(demo_task, "empty", ""))
    assert (gold.status, gold.resolved, reward_from_result(gold)) == ("resolved", True, 1.0)
    assert sorted(gold.fail_to_pass.passed) == sorted(demo_task.fail_to_pass)
    assert (empty.status, empty.resolved, reward_from_result(empty)) == ("unresolved", False, 0.0)


@pytest.mark.slow  # ~10 s of the default suite's budget; test_roundrobin covers the spread
def test_batch_of_40_spreads_evenly_over_3_executors(
    demo_task: DemoTask, executor_factory: Executors, caplog: pytest.LogCaptureFixture
) -> None:
    urls = [executor_factory().url for _ in range(3)]
    caplog.set_level(logging.INFO, logger="sandbox_client.client")
    with SandboxClient(urls, routing="round_robin") as client, ThreadPoolExecutor(8) as pool:
        specs = [spec(demo_task, f"t{i}", demo_task.gold_patch) for i in range(40)]
        results = list(pool.map(client.run_task, specs))
    assert all(r.status == "resolved" for r in results)
    assert sorted(graded_on(caplog).values()) == [13, 13, 14]


def test_a_closed_port_in_the_fleet_costs_no_verdict(
    demo_task: DemoTask,
    executor_factory: Executors,
    closed_port_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    urls = [executor_factory().url, closed_port_url, executor_factory().url]
    caplog.set_level(logging.INFO, logger="sandbox_client.client")
    with SandboxClient(urls, routing="round_robin") as client, ThreadPoolExecutor(4) as pool:
        specs = [spec(demo_task, f"c{i}", "") for i in range(9)]
        results = list(pool.map(run_task_safe, specs, [client] * len(specs)))
    assert [r.status for r in results] == ["unresolved"] * 9
    # The closed port's share failed over to the live executors (how it splits between them
    # depends on which of the 4 concurrent calls learns of the ejection first).
    graded = graded_on(caplog)
    assert set(graded) == {urls[0], urls[2]} and sum(graded.values()) == 9, graded


def test_executor_killed_mid_batch_loses_no_verdict(
    demo_task: DemoTask, process_executors: Executors
) -> None:
    doomed, survivor = process_executors(2)
    specs = [spec(demo_task, f"k{i}", demo_task.gold_patch) for i in range(24)]
    finished = threading.Semaphore(0)

    def run(task: dict[str, Any]) -> Any:
        try:
            return run_task_safe(task, client)
        finally:
            finished.release()

    with SandboxClient([doomed.url, survivor.url]) as client, ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(run, task) for task in specs]
        for _ in range(4):
            finished.acquire()
        doomed.process.send_signal(signal.SIGKILL)
        results = [f.result() for f in futures]  # none raises
    # The tasks in flight on the killed executor are graded again on the survivor.
    assert Counter(r.status for r in results) == {"resolved": 24}


class DroppingProxy:
    """Forwards HTTP requests to ``upstream``; drops the reply of the first ``drops`` requests
    whose path ends with ``only`` after the upstream answered (a reply lost on the way back)."""

    def __init__(self, upstream: str, drops: int, only: str = "") -> None:
        self.upstream, self.drops, self.only, self.requests = upstream, drops, only, 0
        self.matched = 0
        self._server = LoopbackServer(self._dispatch, backlog=8)
        self.url = self._server.url

    def _dispatch(self, conn: socket.socket) -> None:
        threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, body = data.split(b"\r\n\r\n", 1)
            lines = head.decode().split("\r\n")
            method, path, _ = lines[0].split(" ")
            headers = dict(line.split(": ", 1) for line in lines[1:])
            while len(body) < int(headers.get("Content-Length", 0)):
                body += conn.recv(65536)
            self.requests += 1
            matched = path.endswith(self.only)
            self.matched += matched
            forwarded = {name: headers[name] for name in ("Content-Type", "Idempotency-Key")
                         if name in headers}
            try:
                answer = requests.request(
                    method, self.upstream + path, data=body, timeout=60, headers=forwarded
                )
            except requests.RequestException:
                # The upstream is gone (its test ended while a client thread still called):
                # the connection just closes. Raised here, the error landed on whatever test
                # ran next (an unhandled thread exception fails that test's teardown).
                return
            if matched and self.matched <= self.drops:
                return  # the executor graded it; the client never hears back
            conn.sendall(
                f"HTTP/1.1 {answer.status_code} X\r\nContent-Length: {len(answer.content)}\r\n"
                f"Content-Type: application/json\r\nConnection: close\r\n\r\n".encode()
                + answer.content
            )

    def close(self) -> None:
        self._server.close()


@pytest.fixture
def dropping_proxy(executor: Any) -> Iterator[DroppingProxy]:
    proxy = DroppingProxy(executor.url, drops=1, only="/task/submit")
    yield proxy
    proxy.close()


def test_lost_reply_does_not_run_tests_twice(
    demo_task: DemoTask, dropping_proxy: DroppingProxy, connection_counter: Any
) -> None:
    # Each test run checks in with a counter on the host (sandboxed code sees the host read-only).
    counter = connection_counter
    check_in = f'python -c "{counter.snippet()}"'
    command = f"{check_in}; python -m pytest -p no:cacheprovider tests/test_calc.py"
    task = spec(demo_task, "once", demo_task.gold_patch, test_command=command,
                deny_network=False)
    with SandboxClient(dropping_proxy.url) as client:
        result = client.run_task(task)
    assert result.status == "resolved"
    # The /health that tells the client the executor's capacity, the submit, the /health that
    # says the executor is still there, the same call again.
    assert dropping_proxy.requests == 4
    assert counter.count == 1  # graded once


def test_lost_finish_reply_is_retried_and_answered_without_regrading(
    demo_task: DemoTask, executor_factory: Executors, connection_counter: Any
) -> None:
    executor = executor_factory(deny_network=False)  # the test command checks in on the host
    proxy = DroppingProxy(executor.url, drops=1, only="/finish")
    check_in = f'python -c "{connection_counter.snippet()}"'
    try:
        with SandboxClient(proxy.url) as client:
            session = client.start_session(
                {"repo": demo_task.repo, "base_commit": demo_task.base_commit, "env": FAST_ENV}
            )
            session.exec("sed -i 's/return a - b/return a + b/' calc/__init__.py")
            done = session.finish(
                test_patch=demo_task.test_patch, fail_to_pass=demo_task.fail_to_pass,
                pass_to_pass=demo_task.pass_to_pass,
                test_command=f"{check_in}; python -m pytest -p no:cacheprovider tests/test_calc.py",
            )
    finally:
        proxy.close()
    assert done.result.status == "resolved" and "return a + b" in done.patch
    assert proxy.matched == 2  # the finish whose reply was lost, and its retry
    assert connection_counter.count == 1  # graded once


def test_session_start_exec_files_finish(demo_task: DemoTask, executor: Any) -> None:
    with SandboxClient(executor.url) as client:
        session = client.start_session(
            {"repo": demo_task.repo, "base_commit": demo_task.base_commit}
        )
        with session:
            assert session.exec("git rev-parse HEAD").output.strip() == demo_task.base_commit
            data = b"a\r\nb\xff\n"
            session.write_file("notes/x.bin", data)
            assert session.read_file("notes/x.bin") == data
            session.exec("rm -r notes && sed -i 's/return a - b/return a + b/' calc/__init__.py")
            assert session.state().alive
            done = session.finish(
                test_patch=demo_task.test_patch,
                fail_to_pass=demo_task.fail_to_pass,
                pass_to_pass=demo_task.pass_to_pass,
            )
        assert done.result.status == "resolved"
        assert "return a + b" in done.patch
        assert session.finished and not session.closed
    assert FinishResult.model_validate_json(done.model_dump_json()) == done


def test_session_snapshot_and_fork_are_public(demo_task: DemoTask, executor: Any) -> None:
    """snapshot() keeps a state to fork from; fork() is a new session on the same executor with
    the source's tree, cwd and exports; the source goes on untouched."""
    start = {"repo": demo_task.repo, "base_commit": demo_task.base_commit}
    with SandboxClient(executor.url) as client, client.start_session(start) as source:
        source.exec("echo one > state.txt && mkdir -p sub && cd sub && export MARK=kept")
        snap = source.snapshot("first")
        assert (snap.session_id, snap.name) == (source.session_id, "first")
        assert source.snapshot().name == "snap-2"  # the default name
        source.exec("echo two > ../state.txt")
        with source.fork() as now, source.fork(snapshot="first") as then:
            assert isinstance(now, RemoteSession) and now.url == source.url
            assert len({source.session_id, now.session_id, then.session_id}) == 3
            assert now.exec("cat ../state.txt; echo $MARK; basename $PWD").output.split() == [
                "two", "kept", "sub"]
            assert then.read_file("state.txt") == b"one\n"
            then.write_file("state.txt", b"changed in the fork\n")
        assert source.read_file("state.txt") == b"two\n"
        with pytest.raises(ExecutorRejected) as missing:
            source.fork(snapshot="never-taken")
        assert (missing.value.status, missing.value.code) == (404, "snapshot_not_found")
