"""Round-robin routing (an option; affinity is the default): a batch from many threads spreads
evenly; sessions stay with their executor."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import requests
import responses

from sandbox_client import SandboxClient

from .conftest import task_result, task_spec

URLS = ["http://exec-a:9090", "http://exec-b:9090", "http://exec-c:9090"]
Make = Callable[..., SandboxClient]


def test_300_tasks_over_3_urls_from_16_threads(
    mocked: responses.RequestsMock, make_client: Make
) -> None:
    hits: Counter[str] = Counter()
    lock = threading.Lock()

    def answer(request: requests.PreparedRequest) -> tuple[int, dict[str, str], str]:
        with lock:
            hits[urlsplit(request.url).netloc] += 1
        task_id = json.loads(request.body or b"{}")["task_id"]
        return 200, {}, json.dumps(task_result(task_id))

    for url in URLS:
        mocked.add_callback(responses.POST, f"{url}/task/submit", callback=answer)
    client = make_client(URLS, routing="round_robin")
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(client.run_task, [task_spec(f"t-{i}") for i in range(300)]))
    assert [r.task_id for r in results] == [f"t-{i}" for i in range(300)]
    assert hits == {"exec-a:9090": 100, "exec-b:9090": 100, "exec-c:9090": 100}


def test_next_url_cycles(make_client: Make) -> None:
    client = make_client(URLS)
    assert [client.next_url() for _ in range(7)] == URLS * 2 + URLS[:1]


def test_session_calls_go_to_the_owning_executor(
    mocked: responses.RequestsMock, make_client: Make
) -> None:
    for i, url in enumerate(URLS):
        start = {"session_id": f"s{i}", "workdir": "/w", "base_commit": "abc"}
        mocked.post(f"{url}/session/start", json=start)
        mocked.post(f"{url}/session/s{i}/exec", json={"exit_code": 0, "output": url})
    client = make_client(URLS, routing="round_robin")
    sessions = [client.start_session({"repo": "/r", "base_commit": "abc"}) for _ in URLS]
    assert [s.url for s in sessions] == URLS
    # Interleave calls; each must still land on its own executor.
    for _ in range(3):
        for session in reversed(sessions):
            assert session.exec("pwd").output == session.url
