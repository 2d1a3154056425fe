"""The pool's Kubernetes provider against the stand-in API, whose pods run as real executors.

Every pod is made by the paced provisioner (asserted on the stand-in's own request records);
its phases (pulling, ready, unschedulable, failed, gone) come from the pod objects the stand-in
serves; a ready pod's URL reaches a real ``task_executor`` process, and a confirmed delete leaves
no process and no base directory. Drain on SIGTERM and atexit runs in a child process; leftovers
are removed by the real ``dockyard fleet reap``. Sandman's failure windows (lost reply after
storing, 500 after storing, slow deletes) leave no pod behind.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes")

from sandbox_client.pool.kubernetes import (
    IMAGE_ANNOTATION,
    IMAGE_LABEL,
    KubernetesProvider,
    image_label,
)
from sandbox_client.pool.provider import PodStatus, PoolKey
from sandbox_client.provisioner import PodSettings, Provisioner
from sandbox_client.provisioner.manifests import JOB_LABEL, dns_label
from sandbox_client.provisioner.podrunner import ExecutorPodRunner
from sandbox_client.provisioner.testing import (
    FakeClock,
    Fault,
    ImagePlan,
    StandInAPI,
    StandInServer,
)
from tests.pool.support import gone
from tests.provisioner.conftest import NAMESPACE, TRAINER, Harness

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "ghcr.io/example/swe-task:django__django-11099"
CARRIER = "dockyard-carrier:test"
WAIT_S = 90.0
"""Only turns a hang into a failure: a loaded 2-CPU machine may take seconds to start one."""


def provider(h: Harness, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep, **changes: Any) -> KubernetesProvider:
    settings = h.settings(pod=PodSettings(carrier_image=CARRIER), **changes)
    prov = Provisioner(settings, api=h.api, clock=clock, sleep=sleep)
    h.provisioners.append(prov)
    return KubernetesProvider(settings, provisioner=prov)


def wait_phase(p: KubernetesProvider, name: str, phases: set[str],
               seen: list[str] | None = None) -> PodStatus:
    deadline = time.monotonic() + WAIT_S
    while True:
        status = p.status(name)
        if seen is not None and (not seen or seen[-1] != status.phase):
            seen.append(status.phase)
        if status.phase in phases:
            return status
        if time.monotonic() >= deadline:
            # Once (a full two-worker run), pool-0 stayed "creating" past this guard: its ticket
            # never finished. Say where every thread was, for the next time.
            faulthandler.dump_traceback(all_threads=True)
            entry = p._entry(name)
            ticket = entry.ticket if entry is not None else None
            pytest.fail(f"{name} stuck in {status}; ticket "
                        f"{ticket and (ticket.state, ticket.record, ticket.error)}; provisioner "
                        f"stats {p.provisioner.stats}, {p.provisioner.live_count()} live")
        time.sleep(0.02)


def health(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/health", timeout=10) as reply:
        assert reply.status == 200
        return json.loads(reply.read())


def job_pods(h: Harness, p: KubernetesProvider) -> list[dict[str, Any]]:
    return h.job_pods(p.settings.job)


def test_create_pulls_then_serves_a_real_executor_and_delete_stops_it(
        harness: Harness, runner: ExecutorPodRunner) -> None:
    harness.standin.images[IMAGE] = ImagePlan(pull_s=0.5)
    p = provider(harness)
    p.create(PoolKey(IMAGE, cpu="2", memory="4Gi"), "pool-a")
    seen: list[str] = []
    status = wait_phase(p, "pool-a", {"ready", "failed"}, seen)
    assert status.phase == "ready", status
    assert "pulling" in seen and seen.index("pulling") < seen.index("ready")
    assert status.url is not None and status.url.startswith("http://127.0.0.1:")
    assert health(status.url)  # a real executor process answers
    pod_name = p.pod_name("pool-a")
    assert pod_name is not None
    pid = runner.pid(pod_name)
    assert pid is not None and runner.alive(pod_name)
    base = Path(runner.base_dir(pod_name) or "/nonexistent")
    assert base.is_dir()
    p.delete("pool-a")
    assert p.status("pool-a").phase == "gone" and p.names() == []
    assert not runner.alive(pod_name)
    assert gone(pid)
    assert not base.exists()  # its base directory went with it
    assert job_pods(harness, p) == []
    with pytest.raises(OSError):
        health(status.url)


def test_the_manifest_carries_the_task_image_labels_annotation_and_owner(
        harness: Harness) -> None:
    p = provider(harness)
    p.create(PoolKey(IMAGE, cpu="3", memory="6Gi", egress=True), "pool-a")
    wait_phase(p, "pool-a", {"ready"})
    (pod,) = job_pods(harness, p)
    meta = pod["metadata"]
    label = meta["labels"][IMAGE_LABEL]
    assert label == image_label(IMAGE) and len(label) <= 63 and ":" not in label
    assert label != image_label(IMAGE + "-other")
    assert meta["annotations"][IMAGE_ANNOTATION] == IMAGE
    assert meta["labels"][JOB_LABEL] == dns_label(p.settings.job, 63)
    assert meta["labels"]["dockyard.io/egress"] == "true"
    assert meta["ownerReferences"] == [TRAINER]
    spec = pod["spec"]
    (executor,) = spec["containers"]
    assert executor["image"] == IMAGE  # the unmodified task image ...
    assert [c["image"] for c in spec["initContainers"]] == [CARRIER]  # ... carrying the executor
    assert executor["resources"] == {"requests": {"cpu": "3", "memory": "6Gi"},
                                     "limits": {"cpu": "3", "memory": "6Gi"}}
    assert executor["readinessProbe"]["httpGet"]["path"] == "/health"
    p.close()
    assert job_pods(harness, p) == []


def test_unschedulable_is_reported_with_its_reason_and_not_recreated(harness: Harness) -> None:
    message = "0/3 nodes are available: 3 Insufficient cpu."
    harness.standin.images[IMAGE] = ImagePlan(unschedulable=message)
    p = provider(harness)
    p.create(PoolKey(IMAGE, cpu="64"), "pool-a")
    status = wait_phase(p, "pool-a", {"unschedulable", "ready", "failed"})
    assert status == PodStatus("pool-a", "unschedulable", reason=message)
    for _ in range(20):
        assert p.status("pool-a").phase == "unschedulable"
    assert harness.standin.count("create") == 1
    p.delete("pool-a")
    assert job_pods(harness, p) == []


def test_a_slow_pull_is_pulling_never_replaced(harness: Harness) -> None:
    harness.standin.images[IMAGE] = ImagePlan(pull_s=2.0)
    p = provider(harness)
    p.create(PoolKey(IMAGE), "pool-a")
    wait_phase(p, "pool-a", {"pulling"})
    polls = 0
    while (status := p.status("pool-a")).phase == "pulling":
        polls += 1
        time.sleep(0.05)
    assert status.phase == "ready" and polls > 5
    assert harness.standin.count("create") == 1 and harness.standin.count("delete") == 0
    p.close()


def test_image_not_found_fails_the_pod(harness: Harness) -> None:
    harness.standin.images[IMAGE] = ImagePlan(
        pull_error=f'rpc error: code = NotFound desc = failed to pull "{IMAGE}": not found')
    p = provider(harness)
    p.create(PoolKey(IMAGE), "pool-a")
    status = wait_phase(p, "pool-a", {"failed", "ready"})
    assert status.phase == "failed" and status.reason.startswith("ErrImagePull")
    p.close()
    assert job_pods(harness, p) == []


def test_every_create_goes_through_the_token_bucket() -> None:
    # No runner: this test is about pacing, timed on one fake clock shared with the stand-in.
    clock = FakeClock()
    with StandInServer(StandInAPI(clock=clock)) as server:
        h = Harness(server)
        try:
            # One worker: concurrent sleepers on a fake clock would add up their sleeps.
            p = provider(h, clock=clock, sleep=clock.sleep, rate=2.0, burst=1, create_workers=1)
            for i in range(4):
                p.create(PoolKey(f"{IMAGE}-{i}"), f"pool-{i}")
            for i in range(4):
                wait_phase(p, f"pool-{i}", {"ready"})
            times = sorted(h.standin.times("create"))
            assert len(times) == 4
            assert all(b - a >= 0.5 for a, b in zip(times, times[1:], strict=False))
            p.close()
            assert h.job_pods(p.settings.job) == []
        finally:
            h.api.close()


def test_the_live_pod_cap_holds_for_pool_creates(harness: Harness) -> None:
    harness.standin.pod_runner = None  # pods without processes: this is about the cap
    p = provider(harness, max_live=2)
    for i in range(4):
        p.create(PoolKey(f"{IMAGE}-{i}"), f"pool-{i}")
    wait_phase(p, "pool-0", {"ready"})
    wait_phase(p, "pool-1", {"ready"})
    assert p.status("pool-2").phase == "creating"  # waits for a slot, not sent
    p.delete("pool-0")
    p.delete("pool-1")
    wait_phase(p, "pool-2", {"ready"})
    wait_phase(p, "pool-3", {"ready"})
    assert harness.standin.high_water_by_job[dns_label(p.settings.job, 63)] == 2
    p.close()


@pytest.mark.parametrize("fault", [
    Fault("create", drop=True),  # the pod is stored, the reply is lost
    Fault("create", status=500),  # the pod is stored, the answer is 500
])
def test_failure_windows_after_storing_leave_no_pod(harness: Harness, fault: Fault) -> None:
    harness.standin.delete_after = 0.3  # and deletes are slow throughout
    harness.standin.inject(fault)
    p = provider(harness)
    p.create(PoolKey(IMAGE), "pool-a")
    p.create(PoolKey(IMAGE), "pool-b")
    for name in ("pool-a", "pool-b"):
        assert wait_phase(p, name, {"ready", "failed"}).phase == "ready"
    assert harness.standin.pending_faults() == 0
    # Adopted, never doubled: one pod per create on the server at any time.
    assert harness.standin.high_water_by_job[dns_label(p.settings.job, 63)] == 2
    p.delete("pool-a")
    assert len(job_pods(harness, p)) == 1
    p.close()
    assert job_pods(harness, p) == []


def test_a_delete_during_the_create_leaves_no_pod(harness: Harness) -> None:
    import threading

    hold = threading.Event()
    harness.standin.inject(Fault("create", after_hold=hold))  # stored, answer held back
    p = provider(harness)
    p.create(PoolKey(IMAGE), "pool-a")
    assert harness.standin.wait_for("create", 1, timeout=WAIT_S)
    threading.Timer(0.2, hold.set).start()
    p.delete("pool-a")  # waits for the create to settle, then deletes it until gone
    assert job_pods(harness, p) == []
    p.close()


def test_a_sigkilled_executor_is_reported_failed(harness: Harness,
                                                 runner: ExecutorPodRunner) -> None:
    p = provider(harness)
    p.create(PoolKey(IMAGE), "pool-a")
    wait_phase(p, "pool-a", {"ready"})
    pid = runner.pid(p.pod_name("pool-a") or "")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    status = wait_phase(p, "pool-a", {"failed"})
    assert status.reason == "executor exited"
    p.close()
    assert job_pods(harness, p) == []


# -- drain in a real process, and reap ---------------------------------------------------------

def _env(h: Harness, job: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        "DOCKYARD_JOB_ID": job,
        "DOCKYARD_K8S_NAMESPACE": NAMESPACE,
        "DOCKYARD_K8S_HOST": h.server.url,
        "DOCKYARD_K8S_POLL_INTERVAL": "0.01",
        "DOCKYARD_CARRIER_IMAGE": CARRIER,
        "POD_NAME": "trainer-0",
        "POD_UID": "trainer-uid-0",
    })
    return env


CHILD = """
import sys, time
from sandbox_client.pool.kubernetes import KubernetesProvider
from sandbox_client.pool.provider import PoolKey
from sandbox_client.provisioner import ProvisionerSettings
p = KubernetesProvider(ProvisionerSettings.from_env())
for i in range(2):
    p.create(PoolKey("img-%d" % i), "pool-%d" % i)
