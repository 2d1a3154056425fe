"""``k8s/`` builds, every object loads into the client's models and has the fleet's properties.

The build is done twice where possible: by a small function applying the few kustomize fields the
base uses (always available), and by ``kubectl kustomize`` when kubectl is installed; both must
give the same objects. The generated files must equal what ``manifests.py`` renders today, and
the Deployment's pod template must equal the pod the provisioner creates. The same holds for the
``k8s/sandboxed`` component (an overlay using it, built both ways, gives exactly the pod
``PodSettings(sandbox=True)`` makes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes")
import yaml

from sandbox_client.provisioner.cli import main as cli_main
from sandbox_client.provisioner.manifests import (
    APP_LABEL,
    ROLE_LABEL,
    PodSettings,
    app_labels,
    pod_manifest,
)

K8S = Path(__file__).resolve().parents[2] / "k8s"
KNOWN_FIELDS = {"apiVersion", "kind", "namespace", "labels", "resources", "components", "patches"}


def json_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    """The RFC 6902 operations the component uses (``add``, ``test``, ``replace``) applied to
    ``obj``; a failed ``test`` fails, as kustomize does."""
    for op in ops:
        assert op["op"] in ("add", "test", "replace"), f"extend json_patch for {op['op']}"
        *parents, last = [part.replace("~1", "/").replace("~0", "~")
                          for part in op["path"].lstrip("/").split("/")]
        node: Any = obj
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: Any = (len(node) if last == "-" else int(last)) if isinstance(node, list) else last
        if op["op"] == "test":
            assert node[key] == op["value"], f"json patch test failed at {op['path']}"
        elif op["op"] == "replace":
            assert key in node if isinstance(node, dict) else key < len(node), op["path"]
            node[key] = op["value"]
        elif isinstance(node, list):
            node.insert(key, op["value"])
        else:
            node[key] = op["value"]


def apply_patches(directory: Path, kustomization: dict[str, Any],
                  objects: list[dict[str, Any]]) -> None:
    for entry in kustomization.get("patches", []):
        assert set(entry) == {"path", "target"}, f"extend apply_patches for {set(entry)}"
        assert set(entry["target"]) <= {"kind", "name"}
        ops = yaml.safe_load((directory / entry["path"]).read_text())
        assert isinstance(ops, list), "only JSON 6902 patches are applied here"
        targets = [o for o in objects if all(
            (o["metadata"]["name"] if key == "name" else o[key]) == value
            for key, value in entry["target"].items())]
        assert targets, f"patch {entry['path']} matches nothing"
        for obj in targets:
            json_patch(obj, ops)


def mini_kustomize(directory: Path) -> list[dict[str, Any]]:
    """Apply the kustomize fields this base uses; refuse any other so this cannot silently lie."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KNOWN_FIELDS
    assert not unknown, f"extend mini_kustomize for {unknown}"
    assert kustomization["kind"] == "Kustomization"
    namespace = kustomization.get("namespace")
    objects: list[dict[str, Any]] = []
    for resource in kustomization.get("resources", []):
        if (directory / resource).is_dir():
            objects += mini_kustomize(directory / resource)  # a base
        else:
            objects += [d for d in yaml.safe_load_all((directory / resource).read_text()) if d]
    for component in kustomization.get("components", []):
        spec = yaml.safe_load((directory / component / "kustomization.yaml").read_text())
        assert spec["kind"] == "Component"
        assert not set(spec) - {"apiVersion", "kind", "patches"}, "extend mini_kustomize"
        apply_patches(directory / component, spec, objects)
    apply_patches(directory, kustomization, objects)
    for obj in objects:
        meta = obj.setdefault("metadata", {})
        if namespace:
            meta["namespace"] = namespace
            for subject in obj.get("subjects", []):
                if subject.get("kind") == "ServiceAccount":
                    subject["namespace"] = namespace
        for entry in kustomization.get("labels", []):
            assert not entry.get("includeSelectors") and not entry.get("includeTemplates")
            meta.setdefault("labels", {}).update(entry["pairs"])
    return objects


