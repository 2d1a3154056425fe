"""The image pool end to end on Kubernetes: ``Pool`` over ``KubernetesProvider`` over the paced
provisioner, against the stand-in API whose pods run as real executor processes, each with the
tiny image root of its pod's task image (``--image/--image-root``), driven through
``SandboxClient(pool=...)``.

acquire -> exec -> finish -> release -> idle deletion -> drain, and what the issue asks of this
setup: concurrent acquires of one image make one pod (counted on the stand-in's own create
records); a SIGKILLed executor is replaced on the next acquire; an unschedulable image is
reported with the scheduler's message and created once only; Sandman's failure windows (lost
reply after storing, 500 after storing, slow deletes) leave no pod and no process after drain.
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

pytest.importorskip("kubernetes")

from sandbox_client import SandboxClient
from sandbox_client.pool import Pool, PoolSettings, image_root
from sandbox_client.pool.kubernetes import KubernetesProvider
from sandbox_client.pool.pool import PodUnschedulable
from sandbox_client.provisioner import PodSettings, Provisioner
from sandbox_client.provisioner.manifests import dns_label
from sandbox_client.provisioner.podrunner import ExecutorPodRunner
from sandbox_client.provisioner.testing import Fault, ImagePlan
from tests.conftest import FAST_PYTEST_ENV
from tests.images import MARKER, make_image_root
from tests.pool.support import fix_finish_and_grade, gone, start_at_once
from tests.processes import wait_until
from tests.provisioner.conftest import Harness

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="executors sandbox as root")

IMAGE_A = "ghcr.io/example/swe-task:django__django-11099"
IMAGE_B = "ghcr.io/example/swe-task:sympy__sympy-20590"
CARRIER = "dockyard-carrier:test"
WAIT_S = 120.0
"""Only turns a hang into a failure: a loaded 2-CPU machine may take seconds to start one."""


@pytest.fixture(scope="module")
def images() -> Iterator[tuple[Path, dict[str, str]]]:
    """An image directory with two task images; the pod runner gives each pod its image's."""
    directory = Path(tempfile.mkdtemp(prefix="dockyard-k8s-images-", dir="/var/tmp"))
    directory.chmod(0o755)
    tokens = {ref: make_image_root(image_root(directory, ref)) for ref in (IMAGE_A, IMAGE_B)}
    yield directory, tokens
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture()
def runner(images: tuple[Path, dict[str, str]]) -> Iterator[ExecutorPodRunner]:
    """Overrides the conftest's: each pod's executor runs on its task image's root (the
    conftest's ``harness`` serves pods with this runner)."""
    directory = images[0]
    pod_runner = ExecutorPodRunner(
        image_args=lambda image: ["--image", image, "--image-root",
                                  str(image_root(directory, image))],
        env={"DOCKYARD_TASK_EXECUTOR_THREADS": "8"})
    yield pod_runner
    pod_runner.stop_all()


def make_pool(h: Harness, **settings: Any) -> Pool:
    """A pool over a Kubernetes provider whose every create goes through the paced provisioner
    (budgets sized for executors starting on a loaded machine, not for speed)."""
    prov_settings = h.settings(pod=PodSettings(carrier_image=CARRIER), readiness_timeout_s=WAIT_S,
                               create_timeout_s=30.0, delete_timeout_s=30.0)
    provisioner = Provisioner(prov_settings, api=h.api)
    h.provisioners.append(provisioner)
    provider = KubernetesProvider(prov_settings, provisioner=provisioner)
    values: dict[str, Any] = {"job": prov_settings.job, "poll_interval_s": 0.05,
                              "check_interval_s": 0.2, "ready_timeout_s": WAIT_S,
                              "acquire_timeout_s": WAIT_S, **settings}
    return Pool(PoolSettings(**values), provider)


def job(pool: Pool) -> str:
    return dns_label(pool.settings.job, 63)


