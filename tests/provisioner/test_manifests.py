"""Pure builders, tested as plain dicts (as kubespawner tests its objects): no server needed."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("kubernetes")

from sandbox_client.provisioner import ProvisionerSettings
from sandbox_client.provisioner.manifests import (
    RUNTIME_DIR,
    PodSettings,
    dns_label,
    job_labels,
    owner_reference_from_env,
    pod_manifest,
    pod_template,
)

from .test_kustomize import roundtrip

DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_owner_reference_comes_from_the_downward_api_env() -> None:
    assert owner_reference_from_env({"POD_NAME": "trainer-7", "POD_UID": "u-7"}) == {
        "apiVersion": "v1", "kind": "Pod", "name": "trainer-7", "uid": "u-7"}
    assert owner_reference_from_env({"POD_NAME": "trainer-7"}) is None  # not in a cluster
    assert owner_reference_from_env({}) is None


@pytest.mark.parametrize("value", ["run-42", "Run_42", "a" * 100, "--x--", "日本", "job.1"])
def test_dns_label_is_valid(value: str) -> None:
    label = dns_label(value, 40)
    assert DNS.match(label) and len(label) <= 40
    if DNS.match(value) and len(value) <= 40:
        assert label == value


def test_dns_label_is_the_same_in_every_process() -> None:
    """The reaper, maybe in another process, must select the label the trainer's pods carry."""
    assert dns_label("Run_42") == "run-42-8befd7"
    assert dns_label("a" * 100, 63) == "a" * 56 + "-281659"


def test_dns_label_keeps_distinct_ids_distinct() -> None:
    assert dns_label("Job_1") != dns_label("job-1")


def test_pod_manifest_carries_job_labels_nonce_and_owner() -> None:
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "t", "uid": "u"}
    pod = pod_manifest(PodSettings(), "dockyard-x-1", "Run 42", "inst", "n0nce", owner)
    labels = pod["metadata"]["labels"]
    assert labels.items() >= job_labels("Run 42", "inst").items()
    assert labels["dockyard.io/nonce"] == "n0nce"
    assert pod["metadata"]["ownerReferences"] == [owner]
    assert all(DNS.match(v) for v in labels.values())
    assert "ownerReferences" not in pod_manifest(PodSettings(), "n", "j", "i", "x")["metadata"]


def test_carrier_wiring_runs_the_copied_executor_in_the_task_image() -> None:
    settings = PodSettings(image="swebench/sweb.eval.x86_64.django:latest",
                           carrier_image="dockyard-carrier:latest")
    spec = pod_template(settings)["spec"]
    (init,) = spec["initContainers"]
    (task,) = spec["containers"]
    assert init["image"] == "dockyard-carrier:latest"
    assert init["command"] == ["cp", "-a", f"{RUNTIME_DIR}/.", "/dockyard-runtime/"]
    assert task["image"] == settings.image
    assert task["command"] == [f"{RUNTIME_DIR}/bin/task-executor"]
    assert task["args"][:1] == ["serve"]
    runtime = {"name": "dockyard-runtime", "mountPath": RUNTIME_DIR, "readOnly": True}
    assert runtime in task["volumeMounts"]
    assert {"name": "dockyard-runtime", "emptyDir": {}} in spec["volumes"]
    pod = pod_manifest(settings, "p", "j", "i", "n")
    assert roundtrip(pod) == pod


def test_run_as_user_option() -> None:
    (container,) = pod_template(PodSettings(run_as_user=10001))["spec"]["containers"]
    assert container["securityContext"]["runAsUser"] == 10001
    (default,) = pod_template(PodSettings())["spec"]["containers"]
    assert "runAsUser" not in default["securityContext"]


def test_settings_from_env() -> None:
    env = {"DOCKYARD_JOB_ID": "run-1", "POD_NAMESPACE": "rl", "POD_NAME": "t", "POD_UID": "u",
           "DOCKYARD_MAX_PODS": "12", "DOCKYARD_CREATE_RATE": "2.5",
           "DOCKYARD_EXECUTOR_IMAGE": "reg/exec:1", "DOCKYARD_K8S_HOST": "http://127.0.0.1:1"}
    settings = ProvisionerSettings.from_env(env)
    assert (settings.job, settings.namespace, settings.max_live, settings.rate) == (
        "run-1", "rl", 12, 2.5)
    assert settings.owner == {"apiVersion": "v1", "kind": "Pod", "name": "t", "uid": "u"}
    assert settings.pod.image == "reg/exec:1"
    assert settings.api.host == "http://127.0.0.1:1"
    with pytest.raises(ValueError, match="DOCKYARD_CREATE_RATE"):
        ProvisionerSettings.from_env({**env, "DOCKYARD_CREATE_RATE": "fast"})
    with pytest.raises(ValueError, match="job"):
        ProvisionerSettings.from_env({})