def by_kind(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


@pytest.fixture(scope="module")
def built() -> dict[tuple[str, str], dict[str, Any]]:
    return by_kind(mini_kustomize(K8S))


def test_kubectl_kustomize_builds_the_same_objects(
        built: dict[tuple[str, str], dict[str, Any]]) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed; the mini build above still checks the base")
    out = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert by_kind([d for d in yaml.safe_load_all(out) if d]) == built


MODELS = {"Deployment": "V1Deployment", "NetworkPolicy": "V1NetworkPolicy",
          "ServiceAccount": "V1ServiceAccount", "Role": "V1Role", "RoleBinding": "V1RoleBinding",
          "Pod": "V1Pod"}


def roundtrip(obj: dict[str, Any]) -> dict[str, Any]:
    """Load into the client's model class and dump again: unknown or mistyped fields are lost."""
    from kubernetes.client import ApiClient

    client = ApiClient()
    try:
        model = client._ApiClient__deserialize(obj, MODELS[obj["kind"]])  # type: ignore[attr-defined]
        return client.sanitize_for_serialization(model)  # type: ignore[no-any-return]
    finally:
        client.close()


def test_every_object_loads_into_the_client_models(
        built: dict[tuple[str, str], dict[str, Any]]) -> None:
    # Exactly these kinds: no per-agent Service either (agents reach pods by IP).
    assert {kind for kind, _ in built} == {"Deployment", "NetworkPolicy", "ServiceAccount",
                                            "Role", "RoleBinding"}
    for obj in built.values():
        assert roundtrip(obj) == obj


def test_pod_template_properties(built: dict[tuple[str, str], dict[str, Any]]) -> None:
    spec = built[("Deployment", "dockyard-executor")]["spec"]["template"]["spec"]
    assert spec["enableServiceLinks"] is False
    assert spec["automountServiceAccountToken"] is False
    assert spec["nodeSelector"] == {"dockyard.io/pool": "cpu"}
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"] == app_labels()
    (container,) = spec["containers"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    for kind in ("requests", "limits"):
        assert set(container["resources"][kind]) == {"cpu", "memory"}
    token = next(e for e in container["env"] if e["name"] == "API_TOKEN")
    assert token["valueFrom"]["secretKeyRef"]["name"] == "dockyard-executor-token"


def test_network_policy_denies_egress_and_admits_only_trainers(
        built: dict[tuple[str, str], dict[str, Any]]) -> None:
    policy = built[("NetworkPolicy", "dockyard-executor")]["spec"]
    template = built[("Deployment", "dockyard-executor")]["spec"]["template"]
    assert policy["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    assert policy["egress"] == []
    (rule,) = policy["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {ROLE_LABEL: "trainer"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9090}]


def test_rbac_grants_pods_in_one_namespace_only(
        built: dict[tuple[str, str], dict[str, Any]]) -> None:
    role = built[("Role", "dockyard-provisioner")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["create", "get", "list", "watch", "delete"]}]
    binding = built[("RoleBinding", "dockyard-provisioner")]
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dockyard-provisioner",
                                    "namespace": role["metadata"]["namespace"]}]
    assert ("ServiceAccount", "dockyard-provisioner") in built


def test_checked_in_yaml_is_what_manifests_py_renders() -> None:
    assert cli_main(["manifests", "--check", str(K8S)]) == 0


def test_manifests_check_flags_a_stale_file(tmp_path: Path) -> None:
    assert cli_main(["manifests", "--write", str(tmp_path)]) == 0
    assert cli_main(["manifests", "--check", str(tmp_path)]) == 0
    (tmp_path / "deployment.yaml").write_text("# edited by hand\n")
    assert cli_main(["manifests", "--check", str(tmp_path)]) == 1


def test_provisioned_pod_matches_the_template(
        built: dict[tuple[str, str], dict[str, Any]]) -> None:
    template = built[("Deployment", "dockyard-executor")]["spec"]["template"]
    pod = pod_manifest(PodSettings(), "dockyard-job-abc", "job", "inst", "nonce")
    assert pod["spec"] == template["spec"]
    assert template["metadata"]["labels"].items() <= pod["metadata"]["labels"].items()
    assert pod["metadata"]["labels"][APP_LABEL] == "dockyard-executor"
    assert roundtrip(pod) == pod


def sandboxed_overlay(tmp_path: Path) -> Path:
    """A cluster's overlay using the component, as k8s/sandboxed/kustomization.yaml shows it
    (outside k8s/: kustomize refuses an overlay inside its base's directory)."""
    overlay = tmp_path / "cluster"
    overlay.mkdir()
    base = os.path.relpath(K8S, overlay)  # kustomize takes relative paths only
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{base}]\ncomponents: [{base}/sandboxed]\n")
    return overlay


def test_sandboxed_component_gives_the_sandbox_pod(
        tmp_path: Path, built: dict[tuple[str, str], dict[str, Any]]) -> None:
    overlay = sandboxed_overlay(tmp_path)
    objects = by_kind(mini_kustomize(overlay))
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        out = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        assert by_kind([d for d in yaml.safe_load_all(out) if d]) == objects
    key = ("Deployment", "dockyard-executor")
    template = objects[key]["spec"]["template"]
    pod = pod_manifest(PodSettings(sandbox=True), "dockyard-job-abc", "job", "inst", "nonce")
    assert template["spec"] == pod["spec"]
    # Nothing else changes: the other objects, and the Deployment but for its pod spec.
    assert {k: v for k, v in objects.items() if k != key} == {
        k: v for k, v in built.items() if k != key}
    assert {**objects[key], "spec": None} == {**built[key], "spec": None}
    assert roundtrip(objects[key]) == objects[key]