while any(p.status(n).phase != "ready" for n in p.names()):
    time.sleep(0.02)
print("ready", flush=True)
if sys.argv[1] == "wait":
    time.sleep(600)
"""


def _child(h: Harness, job: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD), mode],
                            env=_env(h, job), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def test_sigterm_drains_every_pool_pod(harness: Harness) -> None:
    job = "pool-sigterm"
    child = _child(harness, job, "wait")
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        assert len(harness.job_pods(job)) == 2
        child.send_signal(signal.SIGTERM)
        code = child.wait(WAIT_S)
    finally:
        child.kill()
        child.communicate()
    assert code == 128 + signal.SIGTERM
    assert harness.job_pods(job) == []


def test_atexit_drains_every_pool_pod(harness: Harness) -> None:
    job = "pool-atexit"
    child = _child(harness, job, "exit")
    out, _ = child.communicate(timeout=WAIT_S)
    assert child.returncode == 0 and out.strip() == "ready"
    assert harness.standin.high_water_by_job[job] == 2
    assert harness.job_pods(job) == []


def test_fleet_reap_removes_pool_pods_left_over(harness: Harness) -> None:
    harness.standin.pod_runner = None
    p = provider(harness)
    p.create(PoolKey(IMAGE), "pool-a")
    p.create(PoolKey(IMAGE + "-2"), "pool-b")
    wait_phase(p, "pool-a", {"ready"})
    wait_phase(p, "pool-b", {"ready"})
    p.provisioner.detach()  # the trainer died without draining: the pods are left over
    job = p.settings.job
    assert len(harness.job_pods(job)) == 2
    env = _env(harness, job)
    done = subprocess.run([sys.executable, "-m", "sandbox_client.cli.main", "fleet", "reap",
                           "--job", job, "--namespace", NAMESPACE], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    assert f"job {job}: 2 pods deleted, 0 left" in done.stdout
    assert harness.job_pods(job) == []