SANDBOX_KEYS = {"runAsUser", "seccompProfile", "appArmorProfile"}


@pytest.mark.parametrize("carrier", [None, "dockyard-carrier:latest"])
def test_sandbox_option_grants_exactly_what_the_sandbox_needs(carrier: str | None) -> None:
    (default,) = pod_template(PodSettings(carrier_image=carrier))["spec"]["containers"]
    (sandboxed,) = pod_template(PodSettings(carrier_image=carrier, sandbox=True))["spec"][
        "containers"]
    assert sandboxed["securityContext"] == {
        "allowPrivilegeEscalation": False,  # no_new_privs: bwrap is not setuid, user NS allowed
        "capabilities": {"add": ["SYS_ADMIN"], "drop": ["NET_RAW"]},
        "runAsUser": 0,
        "seccompProfile": {"type": "Unconfined"},
        "appArmorProfile": {"type": "Unconfined"},
    }
    assert sandboxed["env"] == [*default["env"][:4], {"name": "DOCKYARD_SANDBOX",
                                                      "value": "auto"}]
    # Everything else is the default pod's.
    assert {**sandboxed, "securityContext": None, "env": None} == {
        **default, "securityContext": None, "env": None}
    # The default grants none of it.
    assert default["securityContext"] == {"allowPrivilegeEscalation": False,
                                          "capabilities": {"drop": ["NET_RAW"]}}
    assert not SANDBOX_KEYS & set(default["securityContext"])
    assert default["env"][4] == {"name": "DOCKYARD_SANDBOX", "value": "none"}  # said, explicitly
    pod = pod_manifest(PodSettings(carrier_image=carrier, sandbox=True), "p", "j", "i", "n")
    assert roundtrip(pod) == pod  # every field is one the client's V1SecurityContext knows


def test_sandbox_pods_do_not_share_mutable_parts() -> None:
    first = pod_template(PodSettings(sandbox=True))["spec"]["containers"][0]["securityContext"]
    first["capabilities"]["add"].append("NET_ADMIN")
    first["seccompProfile"]["type"] = "RuntimeDefault"
    again = pod_template(PodSettings(sandbox=True))["spec"]["containers"][0]["securityContext"]
    assert again["capabilities"]["add"] == ["SYS_ADMIN"]
    assert again["seccompProfile"] == {"type": "Unconfined"}


def test_sandbox_runs_the_executor_as_root_only() -> None:
    assert PodSettings(sandbox=True, run_as_user=0).sandbox
    with pytest.raises(ValueError, match="root"):
        PodSettings(sandbox=True, run_as_user=10001)


def test_sandbox_from_env_and_flag() -> None:
    from sandbox_client.provisioner.cli import build_parser, settings_from_args

    env = {"DOCKYARD_JOB_ID": "run-1"}
    assert ProvisionerSettings.from_env(env).pod.sandbox is False
    for raw, expected in (("1", True), ("true", True), ("0", False), ("", False)):
        settings = ProvisionerSettings.from_env({**env, "DOCKYARD_POD_SANDBOX": raw})
        assert settings.pod.sandbox is expected, raw
    with pytest.raises(ValueError, match="DOCKYARD_POD_SANDBOX"):
        ProvisionerSettings.from_env({**env, "DOCKYARD_POD_SANDBOX": "maybe"})

    def parsed(*flags: str, **extra: str) -> bool:
        args = build_parser().parse_args(["provision", "--job", "j", "--count", "1", *flags])
        return settings_from_args(args, {**env, **extra}).pod.sandbox

    assert parsed() is False
    assert parsed("--sandbox") is True
    assert parsed(DOCKYARD_POD_SANDBOX="1") is True
    assert parsed("--no-sandbox", DOCKYARD_POD_SANDBOX="1") is False
