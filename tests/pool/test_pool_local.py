"""The image pool end to end on the local provider: real executor processes, one per image in
use, each with a tiny image root made here, driven through ``SandboxClient(pool=...)``.

acquire -> exec -> finish -> release -> idle deletion -> drain, and what the issue asks to show:
every session sees its own image; concurrent acquires of one image make one executor; the cap
holds with LRU trimming; a spec of another key is never served; an unknown image is a clear
error; drain leaves no process, mount, directory or cgroup; a SIGKILLed executor is replaced.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_client import SandboxClient
from sandbox_client.errors import TaskExecutorError
from sandbox_client.pool import (
    ImageUnavailable,
    LocalProvider,
    Pool,
    PoolSettings,
)
from task_executor.grading.grader import owner_token
from task_executor.sandbox.cgroups import ROOT as CGROUP_ROOT
from tests.conftest import FAST_PYTEST_ENV
from tests.images import IMAGE_A, IMAGE_B, MARKER
from tests.pool.support import fix_finish_and_grade, start_at_once
from tests.processes import mounts_anywhere, pids_carrying, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="executors sandbox as root")



@pytest.fixture
def images(task_images: tuple[Path, dict[str, str]]) -> tuple[Path, dict[str, str]]:
    return task_images


@pytest.fixture
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dockyard-pool-", dir="/var/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_pool(images: tuple[Path, dict[str, str]], work: Path, **settings: Any) -> Pool:
    provider = LocalProvider(images[0], work, env={"DOCKYARD_TASK_EXECUTOR_THREADS": "8"})
    values: dict[str, Any] = {"job": "t", "poll_interval_s": 0.05, "check_interval_s": 0.2,
                              **settings}
    return Pool(PoolSettings(**values), provider)


def session_spec(demo_task, image: str, **extra: Any) -> dict[str, Any]:
    return {"repo": demo_task.repo, "base_commit": demo_task.base_commit, "image": image,
            "env": FAST_PYTEST_ENV, **extra}


def assert_nothing_left(pool: Pool, work: Path, bases: list[Path]) -> None:
    assert pool.provider.names() == []
    assert list(work.iterdir()) == []
    for base in bases:
        assert pids_carrying(f"DOCKYARD_EXECUTOR={owner_token(base)}".encode()) == []
        assert not list(CGROUP_ROOT.glob(f"*/dockyard-{owner_token(base)}"))
    assert mounts_anywhere(work) == []


def test_acquire_exec_finish_release_idle_deletion_and_drain(images, work, demo_task):
    pool = make_pool(images, work, idle_timeout_s=1.0)
    bases: list[Path] = []
    try:
        with SandboxClient(pool=pool, urls=["http://127.0.0.1:9"]) as client:
            session = client.start_session(session_spec(demo_task, IMAGE_A))
            bases.append(work / pool.provider.names()[0])
            seen = session.exec(f"cat /{MARKER}").output.strip()
            assert seen == images[1][IMAGE_A]  # its image, not the host's (no such file there)
            fix_finish_and_grade(client, session, demo_task, IMAGE_A, FAST_PYTEST_ENV)
        stats = pool.stats()
        assert stats["acquires"]["miss"] == 1 and stats["acquires"]["hit"] == 1
        assert stats["creates"] == 1  # the grading went to the session's pod
        # Released and idle past its time: deleted, nothing refilled.
        wait_until(lambda: pool.stats()["pods_total"] == 0, timeout=120)
        assert pool.stats()["evictions"].get("idle") == 1
        assert_nothing_left(pool, work, bases)
    finally:
        report = pool.drain()
    assert report["left"] == []


def test_concurrent_acquires_of_one_image_make_one_executor(images, work, demo_task):
    pool = make_pool(images, work)
    try:
        with SandboxClient(pool=pool, urls=["http://127.0.0.1:9"]) as client:
            sessions = start_at_once(client, session_spec(demo_task, IMAGE_A), 8)
            assert len({s.url for s in sessions}) == 1
            stats = pool.stats()
            assert stats["creates"] == 1
            assert stats["acquires"]["miss"] == 1
            assert stats["acquires"]["join"] + stats["acquires"]["hit"] == 7
            for session in sessions:
                session.close()
    finally:
        pool.drain()


def test_each_session_sees_its_own_image_and_keys_are_never_mixed(images, work, demo_task):
    pool = make_pool(images, work)
    try:
        with SandboxClient(pool=pool, urls=["http://127.0.0.1:9"]) as client:
            a = client.start_session(session_spec(demo_task, IMAGE_A))
            b = client.start_session(session_spec(demo_task, IMAGE_B))
            # Same image, another environment (egress allowed): another key, another pod.
            open_a = client.start_session(session_spec(demo_task, IMAGE_A, deny_network=False))
            assert a.exec(f"cat /{MARKER}").output.strip() == images[1][IMAGE_A]
            assert b.exec(f"cat /{MARKER}").output.strip() == images[1][IMAGE_B]
            assert open_a.exec(f"cat /{MARKER}").output.strip() == images[1][IMAGE_A]
            assert len({a.url, b.url, open_a.url}) == 3
            for session in (a, b, open_a):
                session.close()
        assert pool.stats()["creates"] == 3
    finally:
        pool.drain()


def test_the_cap_holds_and_trims_the_least_recently_used_idle_pod(images, work, demo_task):
    pool = make_pool(images, work, max_pods=2)
    try:
        with SandboxClient(pool=pool, urls=["http://127.0.0.1:9"]) as client:
            client.start_session(session_spec(demo_task, IMAGE_A)).close()  # A: idle, older
            b = client.start_session(session_spec(demo_task, IMAGE_B))
            b.close()  # B: idle, used last
            pods_before = pool.provider.names()
            # A new key (A with egress allowed) needs room: the least recently used idle pod goes.
            c = client.start_session(session_spec(demo_task, IMAGE_A, deny_network=False))
            assert c.exec(f"cat /{MARKER}").output.strip() == images[1][IMAGE_A]
            stats = pool.stats()
            assert stats["evictions"] == {"lru": 1}
            assert sorted(stats["pods"]) == [IMAGE_A, IMAGE_B]  # the old A went, B stayed
            assert len(pool.provider.names()) <= 2 and pods_before[0] not in pool.provider.names()
            # Both pods busy now: a third key waits, then is refused, never over the cap.
            b2 = client.start_session(session_spec(demo_task, IMAGE_B))
            with pytest.raises(TaskExecutorError) as refused:
                pool.acquire(IMAGE_A, timeout=1.0)  # A, egress denied: its pod was trimmed
            assert getattr(refused.value, "code", "") == "pool_full"
            assert pool.stats()["acquires"]["refused"] == 1
            assert len(pool.provider.names()) == 2
            b2.close()
            c.close()
    finally:
        pool.drain()


def test_an_unknown_image_is_a_clear_error(images, work, demo_task):
    pool = make_pool(images, work)
    try:
        with SandboxClient(pool=pool, urls=["http://127.0.0.1:9"]) as client:
            with pytest.raises(ImageUnavailable) as missing:
                client.start_session(session_spec(demo_task, "registry.example/no/such:1"))
        assert missing.value.code == "image_not_found"
        assert "no image 'registry.example/no/such:1'" in str(missing.value)
        assert pool.provider.names() == [] and pool.stats()["pods_total"] == 0
    finally:
        pool.drain()


def test_a_sigkilled_executor_is_replaced_and_drain_leaves_nothing(images, work, demo_task):
    # The watcher does not look at ready pods here: the next call must find the executor dead.
    pool = make_pool(images, work, check_interval_s=3600.0)
    bases: list[Path] = []
    try:
        with SandboxClient(pool=pool, urls=["http://127.0.0.1:9"]) as client:
            first = client.start_session(session_spec(demo_task, IMAGE_A))
            first.close()
            (name,) = pool.provider.names()
            bases.append(work / name)
            proc = pool.provider._pods[name].proc
            creates = pool.stats()["creates"]
            os.kill(proc.pid, signal.SIGKILL)
            # Once it has exited (a connection reset met while the kill is still under way is
            # no proof that it is gone, and the call is not placed again on a live pod), the
            # next call finds it dead, the pool deletes it, the call goes elsewhere.
            wait_until(lambda: proc.poll() is not None, timeout=60)
            second = client.start_session(session_spec(demo_task, IMAGE_A))
            assert second.exec(f"cat /{MARKER}").output.strip() == images[1][IMAGE_A]
            assert name not in pool.provider.names()
            bases += [work / n for n in pool.provider.names()]
            assert pool.stats()["creates"] == creates + 1  # one replacement, no more
            assert pool.stats()["evictions"].get("dead") == 1
            second.close()
    finally:
        report = pool.drain()
    assert report["left"] == []
    assert_nothing_left(pool, work, bases)


def test_prewarm_needs_a_spec_and_warms_the_key_it_names(images, work, demo_task):
    pool = make_pool(images, work)
    try:
        with pytest.raises(ValueError, match="prewarm needs the spec"):
            pool.prewarm({IMAGE_A: 1})
        start = session_spec(demo_task, IMAGE_A)
        from sandbox_client.protocol import SessionStartSpec

        assert len(pool.prewarm({IMAGE_A: 1}, spec=SessionStartSpec.model_validate(start))) == 1
        with SandboxClient(pool=pool, urls=["http://127.0.0.1:9"]) as client:
            wait_until(lambda: pool.stats()["pods"].get(IMAGE_A, {}).get("idle") == 1,
                       timeout=120)
            client.start_session(start).close()
        assert pool.stats()["acquires"]["hit"] == 1 and pool.stats()["creates"] == 1
    finally:
        pool.drain()


SIGTERMED_TRAINER = """
import sys, time
from pathlib import Path
from sandbox_client.pool import LocalProvider, Pool, PoolSettings