def session_spec(demo_task: Any, image: str) -> dict[str, Any]:
    return {"repo": demo_task.repo, "base_commit": demo_task.base_commit, "image": image,
            "env": FAST_PYTEST_ENV}


def assert_nothing_left(h: Harness, pool: Pool, runner: ExecutorPodRunner,
                        pids: list[int]) -> None:
    """No pod of the job on the stand-in, no executor process, no base directory."""
    assert h.job_pods(pool.settings.job) == []
    assert pool.provider.names() == []
    assert runner.started, "no pod ever ran an executor: this check would prove nothing"
    assert not any(runner.alive(name) for name in runner.started)
    assert all(runner.base_dir(name) is None for name in runner.started)
    for pid in pids:
        assert gone(pid), pid


def executor_pids(runner: ExecutorPodRunner) -> list[int]:
    return [pid for name in runner.started if (pid := runner.pid(name)) is not None]


def test_acquire_exec_finish_release_idle_deletion_and_drain(
        harness: Harness, runner: ExecutorPodRunner, images, demo_task) -> None:
    harness.standin.images[IMAGE_A] = ImagePlan(pull_s=0.3)  # pulled, then started
    pool = make_pool(harness, idle_timeout_s=1.0)
    pids: list[int] = []
    try:
        with SandboxClient(pool=pool, urls=["http://127.0.0.1:9"]) as client:
            session = client.start_session(session_spec(demo_task, IMAGE_A))
            pids += executor_pids(runner)
            (pod,) = harness.job_pods(pool.settings.job)
            assert pod["spec"]["containers"][0]["image"] == IMAGE_A
            # The session runs in its pod's task image, not the host's (no such file there).
            assert session.exec(f"cat /{MARKER}").output.strip() == images[1][IMAGE_A]
            fix_finish_and_grade(client, session, demo_task, IMAGE_A, FAST_PYTEST_ENV)
        stats = pool.stats()
        assert stats["acquires"]["miss"] == 1 and stats["acquires"]["hit"] == 1
        assert harness.standin.count("create") == 1  # the grading went to the session's pod
        # Released and idle past its time: deleted on the API, its executor stopped.
        wait_until(lambda: pool.stats()["pods_total"] == 0, timeout=WAIT_S)
        assert pool.stats()["evictions"].get("idle") == 1
        assert harness.standin.count("create") == 1  # nothing refilled
        assert_nothing_left(harness, pool, runner, pids)
    finally:
        report = pool.drain()
    assert report["left"] == []
    assert_nothing_left(harness, pool, runner, pids)


def test_concurrent_acquires_of_one_image_make_one_pod(
        harness: Harness, runner: ExecutorPodRunner, images, demo_task) -> None:
    harness.standin.images[IMAGE_A] = ImagePlan(pull_s=0.5)  # all eight arrive while it pulls
    pool = make_pool(harness)
    pids: list[int] = []
    try:
        with SandboxClient(pool=pool, urls=["http://127.0.0.1:9"]) as client:
            sessions = start_at_once(client, session_spec(demo_task, IMAGE_A), 8)
            pids += executor_pids(runner)
            assert len(sessions) == 8 and len({s.url for s in sessions}) == 1
            assert harness.standin.count("create") == 1  # the API's own records
            assert len(harness.job_pods(pool.settings.job)) == 1
            assert len(runner.started) == 1
            stats = pool.stats()
            assert stats["acquires"]["miss"] == 1
            assert stats["acquires"]["join"] + stats["acquires"]["hit"] == 7
            for session in sessions:
                assert session.exec(f"cat /{MARKER}").output.strip() == images[1][IMAGE_A]
                session.close()
    finally:
        report = pool.drain()
    assert report["left"] == []
    assert_nothing_left(harness, pool, runner, pids)


def test_a_sigkilled_executor_is_replaced_on_the_next_acquire(
        harness: Harness, runner: ExecutorPodRunner, images, demo_task) -> None:
    # The watcher does not look at ready pods in this test: the next call must be the one that
    # finds the executor dead (the pool then deletes its pod and the call gets another).
    pool = make_pool(harness, check_interval_s=3600.0)
    pids: list[int] = []
    try:
        with SandboxClient(pool=pool, urls=["http://127.0.0.1:9"]) as client:
            client.start_session(session_spec(demo_task, IMAGE_A)).close()
            (first,) = runner.started
            creates = harness.standin.count("create")
            pid = runner.pid(first)
            assert pid is not None
            pids.append(pid)
            os.kill(pid, signal.SIGKILL)
            # Once it has exited (a kill is not instant: a reset met while it still runs is
            # not proof that it is gone), the next call finds it dead and goes to another pod.
            wait_until(lambda: not runner.alive(first), timeout=WAIT_S)
            assert pool.stats()["pods_total"] == 1  # the pool has not noticed on its own
            second = client.start_session(session_spec(demo_task, IMAGE_A))
            assert second.exec(f"cat /{MARKER}").output.strip() == images[1][IMAGE_A]
            pids += executor_pids(runner)
            assert harness.standin.count("create") == creates + 1  # one replacement, no more
            assert pool.stats()["evictions"].get("dead") == 1
            assert len(runner.started) == 2 and runner.started[1] != first
            assert not runner.alive(first) and runner.alive(runner.started[1])
            names = [p["metadata"]["name"] for p in harness.job_pods(pool.settings.job)]
            assert first not in names  # the dead pod was deleted on the API, not left behind
            second.close()
    finally:
        report = pool.drain()
    assert report["left"] == []
    assert_nothing_left(harness, pool, runner, pids)


def test_an_unschedulable_image_is_reported_and_created_once(harness: Harness) -> None:
    message = "0/3 nodes are available: 3 Insufficient cpu."
    harness.standin.images[IMAGE_B] = ImagePlan(unschedulable=message)
    pool = make_pool(harness)
    try:
        for _ in range(3):  # asked again and again: reported each time, never re-created
            with pytest.raises(PodUnschedulable) as blocked:
                pool.acquire(IMAGE_B)
            assert blocked.value.code == "pod_unschedulable"
            assert message in str(blocked.value)
        for _ in range(10):
            pool.tick()  # watcher rounds by hand too: the pod is kept, not replaced
        assert harness.standin.count("create") == 1
        assert pool.stats()["pods"] == {IMAGE_B: {"unschedulable": 1}}
    finally:
        report = pool.drain()
    assert report["left"] == []
    assert harness.job_pods(pool.settings.job) == []


@pytest.mark.parametrize("fault", [
    Fault("create", drop=True),  # the pod is stored, the reply is lost
    Fault("create", status=500),  # the pod is stored, the answer is 500
], ids=["lost-reply", "500-after-storing"])
def test_failure_windows_under_the_pool_leave_nothing_after_drain(
        harness: Harness, runner: ExecutorPodRunner, images, demo_task, fault: Fault) -> None:
    harness.standin.delete_after = 0.3  # and deletes are slow throughout
    harness.standin.inject(fault)
    pool = make_pool(harness)
    pids: list[int] = []
    try:
        with SandboxClient(pool=pool, urls=["http://127.0.0.1:9"]) as client:
            a = client.start_session(session_spec(demo_task, IMAGE_A))
            b = client.start_session(session_spec(demo_task, IMAGE_B))
            assert harness.standin.pending_faults() == 0  # the window did happen
            pids += executor_pids(runner)
            assert a.exec(f"cat /{MARKER}").output.strip() == images[1][IMAGE_A]
            assert b.exec(f"cat /{MARKER}").output.strip() == images[1][IMAGE_B]
            # Adopted, never doubled: one pod per create on the server at any time.
            assert harness.standin.high_water_by_job[job(pool)] == 2
            assert pool.stats()["creates"] == 2
            a.close()
            b.close()
    finally:
        report = pool.drain()
    assert report["left"] == []
    assert_nothing_left(harness, pool, runner, pids)