images, work, image = sys.argv[1:4]
with Pool(PoolSettings(job="sig", poll_interval_s=0.05),
          LocalProvider(images, work, env={"DOCKYARD_TASK_EXECUTOR_THREADS": "8"})) as pool:
    lease = pool.acquire(image)
    print(lease.url, flush=True)
    time.sleep(600)  # killed here, holding its pod
"""


def test_a_trainer_killed_with_sigterm_drains_its_pool(images, work):
    """Sandman A47: pods outlived their job when a teardown hook did not run."""
    import subprocess
    import sys

    trainer = subprocess.Popen(
        [sys.executable, "-c", SIGTERMED_TRAINER, str(images[0]), str(work), IMAGE_A],
        stdout=subprocess.PIPE, text=True, env={k: v for k, v in os.environ.items()
                                                 if k != "API_TOKEN"})
    assert trainer.stdout is not None
    url = trainer.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:")
    (name,) = [p.name for p in work.iterdir()]
    base = work / name
    trainer.send_signal(signal.SIGTERM)
    assert trainer.wait(timeout=300) == 143
    trainer.stdout.close()
    assert list(work.iterdir()) == []
    assert pids_carrying(f"DOCKYARD_EXECUTOR={owner_token(base)}".encode()) == []
    assert mounts_anywhere(work) == []


def test_a_reader_whose_output_was_closed_under_it_ends_quietly(tmp_path: Path) -> None:
    """``delete`` closes a stopped executor's output while its reader thread may still be on
    it: the reader ends, where it raised ``ValueError`` in its thread (a test run failed so)."""
    import subprocess

    from sandbox_client.pool.local import _Process

    proc = subprocess.Popen(["sh", "-c", "echo listening on http://127.0.0.1:1; exec sleep 60"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        proc.stdout.close()
        pod = _Process(proc, tmp_path)
        LocalProvider(tmp_path / "images", tmp_path / "work")._read(pod)  # returns, no raise
        assert pod.url is None and pod.output == []
    finally:
        proc.kill()
        proc.wait()
